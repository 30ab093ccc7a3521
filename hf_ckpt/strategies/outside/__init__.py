"""A plan's ``outside_blocks``: the cheap modules between the blocks, recomputed in backward instead of keeping their
outputs; ``hook`` is its runtime (the one saved-tensor hook, registered with the runtime below; the planner's option
is :mod:`hf_ckpt.planning.menus.outside`). No kind, on purpose: a plan carries it as ``outside_blocks``, so plans'
JSON stays as it is and ``CheckpointPlan(("outside",))`` stays an error."""

from __future__ import annotations

from typing import Any

from hf_ckpt.runtime import extensions

OUTSIDE = "outside"


@extensions.register_saved_tensor_hook
def _hook() -> Any:
    from hf_ckpt.strategies.outside import hook  # deferred: the hook (and torch) loads only for plans that use it

    return hook
