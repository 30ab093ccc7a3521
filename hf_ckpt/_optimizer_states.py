"""What an optimizer's first step will allocate: the state ``budget="auto"`` leaves room for.

``torch.optim`` optimizers make their per-parameter state lazily, at the first ``step()``: after the first
forward, where a budget without ``sample_inputs`` is planned. :func:`pending_state_bytes` predicts it from the
optimizer itself (its class, each parameter group's options, each parameter's size and dtype), counting only the
parameters that have no state yet: an optimizer restored from a checkpoint (the ``Trainer`` resuming) already
holds its state, which the free memory read at the first batch has already paid for.

A class is known by registration (:func:`register_optimizer_states`), looked up along its MRO, so a subclass of
``AdamW`` is counted as ``AdamW``. torch's own are registered below; each count is tested against the state a
real step allocates. Wrappers that keep the real optimizer as ``.optimizer`` (accelerate's
``AcceleratedOptimizer``) are unwrapped.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

#: ``buffers(group) -> int``: how many tensors of a parameter's shape and dtype the first step allocates for each
#: parameter of the group.
Buffers = Callable[[dict], int]

#: Per optimizer class: (buffers per parameter, float32 scalars per parameter: ``step``, NAdam's ``mu_product``).
_REGISTRY: dict[type, tuple[Buffers, int]] = {}

#: Bytes of a scalar state tensor (float32; on the host unless the optimizer is capturable or fused).
SCALAR_BYTES = 4


def register_optimizer_states(cls: type, buffers: Buffers, scalars: int = 1) -> None:
    """Count ``cls``'s first-step state as ``buffers(group)`` tensors the size of each parameter, plus ``scalars``
    float32 scalars per parameter (``step`` and the like)."""
    _REGISTRY[cls] = (buffers, scalars)


def _adam(group: dict) -> int:
    return 3 if group.get("amsgrad") else 2


def _rmsprop(group: dict) -> int:
    return 1 + bool(group.get("momentum")) + bool(group.get("centered"))


for _cls, _buffers, _scalars in (
    (torch.optim.Adam, _adam, 1),
    (torch.optim.AdamW, _adam, 1),
    (torch.optim.NAdam, lambda group: 2, 2),
    (torch.optim.RAdam, lambda group: 2, 1),
    (torch.optim.Adamax, lambda group: 2, 1),
    (torch.optim.Adadelta, lambda group: 2, 1),
    (torch.optim.Adagrad, lambda group: 1, 1),  # made in __init__: nothing is pending at the first step
    (torch.optim.ASGD, lambda group: 1, 3),
    (torch.optim.Rprop, lambda group: 2, 1),
    (torch.optim.RMSprop, _rmsprop, 1),
    (torch.optim.SGD, lambda group: 1 if group.get("momentum") else 0, 0),
):
    register_optimizer_states(_cls, _buffers, _scalars)


def unwrap(optimizer: Any) -> Any:
    """The optimizer inside wrappers that hold it as ``.optimizer`` (accelerate's ``AcceleratedOptimizer``)."""
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return optimizer


def registered_counts(optimizer: Any) -> tuple[Buffers, int] | None:
    """The registered counts for ``optimizer``'s class or its nearest registered base; None when unknown."""
    for cls in type(unwrap(optimizer)).__mro__:
        if cls in _REGISTRY:
            return _REGISTRY[cls]
    return None


def pending_state_bytes(optimizer: Any, device_type: str) -> int | None:
    """Bytes on a ``device_type`` device that ``optimizer``'s first step will allocate for the trainable
    parameters that have no state yet; None when its class is not registered. Scalar states count only on the
    CPU, or where the group is capturable or fused (otherwise they stay on the host)."""
    optimizer = unwrap(optimizer)
    counts = registered_counts(optimizer)
    if counts is None:
        return None
    buffers, scalars = counts
    total = 0
    for group in optimizer.param_groups:
        on_device = bool(group.get("capturable") or group.get("fused"))
        for parameter in group["params"]:
            if not parameter.requires_grad or optimizer.state.get(parameter):
                continue
            total += buffers(group) * parameter.numel() * parameter.element_size()
            if device_type == "cpu" or on_device:
                total += scalars * SCALAR_BYTES
    return total
