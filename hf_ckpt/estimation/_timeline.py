"""The step as a timeline: forward, the head's and each block's backward, the optimizer step; first and steady.

A real step does not hold its worst moments at once. After ``zero_grad(set_to_none=True)`` (the ``Trainer``'s) the
gradients appear during backward while the activations they needed are freed, and the optimizer's states exist
only from the first ``step()``. So the device holds, above the parameters:

* at the end of forward, the activations and the loss's temporaries (the logits' float32 copies);
* in backward, what the trace's :class:`~hf_ckpt.estimation._trace.StepTimeline` says for the head and loss, then
  for each block from the last to the first: the activations of it and the blocks before it, the gradients of
  the head and the blocks after it, and its own rise (its recompute, its gradients appearing); plus, in every step
  after the first, the optimizer's states;
* in the optimizer step: the gradients, the states (allocated by the first step) and the step's temporaries.

With gradient accumulation the later micro-batches run with every gradient held, and sharded engines keep their
gradient buffers and (DeepSpeed) their states from the start: there the backward counts the gradients whole and
the first step as the steady one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from hf_ckpt.estimation._trace import StepTimeline

#: Where a step's peak falls, as the estimate says it.
OPTIMIZER_STEP = "the optimizer step"
HEAD_BACKWARD = "the backward of the head and loss"
FORWARD_LOSS = "the forward's loss"
WHOLE_GRADIENTS = "backward, gradients held whole"


@dataclass(frozen=True)
class StepPeaks:
    """The device's peak in a steady step and in the first step, and where the steady one falls."""

    steady: int
    first: int
    where: str


def backward_held(lines: Sequence[StepTimeline | None], base: int, block_bytes: Sequence[int],
                  representative: Sequence[int], back: Sequence[int] | None = None) -> tuple[int, str] | None:
    """The most the backward holds above the parameters and optimizer states (activations, transients, gradients
    made so far), and where; ``lines[i]``: the timeline of block ``i``'s strategy; ``base`` and ``block_bytes``:
    what forward retains outside the blocks and in each; ``back[i]``: what an activation offload brings back to the device for block ``i``
    (held through its backward and the next one's, as the overlapped copy does). None where a timeline is
    missing."""
    if not lines or any(line is None for line in lines):
        return None
    head_rise = max(line.head_rise for line in lines)
    backward_base = max(line.backward_base for line in lines)
    grads_above = max(line.head_grads for line in lines)
    below = sum(block_bytes)
    best, where = base + below + head_rise, HEAD_BACKWARD
    forward = base + below + max(line.forward_rise for line in lines)
    if forward > best:
        best, where = forward, FORWARD_LOSS
    for i in reversed(range(len(block_bytes))):
        traced = representative[i]
        value = backward_base + below + grads_above + lines[i].block_rises[traced]
        if back:
            value += back[i] + (back[i - 1] if i > 0 else 0)
        if value > best:
            best, where = value, f"the backward of block {i}"
        below -= block_bytes[i]
        grads_above += lines[i].block_grads[traced]
    return best, where


def step_peaks(states: Any, activation: int, transient: int, backward: tuple[int, str] | None,
               accumulation: int, kept: int = 0) -> StepPeaks:
    """The peaks of a row: ``activation`` and ``transient`` as the trace gives them (the transient with every
    gradient held), ``backward`` from :func:`backward_held`; ``states``: the
    :class:`~hf_ckpt.estimation._sharding.PerDevice` states, whose ``step_peak_bytes`` is the optimizer step, with
    ``kept`` (outputs a loop holds through it) on top."""
    step = states.step_peak_bytes + kept
    if states.sharded is not None or backward is None or accumulation > 1:
        whole = states.peak_fixed_bytes + activation + transient
        first = whole if states.sharded is not None else whole - states.optimizer_bytes
        return StepPeaks(max(whole, step), max(first, step), OPTIMIZER_STEP if step >= whole else WHOLE_GRADIENTS)
    held, where = backward
    steady = states.parameters_bytes + states.optimizer_bytes + held
    first = states.parameters_bytes + held
    return StepPeaks(max(steady, step), max(first, step), OPTIMIZER_STEP if step >= steady else where)


def held_above(lines: Sequence[StepTimeline | None], base: int, representative: Sequence[int]) -> int | None:
    """The most the backward holds above a plan's activations (``base``, what forward retains outside the blocks,
    included), parameters and states left out, for any plan that mixes the strategies of ``lines`` (a planner's
    constraint: each block phase counts every activation, an upper bound). None where a timeline is missing."""
    if not lines or any(line is None for line in lines):
        return None
    traced = range(len(lines[0].block_rises))
    rises = [max(line.block_rises[j] for line in lines) for j in traced]
    grads_above = max(line.head_grads for line in lines)
    block = 0
    for i in reversed(range(len(representative))):  # the backward's order: the last block first
        block = max(block, grads_above + rises[representative[i]])
        grads_above += lines[0].block_grads[representative[i]]
    backward_base = max(line.backward_base for line in lines) - base
    head = max(max(line.head_rise for line in lines), max(line.forward_rise for line in lines))
    return max(head, backward_base + block)
