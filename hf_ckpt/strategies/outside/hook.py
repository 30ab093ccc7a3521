"""Cheap modules between the blocks, recomputed in backward: a plan's ``outside_blocks``.

Per-block checkpointing leaves alone the code that runs between the blocks. There, the tensors backward needs
are kept whole even when they are cheap to make again: a final norm keeps its normalised input and the LM head
keeps the norm's output (two hidden-sized tensors), rotary embeddings hand their ``cos``/``sin`` tables to every
block, a head's activation keeps its input while the next norm keeps its output. torch.compile's partitioner
recomputes such values from the tensors it keeps anyway; in eager mode this module does the same for the modules a
plan names in ``outside_blocks``:

1. **Their insides.** Each named module runs under non-reentrant checkpointing: it keeps only its inputs.
2. **Their outputs.** While the model's forward runs, a saved-tensor hook sees every tensor autograd saves. One
   that is (a view of) the output of a named module, unchanged since, is not kept: backward gets it by running the
   module's ``forward`` again on the same inputs (no hooks, no grad, the autocast state of the forward), once per
   call. Its consumers (the LM head, the blocks, the loss) then hold only the inputs, which are kept anyway.

Only cheap modules qualify: the planner (:func:`hf_ckpt.planning.menus.outside.cheap_modules`) measures one forward and picks the outermost modules that hold
no block, spend at most a few FLOPs per output element (norms, activations, rotary
tables, embeddings, a whole embeddings module) and draw no random numbers outside torch's dropout modules: those
are made again from the RNG state the call drew from. A call's argument that is the unchanged output of an
earlier recomputed call is held as that call's recipe, so a chain (an activation, then a norm) keeps only its
first input; so is a sum of such outputs made outside any module (GPT-2's token and position embeddings), found
through the sum's autograd node. The planner measures whether recomputing them pays (``strategies=(..., "outside")``). An input
changed in place after such a call makes backward raise, as checkpointing does, rather than recompute from changed
values.

The runtime's saved-tensor hook is also the one that serves :mod:`hf_ckpt.strategies.partition.boundary` (partitioned blocks'
outputs made again): it is installed for every plan with ``outside_blocks`` or partitioned blocks. Under another
saved-tensor hook (``save_on_cpu``, the user's own) it stands aside, with one warning.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from hf_ckpt.strategies.partition.boundary import MadeAgain, still_noted
from hf_ckpt.strategies.partition.boundary import pack as boundary_pack
from hf_ckpt.strategies.partition.boundary import unpack as _unpack
from hf_ckpt.runtime.util.rng import rng_state, set_rng_state
from hf_ckpt.runtime.util.storage import storage_of
from hf_ckpt.runtime._torch import saved_alpha, saved_tensors_hook_active, version_counter, view_base
from hf_ckpt.runtime.util.warn import warn_once
from hf_ckpt.runtime.stacks.wrapping import wrap_forward

#: A module's recompute counts as cheap up to this many matmul-class FLOPs per element of its output.

#: torch's dropout modules (every subclass of its ``_DropoutNd``): the random ops replayed from their RNG state.
DROPOUTS: tuple[type, ...] = tuple(getattr(nn, name) for name in (
    "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout") if hasattr(nn, name))


def resolve_outside(target: nn.Module, names: tuple[str, ...], blocks: tuple) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` for each of ``names`` in ``target``; ValueError naming the first that is missing or
    inside a block."""
    inside = {id(m) for block in blocks for m in block.module.modules()}
    modules = []
    for name in names:
        try:
            module = target.get_submodule(name)
        except AttributeError:
            raise ValueError(
                f"plan outside_blocks names {name!r}, which is not a module of {type(target).__name__}; make the "
                "plan on the same architecture"
            ) from None
        if any(id(m) in inside for m in module.modules()):
            raise ValueError(f"plan outside_blocks names {name!r}, which is a block, inside one or holds one; it "
                             "must be a module between the blocks")
        outer = next((other for other in names if name.startswith(other + ".")), None)
        if outer is not None:
            raise ValueError(f"plan outside_blocks names {name!r} and {outer!r}, which holds it; name only "
                             f"{outer!r} (recomputing it recomputes {name!r} too)")
        modules.append((name, module))
    return modules


def _storage_ref(tensor: Any) -> Any:
    """A weak reference to the storage of a plain tensor (hashable, equal for one storage), or None."""
    storage = storage_of(tensor)
    return StorageWeakRef(storage) if storage is not None else None


def _autocast_state(device_type: str) -> tuple[bool, torch.dtype | None]:
    try:
        return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    except (TypeError, RuntimeError, AttributeError):  # older torch: no per-device autocast queries
        return torch.is_autocast_enabled(), None


