"""Profile one block per block type, op by op: what each op's output costs to keep and what it costs to recompute.

For the first block of each group of twin blocks (same class, same parameter shapes), the model runs one forward
with a hook that captures the block's inputs. The block then runs alone, under non-reentrant checkpointing, with
two ``TorchDispatchMode`` recorders as its ``context_fn``:

* in forward, every aten op the selective-checkpoint machinery numbers (all but ``SAC_IGNORED_OPS``) is recorded
  with its occurrence (``"aten.mm.default#3"``), the submodule that ran it, and the tensor storages its outputs
  hold. A storage is *fresh* when an op of the block created it (parameters, buffers and the block's inputs are
  not); saving an op costs the bytes of its fresh storages, shared with every other saved op that aliases them.
  Ops that a later op writes into in place are marked: saving them would be wrong (see
  :class:`~hf_ckpt.SelectiveRecomputeError`).
* in the recompute that backward triggers, the FLOPs of each op that actually runs again (checkpointing stops
  the recompute early once every tensor backward needs is back, so the tail of a block costs nothing), counted
  with ``torch.utils.flop_counter``'s formulas (plus hf_ckpt's CPU attention formulas), and, for the ops without
  a formula (norms, activations, softmax, dropout, pointwise arithmetic), their output elements
  (:func:`hf_ckpt.meters.flops.elementwise_elements`): the part of the recompute FLOP counts are blind to.

The forward recorder also asks the block-level selective policy which ops it keeps, so the price of
``strategy="selective"`` (the ops it reruns) is known op by op too.

Under a policy that saves a set of ops, the recompute returns their stored outputs instead of running them and
runs every other op as before, so recompute costs are additive per op: ``recompute(S) = full - sum(f_i, i in S)``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch import nn

from hf_ckpt.runtime.util.flop_formulas import flop_registry
from hf_ckpt.runtime.util.storage import storage_of
from hf_ckpt.runtime._torch import TorchDispatchMode, op_schema, tree_leaves, tree_map
from hf_ckpt.runtime.blocks import Block
from hf_ckpt.meters.flops import elementwise_elements
from hf_ckpt.strategies.selective.policy import written_tensors
from hf_ckpt.strategies.oplevel.policy import ignored_ops, op_key


@dataclass(frozen=True)
class OpRecord:
    """One op occurrence of a block's forward.

    Attributes:
        key: ``"aten.mm.default#3"``.
        module: The submodule (relative to the block) that ran it, ``""`` for the block's own forward.
        storages: Fresh storages its outputs hold (ids local to the profile; see ``BlockOpProfile.storage_bytes``).
        recompute_flops: FLOPs it spends in the recompute (0 for ops without a formula and for the tail the
            recompute never reaches).
        written: A later op of the block writes into its output in place: it must not be saved.
        recompute_elementwise: Output elements it writes in the recompute when it has no FLOP formula (0 for
            matmul-class ops, views, allocations and the tail the recompute never reaches).
        mutates: It writes into one of its inputs (``add_``, ``bernoulli_``): code goes on with the input, not
            with the op's return value, so saving its output would not stand in for running it.
        selective: The block-level selective policy (``strategy="selective"``) keeps its output.
    """

    key: str
    module: str
    storages: tuple[int, ...]
    recompute_flops: int
    written: bool = False
    recompute_elementwise: int = 0
    mutates: bool = False
    selective: bool = False

    @property
    def recompute_cost(self) -> int:
        """What the planner minimises: FLOPs plus elementwise output elements (one each)."""
        return self.recompute_flops + self.recompute_elementwise


@dataclass(frozen=True)
class BlockOpProfile:
    """The op-level profile of one block type.

    Attributes:
        block_type: The block's class name.
        blocks: Indices of the blocks it stands for (the twin group).
        ops: Every op occurrence of one forward, in order.
        storage_bytes: Bytes of each fresh storage.
    """

    block_type: str
    blocks: tuple[int, ...]
    ops: tuple[OpRecord, ...]
    storage_bytes: dict[int, int] = field(default_factory=dict)

    @property
    def recompute_flops(self) -> int:
        """FLOPs of the recompute with nothing saved (plain checkpointing of the block)."""
        return sum(op.recompute_flops for op in self.ops)

    @property
    def recompute_elementwise(self) -> int:
        """Elementwise output elements of the recompute with nothing saved."""
        return sum(op.recompute_elementwise for op in self.ops)

    @property
    def selective_elementwise(self) -> int:
        """Elementwise output elements the block-level selective policy still recomputes."""
        return sum(op.recompute_elementwise for op in self.ops if not op.selective)

    def saved_bytes(self, keys: set[str] | frozenset[str] | tuple[str, ...]) -> int:
        """Bytes that saving the op occurrences ``keys`` keeps (aliased storages counted once)."""
        wanted = set(keys)
        storages = {s for op in self.ops if op.key in wanted for s in op.storages}
        return sum(self.storage_bytes[s] for s in storages)

    def saved_flops(self, keys: set[str] | frozenset[str] | tuple[str, ...]) -> int:
        """Recompute FLOPs that saving ``keys`` avoids."""
        wanted = set(keys)
        return sum(op.recompute_flops for op in self.ops if op.key in wanted)

    def saved_elementwise(self, keys: set[str] | frozenset[str] | tuple[str, ...]) -> int:
        """Recompute elementwise output elements that saving ``keys`` avoids."""
        wanted = set(keys)
        return sum(op.recompute_elementwise for op in self.ops if op.key in wanted)


def _flops(registry: Mapping[Any, Callable[..., int]], func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    formula = registry.get(getattr(func, "overloadpacket", func))
    if formula is None:
        return 0
    return int(formula(*args, **kwargs, out_val=out))


class _ForwardRecorder(TorchDispatchMode):
    def __init__(self, foreign: set[int], module_name: Callable[[], str], registry: Mapping[Any, Any],
                 selective_fn: Callable[..., Any] | None = None) -> None:
        super().__init__()
        self.selective_fn = selective_fn
        self.foreign = foreign
        self.module_name = module_name
        self.registry = registry
        self.ignored = ignored_ops()
        self.counts: Counter = Counter()
        self.ops: list[dict[str, Any]] = []
        self.fresh: dict[int, int] = {}  # data_ptr -> local storage id
        self.storage_bytes: dict[int, int] = {}
        self.producer: dict[int, int] = {}  # local storage id -> index of the op that created it
        self.keep: list[Any] = []  # outputs held so that no storage address is reused during the profile

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.ignored:
            return func(*args, **kwargs)
        for value in tree_leaves((args, kwargs)):
            storage = storage_of(value)
            if storage is not None and storage.data_ptr() not in self.fresh:
                self.foreign.add(storage.data_ptr())
        for tensor in written_tensors(func, args, kwargs):
            storage = storage_of(tensor)
            local = self.fresh.get(storage.data_ptr()) if storage is not None else None
            if local is not None:
                for op in self.ops:
                    if local in op["storages"]:
                        op["written"] = True
        out = func(*args, **kwargs)
        occurrence = self.counts[func]
        self.counts[func] += 1
        storages = []
        for value in tree_leaves(out):
            storage = storage_of(value)
            if storage is None or storage.nbytes() == 0:
                continue
            pointer = storage.data_ptr()
            if pointer in self.foreign:
                continue
            if pointer not in self.fresh:
                local = len(self.fresh)
                self.fresh[pointer] = local
                self.storage_bytes[local] = storage.nbytes()
            storages.append(self.fresh[pointer])
        self.keep.append(out)
        self.ops.append({
            "key": op_key(func, occurrence),
            "module": self.module_name(),
            "storages": tuple(dict.fromkeys(storages)),
            "written": False,
            "mutates": bool(getattr(op_schema(func), "is_mutable", False)),
            "selective": self._selective(func, args, kwargs),
        })
        return out

    def _selective(self, func: Any, args: tuple, kwargs: dict) -> bool:
        if self.selective_fn is None:
            return False
        from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

        decision = self.selective_fn(SelectiveCheckpointContext(is_recompute=False), func, *args, **kwargs)
        return decision in (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)


class _RecomputeRecorder(TorchDispatchMode):
    def __init__(self, registry: Mapping[Any, Any]) -> None:
        super().__init__()
        self.registry = registry
        self.ignored = ignored_ops()
        self.counts: Counter = Counter()
        self.flops: dict[str, int] = {}
        self.elementwise: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func not in self.ignored:
            occurrence = self.counts[func]
            self.counts[func] += 1
            key = op_key(func, occurrence)
            self.flops[key] = _flops(self.registry, func, args, kwargs, out)
            self.elementwise[key] = elementwise_elements(func, out, self.registry)
        return out


def capture_inputs(model: nn.Module, blocks: list[Block], run: Callable[[], Any]) -> dict[int, tuple[tuple, dict]]:
    """The (args, kwargs) each of ``blocks`` was called with in one forward, detached (leaves that require grad)."""
    captured: dict[int, tuple[tuple, dict]] = {}

    def detach(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            leaf = value.detach()
            return leaf.requires_grad_(True) if value.requires_grad and leaf.is_floating_point() else leaf
        return value

    def hook(index: int):
        def capture(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if index not in captured:
                captured[index] = (tree_map(detach, args), tree_map(detach, kwargs))

        return capture

    handles = [block.module.register_forward_pre_hook(hook(block.index), with_kwargs=True) for block in blocks]
    try:
        with torch.enable_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return captured


@contextlib.contextmanager
def _module_names(block: nn.Module):
    stack: list[str] = [""]
    handles = []

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        stack.pop()

    for name, module in block.named_modules():
        if module is block:
            continue
        handles.append(module.register_forward_pre_hook(lambda m, a, name=name: stack.append(name)))
        handles.append(module.register_forward_hook(leave))
    try:
        yield lambda: stack[-1]
    finally:
        for handle in handles:
            handle.remove()


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def profile_block(block: Block, args: tuple, kwargs: dict, group: tuple[int, ...],
                  selective_fn: Callable[..., Any] | None = None) -> BlockOpProfile:
    """Run ``block`` once, checkpointed, on its captured inputs and record its ops (see the module docstring).

    ``selective_fn`` is the block-level selective policy function, asked which ops it keeps.
    """
    from torch.utils.checkpoint import checkpoint

    module = block.module
    registry = flop_registry()
    foreign = {s.data_ptr() for s in (storage_of(v) for v in tree_leaves((args, kwargs))) if s is not None}
    foreign |= {s.data_ptr() for s in (storage_of(t) for t in (*module.parameters(), *module.buffers())) if s is not None}
    with _module_names(module) as module_name:
        forward = _ForwardRecorder(foreign, module_name, registry, selective_fn)
        recompute = _RecomputeRecorder(registry)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            output = checkpoint(
                module, *args, use_reentrant=False, context_fn=lambda: (forward, recompute), **kwargs
            )
        outputs = [t for t in _tensors(output) if t.requires_grad]
        if not outputs:
            raise ValueError(f"block {block.name} ({type(module).__name__}) returned no tensor that requires grad")
        loss = sum(t.float().sum() for t in outputs)
        loss.backward()
    ops = tuple(
        OpRecord(
            key=op["key"], module=op["module"], storages=op["storages"],
            recompute_flops=recompute.flops.get(op["key"], 0), written=op["written"],
            recompute_elementwise=recompute.elementwise.get(op["key"], 0), mutates=op["mutates"],
            selective=op["selective"],
        )
        for op in forward.ops
    )
    return BlockOpProfile(
        block_type=type(module).__name__, blocks=group, ops=ops, storage_bytes=dict(forward.storage_bytes)
    )
