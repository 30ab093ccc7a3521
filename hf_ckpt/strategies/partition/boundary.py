"""A partitioned block's output, made again in backward from what the block keeps anyway.

A block's output is the next block's input, and the next block usually keeps it (its first linear layers need it
for their weight gradients). Often the block that made it already keeps what it was made from: a post-norm block
(BERT and its kin) ends in a layer norm whose backward keeps the norm's input, so the same hidden state is kept
twice, once before the norm and once after. torch.compile partitions the whole model at once and keeps one of the
two; a per-block partition cannot see across the boundary. This module closes that gap in eager mode:

1. **Tails.** When a block is partitioned, :func:`output_tails` looks in its forward graph for each output that
   cheap ops (no matmul-class op, nothing random) compute from values the forward graph saves for backward and the
   block's own parameters and buffers. That subgraph is the output's *tail*.
2. **Registry.** Each time the forward graph runs, :func:`register` notes the output's storage with its tail and
   weak references to the tail's inputs.
3. **Packing.** While the model's forward runs, the saved-tensor hook of :mod:`hf_ckpt.strategies.outside.hook` (installed for
   every plan with partitioned blocks) hands :func:`pack` what it does not recompute itself. A noted output,
   unchanged since, is not kept: backward runs the tail on the saved values (once per call, no grad), which the
   earlier block keeps until its own backward, which comes later. A saved value changed in place since makes
   backward raise rather than recompute from changed values.

Whoever consumes the output is served alike: the next block under any strategy (a checkpoint saves its inputs
through the same hook), the head, a recomputed module between the blocks.
"""

from __future__ import annotations

import operator
import weakref
from typing import Any, Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from hf_ckpt.runtime.util.flop_formulas import flop_registry
from hf_ckpt.runtime.util.storage import storage_of
from hf_ckpt.runtime._torch import is_op_overload, version_counter

#: A tail of more ops than this is not worth a graph of its own; the output is kept.
MAX_TAIL_OPS = 32


def _is_cheap(node: Any, registry: dict) -> bool:
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    if not is_op_overload(node.target):
        return False
    if torch.Tag.nondeterministic_seeded in node.target.tags or node.target.overloadpacket in registry:
        return False
    return True


def _tail(output: Any, available: set, registry: dict) -> list | None:
    """The nodes between ``available`` ones and ``output``, in graph order, or None when an op on the way is not
    cheap or reads a graph input that is not available."""
    needed: set = set()
    stack = [output]
    while stack:
        node = stack.pop()
        if node in needed or node in available:
            continue
        if not _is_cheap(node, registry) or len(needed) >= MAX_TAIL_OPS:
            return None
        needed.add(node)
        stack.extend(node.all_input_nodes)
    return [node for node in output.graph.nodes if node in needed]


def output_tails(forward_graph: Any, outputs: int, state: int) -> dict[int, tuple[Any, list[tuple[str, int]]]]:
    """Per output index of ``forward_graph`` (its first ``outputs`` outputs are the block's; the rest it saves for
    backward): the tail graph and where each of its inputs comes from (``("saved", i)``: the forward graph's output
    ``outputs + i``; ``("state", i)``: its input ``i``, one of the first ``state``, the block's parameters and
    buffers)."""
    from torch import fx

    registry = flop_registry()
    graph = forward_graph.graph
    returned = next(node for node in reversed(graph.nodes) if node.op == "output").args[0]
    sources: dict[Any, tuple[str, int]] = {}
    for index, node in enumerate(returned[outputs:]):
        if isinstance(node, fx.Node):
            sources.setdefault(node, ("saved", index))
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    for index, node in enumerate(placeholders[:state]):
        sources.setdefault(node, ("state", index))
    tails = {}
    for index, node in enumerate(returned[:outputs]):
        if not isinstance(node, fx.Node) or node in sources or "val" not in node.meta:
            continue
        nodes = _tail(node, set(sources), registry)
        if nodes:
            tails[index] = _graph_of(node, nodes, sources)
    return tails


