"""Activation memory, measured from the tensor storages a training step actually creates.

:class:`StorageTracker` is a ``TorchDispatchMode``: every aten op of the step (forward, backward, the recompute of
checkpointed blocks, the copies an offloading hook makes) passes through it. For each tensor an op returns, it
looks at the tensor's untyped storage:

* a storage it has seen as the *input* of an op before seeing it created is **foreign**: parameters, buffers,
  the batch, anything that existed before the step (and every view of them). Foreign storages are never counted.
* any other storage was created during the step. The tracker records its size and device and keeps a weak
  reference whose callback subtracts the bytes again when the storage is freed.

So the live count is exactly the bytes of storages created inside the mode and still alive, per device, and the
peak is the largest that count reached. This is what backward holds, whatever holds it: autograd's saved tensors,
checkpoint's saved inputs, ``save_on_cpu``'s host copies (which count on the device of their storage: host
memory is ``cpu``), tensors a selective-recompute policy keeps. Summing the tensors that saved-tensor hooks see
undercounts all but the first of these, which is why the tracker watches storages instead.

Sizes are the storages' own ``nbytes``; allocator rounding and fragmentation are not included (on CUDA,
:func:`hf_ckpt.measure.measure_step` reports ``torch.cuda.max_memory_allocated`` next to it). Storages created
without passing through the dispatcher (``torch.tensor(data)``, ``torch.from_numpy``) are treated as foreign, with
one exception: RNG states. Checkpointing saves one per call to replay dropout (``torch.get_rng_state()``: 5056
bytes on CPU), and so do hf_ckpt's partitions and recomputed dropout; while the mode is active,
``torch.get_rng_state`` and ``torch.cuda.get_rng_state`` hand their results to the tracker, so they count.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections import Counter
from typing import Any, Callable, Hashable, Iterator, Sequence

import torch
from torch.utils.weak import WeakIdKeyDictionary

from hf_ckpt.runtime.offload import making_host_copy
from hf_ckpt.runtime.util.storage import storage_of
from hf_ckpt.runtime._torch import TorchDispatchMode, tree_leaves


#: The key of :meth:`StorageTracker.live_bytes` for host copies an offload makes of CPU tensors (a CPU-only run).
HOST = "host"


class StorageTracker(TorchDispatchMode):
    """Count the bytes of tensor storages created while the mode is active, live and at their peak, per device.

    Example::

        with StorageTracker() as tracker:
            loss = model(**batch).loss
            retained = tracker.live_bytes()      # what backward will hold, per device
            loss.backward()
        tracker.peak_bytes()                     # the most that was alive at once during the step

    Parameters, buffers and every storage that existed before the mode was entered are ignored, and so are views
    of them. On a CPU-only run, the host copies of an activation offload (``offload=True``) count under
    :data:`HOST`, apart from ``"cpu"``, as host memory does apart from an accelerator's. The counts stay valid after
    the mode exits (storages freed later keep being subtracted).
    """

    def __init__(self, label: Callable[[], Hashable] | None = None) -> None:
        """``label``, when given, is called as each storage is created; :meth:`live_bytes_by_label` then splits
        the live bytes by those labels (the planner labels storages with the block being run)."""
        super().__init__()
        self._lock = threading.RLock()  # a storage freed by the collector inside a locked section takes it again
        self._foreign: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._tracked: dict[int, tuple[weakref.ref, str, int]] = {}
        self._live: Counter[str] = Counter()
        self._peak: Counter[str] = Counter()
        self._label = label
        self._labels: dict[int, Hashable] = {}

    # -- the mode ---------------------------------------------------------------------------------------------

    def __enter__(self) -> "StorageTracker":
        self._rng_patches = _count_rng_states(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        for owner, name, original in getattr(self, "_rng_patches", ()):
            setattr(owner, name, original)
        self._rng_patches = []
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        for value in tree_leaves((args, kwargs)):
            storage = storage_of(value)
            if storage is not None and id(storage) not in self._tracked and storage not in self._foreign:
                self._foreign[storage] = True
        out = func(*args, **kwargs)
        for value in tree_leaves(out):
            storage = storage_of(value)
            if storage is not None and storage not in self._foreign:
                self._track(storage)
        return out

    def _track(self, storage: torch.UntypedStorage, label: Callable[[], Hashable] | None = None) -> None:
        key = id(storage)
        nbytes = storage.nbytes()
        # the label first, outside the lock: it may allocate, the collector may then free a tracked storage, and
        # that storage's callback takes the lock
        labelled = (label or self._label)() if self._label is not None else None
        with self._lock:
            known = self._tracked.get(key)
            if known is not None:
                reference, device, old = known
                if old == nbytes:
                    return
                self._tracked[key] = (reference, device, nbytes)  # resized in place (an ``out=`` op)
                self._add(device, nbytes - old)
                return
            device = HOST if making_host_copy() else str(storage.device)
            reference = weakref.ref(storage, self._on_free(key))
            self._tracked[key] = (reference, device, nbytes)
            if self._label is not None:
                self._labels[key] = labelled
            self._add(device, nbytes)

    def _add(self, device: str, nbytes: int) -> None:
        self._live[device] += nbytes
        if self._live[device] > self._peak[device]:
            self._peak[device] = self._live[device]

    def _on_free(self, key: int):
        def callback(_reference: weakref.ref) -> None:
            with self._lock:
                entry = self._tracked.pop(key, None)
                self._labels.pop(key, None)
                if entry is not None:
                    self._live[entry[1]] -= entry[2]

        return callback

    # -- results ----------------------------------------------------------------------------------------------

    def live_bytes(self) -> dict[str, int]:
        """Bytes of storages created under the mode and alive now, per device (``"cpu"``, ``"cuda:0"``, ...)."""
        with self._lock:
            return {device: count for device, count in self._live.items() if count}

    def current_bytes(self) -> dict[str, int]:
        """Like :meth:`live_bytes`, each storage at its size now: a storage resized outside any operator (FSDP2
        frees an unsharded parameter with ``untyped_storage().resize_(0)``) counts at its new size."""
        result: Counter[str] = Counter()
        with self._lock:
            entries = list(self._tracked.values())
        for reference, device, _nbytes in entries:
            storage = reference()
            if storage is not None:
                result[device] += storage.nbytes()
        return {device: count for device, count in result.items() if count}

    def live_bytes_by_label(self, device: str) -> dict[Hashable, int]:
        """Bytes alive now on ``device``, split by the label each storage got when it was created."""
        result: Counter[Hashable] = Counter()
        with self._lock:
            for key, (_reference, storage_device, nbytes) in self._tracked.items():
                if storage_device == device:
                    result[self._labels.get(key)] += nbytes
        return {label: count for label, count in result.items() if count}

    def peak_bytes(self) -> dict[str, int]:
        """The largest :meth:`live_bytes` reached on each device since the mode was entered or :meth:`reset_peak`."""
        with self._lock:
            return {device: count for device, count in self._peak.items() if count}

    def reset_peak(self) -> None:
        """Start a new peak from the bytes alive now."""
        with self._lock:
            self._peak = Counter(self._live)


def _count_rng_states(tracker: StorageTracker) -> list[tuple[Any, str, Any]]:
    """Make ``torch.get_rng_state`` (and CUDA's) hand each state they return to ``tracker``; the patches made (a
    tracker inside another wraps the outer one's function: both count)."""
    patches = []
    owners = [torch] + ([torch.cuda] if torch.cuda.is_available() else [])
    for owner in owners:
        original = getattr(owner, "get_rng_state", None)
        if original is None:
            continue

        def counted(*args: Any, _original: Any = original, **kwargs: Any) -> torch.Tensor:
            state = _original(*args, **kwargs)
            storage = storage_of(state)
            if storage is not None:  # a checkpoint takes it before the block's hooks run: label by the call stack
                tracker._track(storage, getattr(tracker._label, "from_stack", None))
            return state

        setattr(owner, "get_rng_state", counted)
        patches.append((owner, "get_rng_state", original))
    return patches


@contextlib.contextmanager
def block_labels(blocks: Sequence[Any]) -> Iterator[Callable[[], int | None]]:
    """A ``label`` function for :class:`StorageTracker`: the index of the block running now, or None outside the
    blocks (hooks on each block's forward, removed on exit). ``blocks`` are :class:`~hf_ckpt.runtime.blocks.Block` s."""
    current: list[int | None] = [None]
    index_of = {id(block.module): block.index for block in blocks}

    def label() -> int | None:
        return current[0]

    def from_stack() -> int | None:
        """The innermost block on the call stack, else :func:`label`'s answer: a checkpoint around a block's
        ``__call__`` runs before the block's hooks do. A frame names a block by a local that is the block, or a
        method or ``partial`` of it (a stack's loop hands ``layer.__call__`` to its checkpoint function)."""
        frame = sys._getframe(1)
        while frame is not None:
            for value in frame.f_locals.values():
                owner = getattr(getattr(value, "func", value), "__self__", value)
                index = index_of.get(id(owner))
                if index is not None:
                    return index
            frame = frame.f_back
        return current[0]

    label.from_stack = from_stack  # type: ignore[attr-defined]
    handles = []
    for block in blocks:
        handles.append(block.module.register_forward_pre_hook(lambda m, a, i=block.index: current.__setitem__(0, i)))
        handles.append(block.module.register_forward_hook(lambda m, a, o: current.__setitem__(0, None)))
    try:
        yield label
    finally:
        for handle in handles:
            handle.remove()
