"""The first training step after an enable, measured: which blocks did backward actually recompute?

hf_ckpt never infers what a model's code does with its checkpoint function from source text. Instead, after every
enable it arms a :class:`RecomputeProbe`: a :class:`~hf_ckpt.runtime.counting.BlockRunCounter` that stays on the model for
one training step. At the end of the first backward pass that reaches a block (an autograd-engine callback queued
from a gradient hook on a block's input), the blocks that ran during backward are compared with the configured
selection. When they differ (a stack that calls ``torch.utils.checkpoint`` itself, one that never checkpoints, one
that hands its checkpoint function a ``functools.partial`` or lambda the selection cannot see through, a forward
patched after class creation), one warning names the blocks, the setting and the reason, and from then on
:func:`hf_ckpt.checkpointed_layers` reports what was measured. Then every hook of the probe is removed: there is
no cost after the first step.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import nn

from hf_ckpt.runtime._torch import queue_backward_callback
from hf_ckpt.runtime.util.warn import warn_once
from hf_ckpt.runtime.blocks import Block, unwrapped
from hf_ckpt.runtime.counting import BlockRunCounter, in_backward, listeners


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling()


def _ranges(indices: tuple[int, ...] | list[int]) -> str:
    return "none" if not indices else str(list(indices))


class RecomputeProbe:
    """Measures the blocks recomputed in the first training step; reports through ``on_result(measured)``.

    Args:
        owner: The model warnings are counted against (one warning per model).
        blocks: The model's blocks.
        expected: The blocks the setting selects.
        setting: How the setting reads, for the warning.
        on_result: Called once with the measured blocks when the step ends, before the hooks go.
        stale: Called when the step ends: True where the setting was changed behind hf_ckpt's back since (it warns
            so itself); the probe then reports nothing, since what it measured is no longer the setting.
    """

    def __init__(
        self,
        owner: nn.Module,
        blocks: tuple[Block, ...],
        expected: tuple[int, ...],
        setting: str,
        on_result: Callable[[tuple[int, ...]], None],
        stale: Callable[[], bool] | None = None,
    ) -> None:
        self.owner = owner
        self.stale = stale
        self.expected = tuple(expected)
        self.setting = setting
        self.on_result = on_result
        self.counter = BlockRunCounter(owner, list(blocks))
        self.done = False
        self._queued = False
        self._armed = False

    # -- hooks, registered by the caller through its Hooks record ---------------------------------------------

    def watch(self, register: Callable[[nn.Module, str, Callable[..., Any]], None]) -> None:
        """Register the probe's hooks with ``register(module, "register_forward_pre_hook", function)``.

        Every hook is a bound method or a ``functools.partial`` of one, so a model with an armed probe pickles.
        """
        for block in self.counter.blocks:
            register(block.module, "register_forward_pre_hook", self._on_block_input)
            inner = unwrapped(block.module)  # below FSDP units and checkpoint wrappers, which a recompute skips
            watched = [m for m in inner.modules() if m is not inner] or [inner]
            for module in watched:
                register(module, "register_forward_pre_hook", functools.partial(self._count, block.index))
        listeners.add(self)  # partitioned blocks report their graph runs (hf_ckpt.runtime.counting.note_block_run)

    def block_ran(self, module: nn.Module) -> None:
        if self._armed and not _compiling():
            self.counter.block_ran(module)

    def _count(self, index: int, module: nn.Module, args: Any) -> None:
        if not self._armed or _compiling():
            return
        if self.counter._sentinels.setdefault(index, module) is module:
            self.counter.record(index)

    def _on_block_input(self, module: nn.Module, args: Any) -> None:
        # A training forward arms the probe. Grad mode is no test: reentrant checkpointing runs the block's forward
        # under no_grad. A run during backward is a recompute, never the start of a step.
        if self.done or _compiling() or not module.training or in_backward():
            return
        self._armed = True
        for value in args:
            if isinstance(value, torch.Tensor) and value.requires_grad:
                value.register_hook(self._on_gradient)
                return

    def _on_gradient(self, grad: torch.Tensor) -> None:
        if not self._queued and not self.done:
            self._queued = True
            queue_backward_callback(self._finish)

    def cancel(self) -> None:
        """Stop for good: the setting it measures was taken back (TRL disables and re-enables checkpointing
        between a forward and its backward). A callback already queued then reports nothing."""
        self.done = True
        listeners.discard(self)

    # -- the verdict -------------------------------------------------------------------------------------------

    def _finish(self) -> None:
        if self.done:
            return
        self.done = True
        listeners.discard(self)
        if self.stale is not None and self.stale():
            return
        measured = tuple(self.counter.recomputed_in_backward())
        if measured != self.expected:
            warn_once(
                f"Measured in the first training step: blocks {_ranges(measured)} were recomputed, but the setting "
                f"({self.setting}) selects blocks {_ranges(self.expected)}. {self._reason(measured)} "
                "hf_ckpt.checkpointed_layers() now reports the measured blocks.",
                key="measured-recompute",
                owner=self.owner,
            )
        self.on_result(measured)

    def _reason(self, measured: tuple[int, ...]) -> str:
        missing = sorted(set(self.expected) - set(measured))
        extra = sorted(set(measured) - set(self.expected))
        reasons = []
        if extra:
            reasons.append(
                f"Blocks {extra} are recomputed although not selected: the model's code checkpoints them itself "
                "(it calls torch.utils.checkpoint directly, or hands its checkpoint function a partial or lambda "
                "that does not say which block it runs), so the selection cannot take effect there."
            )
        if missing:
            reasons.append(
                f"Blocks {missing} are selected but were not recomputed: the model's forward never calls its "
                "checkpoint function for them (an upstream bug, or a forward replaced after the class was made)."
            )
        return " ".join(reasons)
