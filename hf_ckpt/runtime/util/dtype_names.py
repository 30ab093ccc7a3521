"""The dtypes hf_ckpt measures and estimates, by their torch names, and the short names accepted for them: one table
for the CLI, ``hf_ckpt.estimate`` and the bench's workload. Torch-free: the CLI parses its arguments without torch."""

from __future__ import annotations

DTYPE_NAMES = ("float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}


def dtype_name(text: str) -> str | None:
    """The torch name of a dtype written as ``float32``, ``bf16``, ``torch.float16`` (any case); None for a dtype
    not in :data:`DTYPE_NAMES`."""
    name = text.lower().removeprefix("torch.")
    name = DTYPE_ALIASES.get(name, name)
    return name if name in DTYPE_NAMES else None