def _graph_of(output: Any, nodes: list, sources: dict) -> tuple[Any, list[tuple[str, int]]]:
    from torch import fx

    graph = fx.Graph()
    env: dict[Any, Any] = {}
    inputs: list[tuple[str, int]] = []
    for node in nodes:
        for argument in node.all_input_nodes:
            if argument not in env and argument in sources:
                env[argument] = graph.placeholder(f"in_{len(inputs)}")
                inputs.append(sources[argument])
        env[node] = graph.node_copy(node, lambda argument: env[argument])
    graph.output(env[output])
    return fx.GraphModule(torch.nn.Module(), graph), inputs


class _TailCall:
    """One output's tail with its inputs: makes the output again, once."""

    __slots__ = ("graph", "inputs", "versions", "output", "__weakref__")

    def __init__(self, graph: Any, inputs: list[torch.Tensor]) -> None:
        self.graph, self.inputs = graph, inputs
        self.versions = [version_counter(tensor) for tensor in inputs]
        self.output: torch.Tensor | None = None

    def made(self) -> torch.Tensor:
        if self.output is None:
            if any(version_counter(tensor) != version for tensor, version in zip(self.inputs, self.versions)):
                raise RuntimeError(
                    "hf_ckpt: a tensor a partitioned block saved was modified in place after its forward; the block's "
                    "output cannot be made again in backward."
                )
            device = self.inputs[0].device.type if self.inputs else "cpu"
            with torch.no_grad(), torch.autocast(device, enabled=False):
                self.output = self.graph(*self.inputs)
        return self.output


class MadeAgain:
    """What autograd keeps instead of a saved tensor: how to make the tensor it views again (a partitioned block's
    tail call here; a recomputed module's output in :mod:`hf_ckpt.strategies.outside.hook`) and the saved view's geometry."""

    __slots__ = ("make", "size", "stride", "offset")

    def __init__(self, make: Callable[[], torch.Tensor], tensor: torch.Tensor) -> None:
        self.make = make
        self.size, self.stride, self.offset = tensor.size(), tensor.stride(), tensor.storage_offset()


#: Output storage -> [tail graph, weak references to its inputs, the output's version, dtype and bytes, a weak
#: reference to the call made of them once something saved the output, the key itself]. A key compares equal to a
#: new storage at the address of a freed one: an entry counts only while its own key is alive.
_noted: dict[Any, list] = {}


def register(output: torch.Tensor, graph: Any, inputs: list[torch.Tensor]) -> None:
    """Note that ``output`` is ``graph(*inputs)``, while it and the inputs live."""
    for key in [key for key in _noted if key.expired()]:
        del _noted[key]
    storage = storage_of(output)
    if storage is None:
        return
    key = StorageWeakRef(storage)
    _noted[key] = [graph, [weakref.ref(tensor) for tensor in inputs], version_counter(output), output.dtype,
                   storage.nbytes(), None, key]


def still_noted(tensor: torch.Tensor, key: Any, version: int, dtype: torch.dtype, nbytes: int) -> bool:
    """Whether ``tensor`` is still what was noted under ``key``: the noted storage alive (a key compares equal to a
    new storage at a freed one's address), unchanged in place since, same dtype and storage size."""
    return (not key.expired() and version_counter(tensor) == version and tensor.dtype == dtype
            and tensor.untyped_storage().nbytes() == nbytes)


def pack(tensor: torch.Tensor) -> Any:
    storage = storage_of(tensor)
    entry = _noted.get(StorageWeakRef(storage)) if storage is not None else None
    if entry is None:
        return tensor
    graph, refs, version, dtype, nbytes, made, key = entry
    if not still_noted(tensor, key, version, dtype, nbytes):
        return tensor
    call = made() if made is not None else None
    if call is None:
        inputs = [ref() for ref in refs]
        if any(value is None for value in inputs):
            return tensor
        call = _TailCall(graph, inputs)
        entry[5] = weakref.ref(call)
    return MadeAgain(call.made, tensor)


def unpack(value: Any) -> Any:
    """The saved tensor back: made again where :func:`pack` (or :mod:`hf_ckpt.strategies.outside.hook`) kept a recipe for it."""
    if not isinstance(value, MadeAgain):
        return value
    return value.make().as_strided(value.size, value.stride, value.offset)