class _Call:
    """One call of a recomputed module: how to make its outputs again, and the outputs once made.

    An argument that is itself the unchanged output of an earlier recomputed call is held as that call's recipe,
    not as a tensor: a chain of cheap modules (an activation, then a norm) keeps only the chain's first input. A
    module that draws random numbers (dropout) is made again with the RNG state it drew from."""

    __slots__ = ("forward", "args", "kwargs", "versions", "name", "autocast", "device_type", "rng", "outputs")

    def __init__(self, forward: Any, args: tuple, kwargs: dict, name: str, rng: tuple | None = None,
                 pack: Any = None) -> None:
        self.forward, self.name, self.rng = forward, name, rng
        tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
        self.device_type = tensors[0].device.type if tensors else "cpu"
        self.autocast = _autocast_state(self.device_type)
        held = (lambda value: pack(value) if isinstance(value, torch.Tensor) else value) if pack else (lambda v: v)
        self.args, self.kwargs = tuple(held(a) for a in args), {k: held(v) for k, v in kwargs.items()}
        self.versions = [(t, version_counter(t)) for t in (*self.args, *self.kwargs.values())
                         if isinstance(t, torch.Tensor)]
        self.outputs: tuple | None = None

    def output(self, index: int) -> torch.Tensor:
        if self.outputs is None:
            for tensor, version in self.versions:
                if version_counter(tensor) != version:
                    raise RuntimeError(
                        f"hf_ckpt: an input of {self.name} was modified in place after its forward; its output cannot "
                        "be recomputed in backward. Leave the module out of the plan's outside_blocks."
                    )
            args, kwargs = tuple(_unpack(a) for a in self.args), {k: _unpack(v) for k, v in self.kwargs.items()}
            enabled, dtype = self.autocast
            options = {"dtype": dtype} if dtype is not None else {}
            with torch.no_grad(), torch.autocast(self.device_type, enabled=enabled, **options), _replayed(self.rng):
                result = self.forward(*args, **kwargs)
            self.outputs = result if isinstance(result, tuple) else (result,)
        return self.outputs[index]


@contextlib.contextmanager
def _replayed(rng: tuple | None) -> Iterator[None]:
    """Run at ``rng`` (a device and the RNG state a call drew from), put back afterwards; nothing for None."""
    if rng is None:
        yield
        return
    device, state = rng
    fork = {"devices": []} if device.type == "cpu" else {"devices": [device], "device_type": device.type}
    with torch.random.fork_rng(**fork):
        set_rng_state(device, state)
        yield


