"""Leave a model as it was found: what profiling and checking steps must put back."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn


def accelerator_devices(model: nn.Module) -> list[torch.device]:
    """The non-CPU devices the model's parameters live on (their RNG state is forked too)."""
    return sorted({p.device for p in model.parameters() if p.device.type != "cpu"}, key=str)


@contextlib.contextmanager
def preserved(model: nn.Module) -> Iterator[None]:
    """Restore, whatever the body does: each module's own ``training`` flag, every parameter's accumulated
    ``.grad`` (the same tensor objects, untouched), and the global RNG state (CPU and the model's accelerators)."""
    modes = [(module, module.training) for module in model.modules()]
    grads = [(parameter, parameter.grad) for parameter in model.parameters()]
    devices = accelerator_devices(model)
    fork_devices = [device.index or 0 for device in devices]
    device_type = devices[0].type if devices else "cuda"
    for parameter, _ in grads:
        parameter.grad = None  # the body accumulates into fresh tensors, never into the user's
    try:
        with torch.random.fork_rng(devices=fork_devices, device_type=device_type):
            yield
    finally:
        for module, training in modes:
            module.training = training
        for parameter, grad in grads:
            parameter.grad = grad


def check_trainable(model: nn.Module, caller: str) -> None:
    """ValueError when no parameter requires grad: a training step would have nothing to differentiate."""
    if not any(parameter.requires_grad for parameter in model.parameters()):
        raise ValueError(
            f"{caller}no parameter of {type(model).__name__} requires grad, so a training step computes no gradient "
            "and nothing can be recomputed. Unfreeze the parameters you train (or add adapters, e.g. PEFT's "
            "get_peft_model) first."
        )
