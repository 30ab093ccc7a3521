"""Activation offload whose copies overlap with compute.

Upstream's ``offload=True`` wraps each checkpoint in ``torch.autograd.graph.save_on_cpu``: the device-to-host copy
in forward and the host-to-device copy in backward both run on the compute stream, so the step waits for them.
:class:`OverlappedOffload` moves them off it:

* **Forward (pack).** The compute stream records an event; a dedicated copy stream waits for it and copies the
  tensor into a (pinned) host buffer. ``record_stream`` tells the caching allocator the device memory is in use on
  the copy stream, so the compute stream goes on at once and the memory is reused only after the copy finished.
* **Backward (unpack), double-buffered.** Checkpoints are unpacked in reverse order of packing. Unpacking one
  starts the host-to-device copy of the one before it on a second copy stream, so that copy runs while the current
  block is recomputed; the compute stream waits on an event only for the tensor it needs now. At most two
  tensors are in flight on the way back.
* **Deduplication.** A tensor saved by several checkpoints (position embeddings shared by every block) is copied
  once.

Tensors that are not on the offload device, or smaller than ``min_bytes``, stay where they are. The same code runs
on a CPU-only machine (``device_type="cpu"``: streams and events are no-ops there, copies synchronous, and the copy
back is a new tensor as it is on an accelerator), which is how the tests exercise and measure it.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from hf_ckpt.runtime._torch import version_counter


_HOST_COPY = threading.local()


def making_host_copy() -> bool:
    """Whether this thread is allocating an offload's host copy of a CPU tensor now: on a CPU-only run host and device
    are one memory, and :class:`~hf_ckpt.meters.memory.StorageTracker` counts such copies apart, as ``"host"``."""
    return getattr(_HOST_COPY, "active", False)


def offload_unavailable(device_type: str) -> str | None:
    """Why :class:`OverlappedOffload` cannot run on ``device_type`` with this torch, or None when it can: it needs
    the device module's ``Stream`` (with ``wait_event``) and ``Event`` (detected by capability; torch 2.5's
    ``torch.cpu.Stream``, the CPU stand-in for an accelerator, has no ``wait_event``; 2.13's has)."""
    module = torch.get_device_module(device_type)
    for owner, name in (("Stream", "wait_event"), ("Event", "record")):
        kind = getattr(module, owner, None)
        if kind is None or not hasattr(kind, name):
            return (f"offload=True on {device_type} needs torch.{device_type}.{owner}.{name}, which this torch lacks "
                    "(torch 2.13 has it); upgrade torch or drop offload")
    return None


@dataclass(eq=False)
class _Packed:
    """One offloaded tensor: its host copy, and the events that order the copies."""

    index: int
    host: torch.Tensor
    device: torch.device
    copied_to_host: Any
    on_device: torch.Tensor | None = None
    copied_to_device: Any = None
    keys: list = field(default_factory=list)


class OverlappedOffload(torch.autograd.graph.saved_tensors_hooks):
    """``saved_tensors_hooks`` that keep saved tensors in host memory, copying on side streams.

    Use one instance per model and enter it around each checkpointed region (hf_ckpt binds it into the checkpoint
    function when ``offload=True``)::

        offload = OverlappedOffload("cuda")
        with offload:
            out = torch.utils.checkpoint.checkpoint(block, hidden_states, use_reentrant=False)

    Args:
        device_type: The accelerator whose tensors are offloaded (``"cuda"``, ``"xpu"``, ...; ``"cpu"`` runs the
            same logic synchronously, for tests).
        pin_memory: Pin the host buffers (needed for copies that overlap; requires an accelerator).
        min_bytes: Tensors smaller than this stay on the device (not worth a copy).
    """

    def __init__(self, device_type: str, *, pin_memory: bool = True, min_bytes: int = 1024) -> None:
        self.device_type = device_type
        self.pin_memory = pin_memory
        self.min_bytes = min_bytes
        self._module = torch.get_device_module(device_type)
        missing = offload_unavailable(device_type)
        if missing is not None:
            raise RuntimeError(missing)
        self._to_host = self._module.Stream()
        self._to_device = self._module.Stream()
        self._packed: list[weakref.ref] = []
        self._by_tensor: dict[tuple, tuple[weakref.ref, weakref.ref]] = {}
        super().__init__(self._pack, self._unpack)

    # -- forward ----------------------------------------------------------------------------------------------

    def _key(self, tensor: torch.Tensor) -> tuple:
        return (tensor.data_ptr(), version_counter(tensor), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)

    def _pack(self, tensor: torch.Tensor) -> Any:
        if tensor.device.type != self.device_type or tensor.numel() * tensor.element_size() < self.min_bytes:
            return tensor
        self._trim()
        key = self._key(tensor)
        storage = tensor.untyped_storage()
        known = self._by_tensor.get(key)
        if known is not None and known[0]() is storage and known[1]() is not None:
            return known[1]()  # the same live tensor, saved again by another checkpoint
        compute = self._module.current_stream()
        ready = self._module.Event()
        ready.record(compute)
        _HOST_COPY.active = self.device_type == "cpu"  # host and device are one memory: count the copy apart
        try:
            host = torch.empty(tensor.shape, dtype=tensor.dtype, layout=tensor.layout, pin_memory=self.pin_memory)
        finally:
            _HOST_COPY.active = False
        with self._module.stream(self._to_host):
            self._to_host.wait_event(ready)
            host.copy_(tensor, non_blocking=self.pin_memory)
            copied = self._module.Event()
            copied.record(self._to_host)
        if self.device_type != "cpu":
            tensor.record_stream(self._to_host)
        packed = _Packed(index=len(self._packed), host=host, device=tensor.device, copied_to_host=copied, keys=[key])
        self._packed.append(weakref.ref(packed))
        self._by_tensor[key] = (weakref.ref(storage), weakref.ref(packed, lambda _, key=key: self._by_tensor.pop(key, None)))
        return packed

    # -- backward ---------------------------------------------------------------------------------------------

    def _start_copy_back(self, packed: _Packed) -> None:
        if packed.on_device is not None:
            return
        with self._module.stream(self._to_device):
            self._to_device.wait_event(packed.copied_to_host)
            # copy=True: on the CPU too the tensor back is a new one beside the host copy, as on an accelerator
            packed.on_device = packed.host.to(packed.device, non_blocking=self.pin_memory, copy=True)
            packed.copied_to_device = self._module.Event()
            packed.copied_to_device.record(self._to_device)

    def _previous(self, packed: _Packed) -> _Packed | None:
        for index in range(packed.index - 1, -1, -1):
            earlier = self._packed[index]()
            if earlier is not None:
                return earlier
        return None

    def _unpack(self, packed: Any) -> torch.Tensor:
        if not isinstance(packed, _Packed):
            return packed
        self._start_copy_back(packed)
        earlier = self._previous(packed)
        if earlier is not None:
            self._start_copy_back(earlier)  # prefetch: overlaps with the recompute of this block
        compute = self._module.current_stream()
        compute.wait_event(packed.copied_to_device)
        tensor = packed.on_device
        if self.device_type != "cpu":
            tensor.record_stream(compute)
        packed.on_device = None  # the consumer owns it now; a second unpack copies again
        self._trim()
        return tensor

    def _trim(self) -> None:
        while self._packed and self._packed[-1]() is None:
            self._packed.pop()