class OutsideRecompute:
    """The runtime of a plan's ``outside_blocks`` on one model (see the module docstring)."""

    def __init__(self) -> None:
        # storage -> (call, output index, version, dtype, bytes, the key itself: a key compares equal to a new storage
        # at the address of a freed one, so an entry counts only while its own key is alive)
        self._outputs: dict[Any, tuple[_Call, int, int, torch.dtype, int, Any]] = {}
        self._contexts: list[Any] = []
        self.drawn: dict[int, tuple] = {}  # per random module (by id): (device, RNG state) its running call drew from
        self._nodes: dict[tuple[Any, int], tuple[_Call, int]] = {}  # (autograd node, output number) -> (call, index)

    def produced(self, name: str, forward: Any, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        """Forward hook of a recomputed module: remember its output storages while the model's forward runs."""
        rng = self.drawn.pop(id(module), None)
        if not self.watching():
            return
        call = _Call(forward, args, kwargs, name, rng=rng, pack=self._pack)
        for index, tensor in enumerate(output if isinstance(output, tuple) else (output,)):
            ref = _storage_ref(tensor)
            if ref is not None:
                self._outputs[ref] = (call, index, version_counter(tensor), tensor.dtype,
                                      tensor.untyped_storage().nbytes(), ref)
            if isinstance(tensor, torch.Tensor) and tensor.grad_fn is not None:
                self._nodes[(tensor.grad_fn, tensor.output_nr)] = (call, index)

    def _pack(self, tensor: torch.Tensor) -> Any:
        ref = _storage_ref(tensor)
        entry = self._outputs.get(ref) if ref is not None else None
        if entry is None:
            made = _sum_of_outputs(self._nodes, tensor.grad_fn, tensor.output_nr) if view_base(tensor) is None else None
            # a sum of recomputed outputs (GPT-2's token and position embeddings), a partitioned block's output, or kept
            return MadeAgain(made, tensor) if made is not None else boundary_pack(tensor)
        call, index, version, dtype, nbytes, key = entry
        if not still_noted(tensor, key, version, dtype, nbytes):
            return tensor  # changed in place since, or another view of the storage: keep it
        return MadeAgain(functools.partial(call.output, index), tensor)

    def watching(self) -> bool:
        """Whether a training forward of the model is running with its saved tensors watched."""
        return any(context is not None for context in self._contexts)

    def enter(self, module: nn.Module, args: Any) -> None:
        """Pre-hook of the model: in a training forward with grad, watch what autograd saves."""
        if not (torch.is_grad_enabled() and module.training) or self.watching():
            self._contexts.append(None)  # nothing to watch, or an outer call (a PEFT or DDP wrapper) watches already
            return
        if saved_tensors_hook_active():  # the user's own hook (save_on_cpu, ...) sees every tensor
            warn_once(
                "hf_ckpt: another saved-tensor hook (torch.autograd.graph.save_on_cpu or your own) is active around "
                "the model's forward, so the plan's outside_blocks and partitioned blocks' outputs are kept as that "
                "hook decides, not recomputed in backward.",
                key="outside-foreign-hook",
                owner=self,  # once per setting
            )
            self._contexts.append(None)
            return
        context = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        context.__enter__()
        self._contexts.append(context)

    def exit(self, module: nn.Module, args: Any, output: Any) -> None:
        """Forward hook of the model (always called): stop watching, forget this forward's outputs."""
        if not self._contexts:
            return
        context = self._contexts.pop()
        if context is not None:
            context.__exit__(None, None, None)
            self._outputs.clear()
            self._nodes.clear()


#: How many sums deep :func:`_sum_of_outputs` looks (BERT's embeddings add three lookups: two).
_MAX_SUMS = 4


def _sum_of_outputs(nodes: dict, node: Any, output_nr: int, depth: int = 0) -> Any:
    """How to make again the value autograd ``node`` produced (its output ``output_nr``): the output of a recomputed
    call, or a sum (``a + alpha * b``, in place or not) of such values, found through the sum's backward node; None
    where it is neither. The sum is made in the same order, so it is the same tensor, bit for bit."""
    found = nodes.get((node, output_nr))
    if found is not None:
        return functools.partial(found[0].output, found[1])
    if depth >= _MAX_SUMS or type(node).__name__ != "AddBackward0" or len(node.next_functions) != 2:
        return None  # also an operand that needs no grad (its next function is None): nothing tells what it was
    parts = [_sum_of_outputs(nodes, *operand, depth + 1) for operand in node.next_functions]
    if None in parts:
        return None
    return functools.partial(_added, *parts, saved_alpha(node))


def _added(first: Any, second: Any, alpha: Any) -> torch.Tensor:
    return torch.add(first(), second(), alpha=alpha) if alpha != 1 else first() + second()


def _checkpointed(runtime: OutsideRecompute, module: nn.Module, random: bool, forward: Any, *args: Any,
                  **kwargs: Any) -> Any:
    """A recomputed module's forward: under non-reentrant checkpointing (it keeps its inputs) while the runtime
    watches a training forward; plain otherwise (no grad, or hf_ckpt's hooks suspended while the planner profiles).
    A ``random`` module's RNG state is noted first, for its output to be made again from it."""
    if not (torch.is_grad_enabled() and runtime.watching()):
        return forward(*args, **kwargs)
    from torch.utils.checkpoint import checkpoint

    if not random:  # nothing drawn: no RNG state to keep (5 KB per call on CPU)
        return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)
    tensor = next((t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)), None)
    device = tensor.device if tensor is not None else torch.device("cpu")
    drawn = runtime.drawn[id(module)] = (device, rng_state(device))
    # the recipe's state also replays the checkpoint's recompute: one RNG state per call, not torch's copy as well
    return checkpoint(_replaying(forward, drawn), *args, use_reentrant=False, preserve_rng_state=False, **kwargs)


def _replaying(forward: Any, drawn: tuple) -> Any:
    """``forward``, run as it is the first time (the forward) and at the RNG state ``drawn`` after (the recompute)."""
    calls: list[bool] = []

    def run(*args: Any, **kwargs: Any) -> Any:
        if not calls:
            calls.append(True)
            return forward(*args, **kwargs)
        with _replayed(drawn):
            return forward(*args, **kwargs)

    return run


def install(state: Any, outer: list[nn.Module], modules: list[tuple[str, nn.Module]]) -> None:
    """Recompute ``modules`` (from :func:`resolve_outside`) in backward, watching the forwards of ``outer``;
    recorded in ``state`` (hooks, undo)."""
    runtime = OutsideRecompute()
    for name, module in modules:
        forward = module.forward
        # undone without removing a wrapper another library put on since (hf_ckpt.runtime.stacks.wrapping)
        state.undo.append(wrap_forward(module, functools.partial(_checkpointed, runtime, module, _draws(module))))
        state.hooks.add(module, "register_forward_hook", functools.partial(runtime.produced, name, forward),
                        with_kwargs=True)
    seen: set[int] = set()
    for module in outer:
        if id(module) not in seen:
            seen.add(id(module))
            state.hooks.add(module, "register_forward_pre_hook", runtime.enter)
            state.hooks.add(module, "register_forward_hook", runtime.exit, always_call=True)


def _draws(module: nn.Module) -> bool:
    """Whether ``module`` is or holds one of torch's dropout modules, the random ops that may be recomputed (from
    the RNG state the call drew from)."""
    return any(isinstance(m, DROPOUTS) for m in module.modules())

