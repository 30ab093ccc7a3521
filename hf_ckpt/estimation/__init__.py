"""``hf_ckpt.estimation``: will it fit? Training memory and recompute cost from a config, without allocating.

* :func:`estimate` (also ``hf_ckpt.estimate``) -> :class:`MemoryEstimate`: parameter, gradient and
  optimizer-state bytes, activation bytes retained per checkpointing strategy, the predicted step peak and
  recompute FLOPs, for a config, a ``config.json`` or a model on the meta device. It traces one block per block
  type on fake tensors and scales.
* :func:`plan_for` -> :class:`~hf_ckpt.CheckpointPlan`: the cheapest per-block plan within a budget, the estimate's
  per-block profile through the one planning path (:func:`hf_ckpt.solver.verified.verified_plan`; no sample batch,
  no real step: the prediction is the measure).
  ``hf_ckpt.plan(config, batch_size=..., seq_len=..., budget=...)`` calls it.
* :func:`max_seq` -> :class:`MaxSeq`: the longest sequence for which some plan fits a device (and host) memory
  (``hf-ckpt estimate CONFIG --max-seq --device-memory SIZE [--host-memory SIZE]``).
* ``hf-ckpt estimate CONFIG --batch B --seq S`` (:mod:`hf_ckpt.cli.estimate`) prints the table.

Names load on first use (the command must not import torch for ``--help``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hf_ckpt.runtime.util.lazy import lazy_exports

_EXPORTS = {
    "DEFAULT_STRATEGIES": "._estimate",
    "estimate": "._estimate",
    "MemoryEstimate": "._result",
    "MaxSeq": "._max_seq",
    "max_seq": "._max_seq",
    "plan_for": "._plan",
    "plan_from_estimate": "._plan",
    "profile_of": "._plan",
    "write_plan": "._plan",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and the API docs: the same names, imported eagerly
    from hf_ckpt.estimation._estimate import DEFAULT_STRATEGIES, estimate
    from hf_ckpt.estimation._max_seq import MaxSeq, max_seq
    from hf_ckpt.estimation._plan import plan_for, plan_from_estimate, profile_of, write_plan
    from hf_ckpt.estimation._result import MemoryEstimate


#: Modules reached as attributes, loaded on first use: ``hf-ckpt estimate`` imports this package at its top (no
#: torch) and calls ``estimation._estimate.estimate`` and the like when it runs.
_SUBMODULES = ("_arguments", "_check", "_estimate", "_max_seq", "_plan")

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _SUBMODULES)
