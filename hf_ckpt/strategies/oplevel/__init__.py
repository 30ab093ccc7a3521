"""Op-level activation budgets in eager mode: choose, op by op, which outputs each block keeps for backward.

Block-level plans choose per block between keeping everything (``none``), recomputing everything (``full``) and
one fixed selective policy. torch.compile's min-cut partitioner (functorch's ``activation_memory_budget``)
chooses per op, but only inside a compiled graph. This package does it in eager mode for any Hugging Face model:

* :func:`profile_ops` runs one block per block type under recording dispatch modes and finds, for every aten op
  occurrence, the bytes its output would keep and the FLOPs its recompute costs (:class:`BlockOpProfile`);
* :func:`frontier` finds the op sets that avoid the most recompute per byte kept (exact up to 16 candidate ops,
  within a stated bound beyond; see :mod:`hf_ckpt.strategies.oplevel.menu.frontier`);
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

from hf_ckpt.runtime.lazy import lazy_exports

#: Public name -> the module that defines it. Loaded on first use (PEP 562): plans and the checkpoint functions
#: need :class:`OpPolicy`, while the op-level planner builds on the core that uses them.
_EXPORTS = {
    "plan_oplevel": ".menu",
    "profile_ops": ".menu",
    "OpPolicy": ".policy",
    "op_key": ".policy",
    "BlockOpProfile": ".menu.profile",
    "OpRecord": ".menu.profile",
    "FrontierPoint": ".menu.frontier",
    "frontier": ".menu.frontier",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and the API docs: the same names, imported eagerly
    from hf_ckpt.strategies.oplevel.menu import plan_oplevel, profile_ops
    from hf_ckpt.strategies.oplevel.policy import OpPolicy, op_key
    from hf_ckpt.strategies.oplevel.menu.profile import BlockOpProfile, OpRecord
    from hf_ckpt.strategies.oplevel.menu.frontier import FrontierPoint, frontier


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
