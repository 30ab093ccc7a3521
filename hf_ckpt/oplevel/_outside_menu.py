"""The planner's ``"outside"`` option: recompute the cheap modules between the blocks (:mod:`hf_ckpt._outside`).

:func:`outside_option` finds the modules (:func:`hf_ckpt._outside.cheap_modules`, one measured forward) and
measures, in one step with no block checkpointed, what recomputing them saves (bytes alive when forward returns)
and costs (FLOPs and elementwise output elements counted in backward). The solver sees it as one more row of the
menu, ``"none"`` (keep them: the saving is not made) or ``"outside"``, so it is chosen only where the saving buys
more than it costs.
"""

from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from .._target import target_model
from ..blocks import find_blocks
from ..plans import CheckpointPlan

#: One option: (strategy, bytes, recompute cost (FLOPs plus elementwise elements), overhead rank, recompute FLOPs).
Option = tuple[str, int, int, int, int]


def outside_option(model: nn.Module, sample_inputs: Mapping[str, Any], *, loss_fn: Any = None,
                   **checkpoint_kwargs: Any) -> tuple[tuple[str, ...], list[Option]]:
    """(module names, the menu row: keep them or recompute them), or ``((), [])`` when none qualifies or
    recomputing them saves nothing."""
    from .._apply import remove
    from .._outside import cheap_modules
    from ..profiling import apply_setting, left_as_found, measured_step

    target = target_model(model)
    blocks = find_blocks(target)
    with left_as_found(model):
        remove(model)
        names = cheap_modules(target, sample_inputs, blocks)
        if not names:
            return (), []
        measured = []
        for outside in ((), names):
            apply_setting(model, checkpoint_kwargs, plan=CheckpointPlan(("none",) * len(blocks), outside_blocks=outside))
            base, per_block, flops, elementwise = measured_step(model, blocks, sample_inputs, loss_fn)
            measured.append((base + sum(per_block), flops, elementwise))
        remove(model)
    (kept, flops, elementwise), (recomputed, outside_flops, outside_elementwise) = measured
    if recomputed >= kept:
        return (), []
    extra_flops = max(0, outside_flops - flops)
    extra = extra_flops + max(0, outside_elementwise - elementwise)
    return names, [("none", kept - recomputed, 0, 0, 0), ("outside", 0, extra, 1, extra_flops)]
