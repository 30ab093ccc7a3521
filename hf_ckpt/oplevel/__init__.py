"""Op-level activation budgets in eager mode: choose, op by op, which outputs each block keeps for backward.

Block-level plans choose per block between keeping everything (``none``), recomputing everything (``full``) and
one fixed selective policy. torch.compile's min-cut partitioner (functorch's ``activation_memory_budget``)
chooses per op, but only inside a compiled graph. This package does it in eager mode for any Hugging Face model:

* :func:`profile_ops` runs one block per block type under recording dispatch modes and finds, for every aten op
  occurrence, the bytes its output would keep and the FLOPs its recompute costs (:class:`BlockOpProfile`);
* :func:`frontier` finds the op sets that avoid the most recompute per byte kept (exact up to 16 candidate ops,
  within a stated bound beyond; see :mod:`hf_ckpt.oplevel._solver`);
* :func:`plan_oplevel` (``hf_ckpt.plan(..., strategies=("none", "selective", "full", "oplevel"))``) chooses per
  block among those and the block-level strategies within a budget, and returns a
  :class:`~hf_ckpt.CheckpointPlan` whose ``policies`` name the kept op occurrences (``"aten.mm.default#3"``);
* :class:`OpPolicy` applies one through ``torch.utils.checkpoint.create_selective_checkpoint_contexts``.

Example::

    plan = hf_ckpt.plan(model, batch, 0.5, strategies=("none", "selective", "full", "oplevel"))
    plan.save("plan.json")                 # "strategies": ["oplevel:LlamaDecoderLayer-3", ...], "policies": {...}
    hf_ckpt.enable(model, plan="plan.json")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

#: Public name -> the module that defines it. Loaded on first use (PEP 562): plans and the checkpoint functions
#: need :class:`OpPolicy`, while the op-level planner builds on the core that uses them.
_EXPORTS = {
    "plan_oplevel": "._plan",
    "profile_ops": "._plan",
    "OpPolicy": "._policy",
    "op_key": "._policy",
    "BlockOpProfile": "._profile",
    "OpRecord": "._profile",
    "FrontierPoint": "._solver",
    "frontier": "._solver",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and the API docs: the same names, imported eagerly
    from ._plan import plan_oplevel, profile_ops
    from ._policy import OpPolicy, op_key
    from ._profile import BlockOpProfile, OpRecord
    from ._solver import FrontierPoint, frontier


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
