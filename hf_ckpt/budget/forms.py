"""Budgets planned before the batch is known: the accepted forms, ``"auto"`` and the free memory it reads.

A budget given without ``sample_inputs`` (``hf_ckpt.enable(model, budget=...)``, or ``{"budget": ...}`` in
``gradient_checkpointing_kwargs``) is parsed at the call (:func:`hf_ckpt.runtime.util.units.parse_budget`, with the
request: :class:`hf_ckpt.runtime.request.EnableRequest`) and planned at the first training batch by
:mod:`hf_ckpt.budget.deferred`. It is one of:

* a size: bytes of activation memory (an int, or a string with a unit: ``"40GiB"``);
* a fraction of the activation memory retained without checkpointing (``0.5``, ``"50%"``);
* ``"auto"``: the free memory of the model's device when the first batch arrives (``torch.<device>.mem_get_info``;
  on the CPU, the host's available memory, ``MemAvailable`` in ``/proc/meminfo``) minus a headroom of
  :data:`AUTO_HEADROOM_FRACTION` of the device's total memory (at least :data:`AUTO_HEADROOM_MIN_BYTES`), minus
  what the step still allocates besides activations (the gradients of the trainable parameters and the step's
  largest transient, as the estimator predicts them, and the state the optimizer's first step allocates: the
  ``Trainer``'s own optimizer, counted by :mod:`hf_ckpt.meters.optimizer_states`, AdamW's otherwise). It is resolved to
  bytes once, at the first batch; re-plans keep that figure.

:func:`set_free_memory_source` replaces where free memory is read (tests, or a scheduler that knows better).
"""

from __future__ import annotations

import os
from typing import Callable

import torch

from hf_ckpt.runtime.util.units import AUTO, format_bytes  # AUTO is defined with the parser

#: Share of the device's total memory ``"auto"`` leaves free: allocator rounding and fragmentation, the CUDA
#: context and library workspaces, and what the estimate does not model.
AUTO_HEADROOM_FRACTION = 0.10
#: The smallest headroom ``"auto"`` leaves, in bytes.
AUTO_HEADROOM_MIN_BYTES = 512 * 2**20

#: ``source(device) -> (free_bytes, total_bytes)``.
FreeMemorySource = Callable[[torch.device], "tuple[int, int]"]


def describe(budget: float | int | str) -> str:
    """The budget as a person reads it: ``50%``, ``40.00 GiB``, ``auto``."""
    if budget == AUTO:
        return AUTO
    if isinstance(budget, float):
        return f"{100 * budget:g}%"
    return format_bytes(budget) if budget >= 2**20 else f"{budget} bytes"


def host_memory() -> tuple[int, int]:
    """(available, total) bytes of host memory: ``MemAvailable``/``MemTotal`` from ``/proc/meminfo``, else
    ``sysconf``'s available and total pages."""
    try:
        with open("/proc/meminfo") as handle:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in handle if line.count(":") == 1}
        return fields["MemAvailable"], fields["MemTotal"]
    except (OSError, KeyError, ValueError, IndexError):
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def device_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of ``device``: the accelerator's ``mem_get_info``, the host's for the CPU."""
    if device.type == "cpu":
        return host_memory()
    mem_get_info = getattr(getattr(torch, device.type, None), "mem_get_info", None)
    if mem_get_info is None:
        raise ValueError(
            f"budget='auto' cannot read the free memory of a {device.type} device (torch.{device.type} has no "
            "mem_get_info); give a size such as 40GiB"
        )
    free, total = mem_get_info(device)
    return int(free), int(total)


_source: FreeMemorySource = device_memory


def set_free_memory_source(source: FreeMemorySource | None) -> FreeMemorySource:
    """Read free memory for ``budget="auto"`` with ``source(device) -> (free_bytes, total_bytes)``; None puts
    back the default (:func:`device_memory`). Returns the source that was in use."""
    global _source
    if source is not None and not callable(source):
        raise TypeError(f"source must be a function (device) -> (free_bytes, total_bytes) or None; got {source!r}")
    previous, _source = _source, source if source is not None else device_memory
    return previous


def headroom(total: int) -> int:
    """What ``"auto"`` leaves free on a device of ``total`` bytes."""
    return max(int(AUTO_HEADROOM_FRACTION * total), AUTO_HEADROOM_MIN_BYTES)


def auto_activation_bytes(device: torch.device, still_allocated: int, details: str) -> int:
    """The activation budget ``"auto"`` gives on ``device``: free memory, less the headroom, less
    ``still_allocated`` (what the step allocates besides activations, described by ``details``)."""
    free, total = _source(device)
    left = int(free) - headroom(int(total)) - int(still_allocated)
    if left <= 0:
        raise ValueError(
            f"budget='auto': no memory is left for activations on {device}: {format_bytes(free)} free, less a "
            f"headroom of {format_bytes(headroom(int(total)))} ({AUTO_HEADROOM_FRACTION:.0%} of "
            f"{format_bytes(total)}), less {format_bytes(still_allocated)} the step still allocates ({details}); "
            "give a budget in bytes, or free memory"
        )
    return left
