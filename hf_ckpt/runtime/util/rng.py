"""The RNG state of a device, taken and put back: what replaying a random op (dropout) in backward needs."""

from __future__ import annotations

import torch


def rng_state(device: torch.device) -> torch.Tensor:
    """The generator state of ``device`` (a CPU tensor: 5056 bytes for the CPU generator)."""
    if device.type == "cpu":
        return torch.get_rng_state()
    return getattr(torch, device.type).get_rng_state(device)


def set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    """Put ``state`` (from :func:`rng_state`) back as the generator state of ``device``."""
    if device.type == "cpu":
        torch.set_rng_state(state)
    else:
        getattr(torch, device.type).set_rng_state(state.cpu(), device)
