"""Counting how often each block actually runs: the measured truth about what was recomputed.

Flags say what *should* happen; :class:`BlockRunCounter` says what *did*. For each block it watches the first
submodule the block calls (a forward pre-hook on every submodule), and counts how often that sentinel runs:
once per forward, once more per recompute. The sentinel is the first call of a block, so it is rerun even when
non-reentrant checkpointing stops the recompute early. Hooks on submodules, not on the block, are needed
because transformers >= 5.23 recomputes a block's ``forward`` directly, bypassing its ``__call__`` hooks.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch import nn

from .blocks import Block, find_blocks


class BlockRunCounter:
    """Context manager counting block runs in a window of forward/backward passes.

    Example::

        with BlockRunCounter(model) as runs:
            model(**batch).loss.backward()
        runs.recomputed()   # [0, 2, 4]: blocks that ran more than once in one step

    Attributes:
        blocks: The model's blocks, in global order.
        counts: ``counts[i]`` is how many times block ``i`` ran in the window.
    """

    def __init__(self, model: nn.Module) -> None:
        from ._compat import peft_model_base

        base = peft_model_base(model)
        self.blocks: list[Block] = find_blocks(base if base is not None else model)
        self.counts: Counter[int] = Counter()
        self._sentinels: dict[int, nn.Module] = {}
        self._handles: list[Any] = []

    def _hook(self, index: int, submodule: nn.Module):
        def pre_hook(module: nn.Module, args: Any) -> None:
            sentinel = self._sentinels.setdefault(index, module)
            if sentinel is module:
                self.counts[index] += 1

        return pre_hook

    def __enter__(self) -> "BlockRunCounter":
        for block in self.blocks:
            for submodule in block.module.modules():
                if submodule is not block.module:
                    self._handles.append(submodule.register_forward_pre_hook(self._hook(block.index, submodule)))
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def reset(self) -> None:
        self.counts.clear()

    def recomputed(self, forward_passes: int = 1) -> list[int]:
        """Blocks that ran more often than ``forward_passes``: those the backward recomputed."""
        return [block.index for block in self.blocks if self.counts[block.index] > forward_passes]
