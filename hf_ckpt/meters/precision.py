"""The mixed precision a training step runs under: the dtype autocast casts matmuls to, read where forward runs.

The ``Trainer`` with ``bf16=True`` (accelerate) wraps the model's ``forward`` in ``torch.autocast``; a plain loop
wraps the call. Either way the blocks run under it, so a budget planned before they run reads it from inside the
forward (:mod:`hf_ckpt.budget.deferred`), and the estimator traces the step under the same autocast.
"""

from __future__ import annotations

import torch

#: The dtypes autocast casts to that the estimator traces.
LOWER = (torch.bfloat16, torch.float16)


def autocast_state(device_type: str) -> tuple[bool, torch.dtype | None]:
    """(whether autocast is on for ``device_type`` now, the dtype it casts to)."""
    try:
        return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    except (TypeError, AttributeError, RuntimeError):  # a torch without per-device queries (before 2.4)
        if device_type == "cpu":
            return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
        return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()


def autocast_dtype(device: torch.device, weights: torch.dtype) -> torch.dtype | None:
    """The dtype autocast casts matmuls to on ``device`` now, when it is on, is one of :data:`LOWER` and is not
    ``weights`` (the parameters' dtype); None otherwise (the step runs in ``weights``)."""
    enabled, dtype = autocast_state(device.type)
    return dtype if enabled and dtype in LOWER and dtype != weights else None
