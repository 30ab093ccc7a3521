"""``hf_ckpt.estimate``: will it fit? Training memory and recompute cost from a config, without allocating.

* :func:`estimate` -> :class:`MemoryEstimate`: parameter, gradient and optimizer-state bytes, activation bytes
  retained per checkpointing strategy, the predicted step peak and recompute FLOPs, for a config, a
  ``config.json`` or a model on the meta device. It traces one block per block type on fake tensors and scales.
* :func:`plan_for` -> :class:`~hf_ckpt.CheckpointPlan`: the cheapest per-block plan within a budget, solved by
  :func:`hf_ckpt.planner.solve` on the estimate's per-block profile (no sample batch, no real step).
* ``hf-ckpt estimate CONFIG --batch B --seq S`` (:mod:`hf_ckpt.estimate.command`) prints the table.
"""

from ._estimate import DEFAULT_STRATEGIES, estimate
from ._plan import plan_for, plan_from_estimate, profile_of, write_plan
from ._result import MemoryEstimate

__all__ = [
    "DEFAULT_STRATEGIES",
    "MemoryEstimate",
    "estimate",
    "plan_for",
    "plan_from_estimate",
    "profile_of",
    "write_plan",
]
