"""Counting how often each block actually runs: the measured truth about what was recomputed.

Flags say what *should* happen; :class:`BlockRunCounter` says what *did*. For each block it watches the first
submodule the block calls (a forward pre-hook on every submodule), and counts how often that sentinel runs:
once per forward, once more per recompute. The sentinel is the first call of a block, so it is rerun even when
non-reentrant checkpointing stops the recompute early. Hooks on submodules, not on the block, are needed
because transformers >= 5.23 recomputes a block's ``forward`` directly, bypassing its ``__call__`` hooks; a block
without submodules is its own sentinel.

Each run is also classed by *when* it happened: a run while the autograd engine is executing a backward pass is a
recompute, whatever the number of forward passes in the window (gradient accumulation, several losses).
"""

from __future__ import annotations

import weakref
from collections import Counter
from typing import Any

from torch import nn

from hf_ckpt.runtime import _torch
from hf_ckpt.runtime.target import unwrap
from hf_ckpt.runtime.blocks import Block, find_blocks, unwrapped

#: Counters and probes watching now. They are told of block runs no submodule hook sees: a partitioned block runs
#: its forward and backward graphs instead of its submodules (:mod:`hf_ckpt.strategies.partition.graph`).
listeners: "weakref.WeakSet[Any]" = weakref.WeakSet()


def note_block_run(module: nn.Module) -> None:
    """Count one run of the block ``module`` for every watching counter: its forward graph ran, or (during
    backward) its backward graph ran and recomputed forward ops."""
    for listener in list(listeners):
        listener.block_ran(module)


def block_indices(blocks: list[Block]) -> dict[int, int]:
    """``id(module) -> block index`` for each block and the module below its wrappers."""
    indices = {id(block.module): block.index for block in blocks}
    indices.update({id(unwrapped(block.module)): block.index for block in blocks})
    return indices


def in_backward() -> bool:
    """Whether the autograd engine is running a backward pass on this thread now."""
    return _torch.in_backward()


class BlockRunCounter:
    """Context manager counting block runs in a window of forward/backward passes.

    Example::

        with BlockRunCounter(model) as runs:
            model(**batch).loss.backward()
        runs.recomputed()   # [0, 2, 4]: blocks that ran more than once in one step

    Args:
        model: A ``PreTrainedModel`` or any wrapper ``hf_ckpt`` accepts (PEFT, DDP, ...), or a plain module
            whose blocks :func:`~hf_ckpt.runtime.blocks.find_blocks` finds.
        blocks: The blocks to watch (default: all of the model's).

    Attributes:
        blocks: The watched blocks, in global order.
        counts: ``counts[i]`` is how many times block ``i`` ran in the window.
        backward_counts: ``backward_counts[i]`` is how many of those runs happened during a backward pass.
    """

    def __init__(self, model: nn.Module, blocks: list[Block] | None = None) -> None:
        self.blocks: list[Block] = list(blocks) if blocks is not None else find_blocks(unwrap(model))
        self.counts: Counter[int] = Counter()
        self.backward_counts: Counter[int] = Counter()
        self._indices = block_indices(self.blocks)
        self._sentinels: dict[int, nn.Module] = {}
        self._handles: list[Any] = []

    def _hook(self, index: int):
        def pre_hook(module: nn.Module, args: Any) -> None:
            if self._sentinels.setdefault(index, module) is module:
                self.record(index)

        return pre_hook

    def __enter__(self) -> "BlockRunCounter":
        for block in self.blocks:
            inner = unwrapped(block.module)  # below FSDP units and checkpoint wrappers, which a recompute skips
            watched = [m for m in inner.modules() if m is not inner] or [inner]
            hook = self._hook(block.index)
            self._handles.extend(m.register_forward_pre_hook(hook) for m in watched)
        listeners.add(self)
        return self

    def record(self, index: int) -> None:
        """Count one run of block ``index``, a recompute when the autograd engine is running a backward pass."""
        self.counts[index] += 1
        if in_backward():
            self.backward_counts[index] += 1

    def block_ran(self, module: nn.Module) -> None:
        """A run that no submodule hook sees (:func:`note_block_run`), of one of the watched blocks or not."""
        index = self._indices.get(id(module))
        if index is not None:
            self.record(index)

    def __exit__(self, *exc_info: Any) -> None:
        listeners.discard(self)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def reset(self) -> None:
        self.counts.clear()
        self.backward_counts.clear()

    def recomputed(self, forward_passes: int = 1) -> list[int]:
        """Blocks that ran more often than ``forward_passes``: those the backward recomputed."""
        return [block.index for block in self.blocks if self.counts[block.index] > forward_passes]

    def recomputed_in_backward(self) -> list[int]:
        """Blocks that ran at least once during a backward pass, however many forwards the window held."""
        return [block.index for block in self.blocks if self.backward_counts[block.index] > 0]
