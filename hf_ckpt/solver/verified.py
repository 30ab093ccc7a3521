"""The one planning path: every planner solves its menu, verifies the candidate and records the plan here.

Every planner states its choices as a menu (per block, then any row of its own such as the modules between the
blocks: a list of :class:`~hf_ckpt.solver.knapsack.Option`; plus the bytes retained outside the rows) and hands it
to :func:`verified_plan` with how to make a candidate :class:`~hf_ckpt.CheckpointPlan` from the chosen option names,
how to measure it and what the plan records (:class:`PlanRecord`). The planners: ``hf_ckpt.plan`` on measured block
profiles (:mod:`hf_ckpt.planning.planner`, with the head chunked where the blocks are not enough), on its op-level,
partition and outside menus (:mod:`hf_ckpt.planning.menus.oplevel`), and the plans from an estimate
(:func:`hf_ckpt.estimation.plan_for`, :func:`~hf_ckpt.estimation.plan_from_estimate`, and so a budget planned at the first
training batch).

1. **Solve.** :func:`hf_ckpt.solver.knapsack.solve_menu`: the options of least recompute cost whose predicted bytes
   fit the budget less the slack (0 at first).
2. **Measure.** The candidate's retained bytes at the end of forward, measured in one real step by the planners that
   profile real steps; a plan from an estimate is measured by its prediction (no step runs), which the solver's
   choice always fits, so it takes one round.
3. **Tighten.** Where the measured bytes overshoot the budget (blocks interact a little on some releases: a mask or
   position tensor kept once more when checkpointed and plain blocks mix), the slack becomes the larger of the
   slack plus the overshoot (so that the next plan differs) and the prediction's error (measured less predicted),
   and the menu is solved again, up to :data:`VERIFY_ROUNDS` times; then no plan fits, and the error says what the
   best plan found retains.
4. **Record.** The candidate with the measured bytes as its ``predicted_bytes``, the chosen options' recompute
   FLOPs (plus the planner's extra, such as a chunked head's), and the planner's :class:`PlanRecord`: baseline,
   budget, per-block profile, model type, the model's signature (``made_for``); ``head_chunk_size``,
   ``policies`` and ``outside_blocks`` are the candidate's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from hf_ckpt.runtime.plans import CheckpointPlan, model_signature
from hf_ckpt.runtime.target import target_model
from hf_ckpt.runtime.util.units import format_bytes as _mib
from hf_ckpt.solver.knapsack import BlockProfile, Option, solve_menu

#: How many times a candidate plan is measured and the target tightened before no plan fits.
VERIFY_ROUNDS = 4


@dataclass(frozen=True)
class PlanRecord:
    """What a plan records besides its choice, as every planner records it.

    Attributes:
        baseline_bytes: Bytes retained without any checkpointing (the 100% of a fractional budget).
        block_bytes: The profile the plan was solved on: retained bytes of each block per strategy.
        block_recompute_flops: Recompute FLOPs of each block per strategy.
        model_type: ``config.model_type`` of the model planned for.
        made_for: The model's :func:`~hf_ckpt.runtime.plans.model_signature` (empty where there is no model, as
            for an estimate made from a config).
    """

    baseline_bytes: int
    block_bytes: Mapping[str, Sequence[int]]
    block_recompute_flops: Mapping[str, Sequence[int]]
    model_type: str | None = None
    made_for: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, profile: BlockProfile, model: Any = None, *, model_type: str | None = None) -> PlanRecord:
        """The record of the plans solved on ``profile`` (its head whole: its baseline is the plan's) for ``model``
        (a model, or a PEFT or wrapped one: its ``config.model_type`` and signature), or, without a model (an
        estimate made from a config), for ``model_type`` with no signature."""
        if model is None:
            return cls(profile.baseline_bytes, profile.retained, profile.recompute_flops, model_type)
        target = target_model(model)
        return cls(profile.baseline_bytes, profile.retained, profile.recompute_flops,
                   getattr(getattr(target, "config", None), "model_type", None), model_signature(target))

    def plan(self, candidate: CheckpointPlan, *, predicted_bytes: int, predicted_recompute_flops: int,
             budget_bytes: int) -> CheckpointPlan:
        """``candidate`` (its strategies, policies, outside modules and head chunk) with the figures recorded."""
        return dataclasses.replace(
            candidate,
            predicted_bytes=predicted_bytes,
            predicted_recompute_flops=predicted_recompute_flops,
            baseline_bytes=self.baseline_bytes,
            budget_bytes=budget_bytes,
            block_bytes=dict(self.block_bytes),
            block_recompute_flops=dict(self.block_recompute_flops),
            model_type=self.model_type,
            made_for=dict(self.made_for),
        )


def verified_plan(
    menu: Sequence[Sequence[Option]],
    base_bytes: int,
    budget_bytes: int,
    *,
    candidate: Callable[[tuple[str, ...]], CheckpointPlan],
    record: PlanRecord,
    measure: Callable[[CheckpointPlan], int] | None = None,
    extra_flops: int = 0,
    rounds: int = VERIFY_ROUNDS,
) -> CheckpointPlan:
    """The cheapest plan on ``menu`` whose bytes, measured, fit ``budget_bytes`` (see the module's docstring).

    Args:
        menu: Per row, its options (every row has a ``"none"`` option).
        base_bytes: Bytes retained outside the rows.
        budget_bytes: What the plan's measured bytes must fit.
        candidate: The plan to measure for the chosen option names (one per row).
        record: What the plan records besides its choice.
        measure: The candidate's retained bytes, measured; None: its prediction (a plan from an estimate).
        extra_flops: Recompute FLOPs the plan adds beyond its options' (a chunked head's).
        rounds: How many candidates to measure before no plan fits.

    Raises:
        ValueError: no assignment fits (the solver's message: the smallest memory reachable), or none of the
            ``rounds`` candidates does when measured.
    """
    slack, measured = 0, 0
    for _ in range(rounds):
        chosen = solve_menu(menu, base_bytes, budget_bytes - slack)
        options = [next(option for option in row if option.name == name) for row, name in zip(menu, chosen)]
        predicted = base_bytes + sum(option.retained for option in options)
        made = candidate(chosen)
        measured = predicted if measure is None else measure(made)
        if measured <= budget_bytes:
            flops = sum(option.flops for option in options) + extra_flops
            return record.plan(made, predicted_bytes=measured, predicted_recompute_flops=flops,
                               budget_bytes=budget_bytes)
        # at least the overshoot more, so that the next plan differs; at least the prediction's error
        slack = max(slack + measured - budget_bytes, measured - predicted)
    baseline = record.baseline_bytes
    raise ValueError(
        f"no plan fits a budget of {_mib(budget_bytes)}: the best plan found retains {_mib(measured)} when "
        f"measured ({100 * measured / baseline:.1f}% of the {_mib(baseline)} retained without checkpointing)"
    )
