"""A :class:`~hf_ckpt.CheckpointPlan` from an estimate: the estimated per-block profile's menu through the one planning
path (:func:`hf_ckpt.solver.verified.verified_plan`: the one solver, its prediction as the measure, the one record),
and the line ``hf-ckpt estimate`` prints on it (:func:`plan_line`)."""

from __future__ import annotations

import os
from typing import Any

from hf_ckpt.solver.knapsack import BlockProfile
from hf_ckpt.solver.verified import PlanRecord, verified_plan
from hf_ckpt.runtime.util.units import format_bytes, format_flops, parse_budget
from hf_ckpt.runtime.plans import CheckpointPlan
from hf_ckpt.strategies import ALL_STRATEGIES
from hf_ckpt.estimation._estimate import CHUNKED_HEAD_ROW, EVERY_BLOCK_ROW, estimate
from hf_ckpt.estimation._result import MemoryEstimate

_PLANNED = ("none", "selective", "full")


def profile_of(estimate: MemoryEstimate, chunked_head: bool | int = False) -> BlockProfile:
    """The estimate as the planner's :class:`~hf_ckpt.solver.knapsack.BlockProfile` (none, selective, full per block);
    with ``chunked_head``, the base (outside the blocks) of a step whose head is chunked (``True``: in chunks of
    ``estimate.head_chunk_size`` tokens; an int: in chunks of that many, one of the chunks the estimate traced)."""
    kept = [s for s in _PLANNED if s in estimate.block_bytes]
    chunk = _chunk(estimate, chunked_head)
    return BlockProfile(
        base_bytes=_head_figures(estimate, chunk)[0] if chunk else estimate.base_bytes,
        retained={s: tuple(estimate.block_bytes[s]) for s in kept},
        recompute_flops={s: tuple(estimate.block_recompute_flops[s]) for s in kept},
        unusable=dict(estimate.unusable),
    )


def step_held(estimate: MemoryEstimate, chunked_head: bool | int = False) -> int:
    """What the step's backward holds beside a plan's activations at its peak (:attr:`MemoryEstimate.held_above_bytes`),
    with the head whole, or chunked (as :func:`profile_of` reads ``chunked_head``)."""
    chunk = _chunk(estimate, chunked_head)
    return estimate.held_above_bytes[f"head:{chunk}" if chunk else ""]


def plan_peak(estimate: MemoryEstimate, activations: int, chunked_head: bool | int = False) -> int:
    """The step's peak with a plan retaining ``activations``: its backward, or the optimizer step."""
    return max(step_held(estimate, chunked_head) + activations, estimate.optimizer_step_peak_bytes)


def _chunk(estimate: MemoryEstimate, chunked_head: bool | int | None) -> int | None:
    return estimate.head_chunk_size if chunked_head is True else (chunked_head or None)


def _head_figures(estimate: MemoryEstimate, chunk: int) -> tuple[int, dict[str, int], int]:
    """(base bytes, transients per strategy, recompute FLOPs) of the head in chunks of ``chunk`` tokens: the
    estimate's default chunk, or the smaller one traced for budgets that need it."""
    if chunk == estimate.head_smaller_chunk_size:
        return (estimate.head_smaller_base_bytes, estimate.head_smaller_transient_bytes,
                estimate.head_smaller_recompute_flops)
    return estimate.head_base_bytes, estimate.head_transient_bytes, estimate.head_recompute_flops


def _activation_budget(estimate: MemoryEstimate, budget: Any, whole_step: bool, chunk: int | None,
                       transient_in_budget: bool) -> int:
    profile = profile_of(estimate)
    parsed = parse_budget(budget)
    freed = step_held(estimate) - step_held(estimate, chunk) if chunk and transient_in_budget else 0
    if isinstance(parsed, float):
        if whole_step:
            raise ValueError("budget: with whole_step=True the budget is device memory: give a size such as 80GiB")
        return int(parsed * profile.baseline_bytes)
    if not whole_step:
        return parsed + freed
    held = step_held(estimate, chunk or False)
    available = parsed - held
    if parsed < estimate.optimizer_step_peak_bytes:
        raise ValueError(
            f"no plan fits a budget of {format_bytes(parsed)}: the optimizer step alone takes "
            f"{format_bytes(estimate.optimizer_step_peak_bytes)} (parameters, gradients, optimizer states and the "
            "step's temporaries)" + _way_out(estimate))
    if available <= 0:
        raise ValueError(
            f"no plan fits a budget of {format_bytes(parsed)}: beside the activations the backward holds "
            f"{format_bytes(held)} (parameters, optimizer states, the gradients made by its peak and its "
            "transients)" + _way_out(estimate)
        )
    return available


def _way_out(estimate: MemoryEstimate) -> str:
    if estimate.world_size > 1 and estimate.shard != "none":
        hint = " (per device, with the engine's buffers and gathers)"
        if estimate.shard.startswith("zero") and not estimate.offload_optimizer:
            hint += "; offload the optimizer (offload_optimizer, --offload-optimizer) or shard over more devices"
        return hint
    return "; shard them over devices (world_size and shard, --world-size and --shard)"


def _plan(estimate: MemoryEstimate, budget: Any, whole_step: bool, chunk: int | None,
          transient_in_budget: bool) -> CheckpointPlan:
    profile = profile_of(estimate, chunk or False)
    budget_bytes = _activation_budget(estimate, budget, whole_step, chunk, transient_in_budget)
    return verified_plan(
        profile.menu(), profile.base_bytes, budget_bytes,
        candidate=lambda chosen: CheckpointPlan(chosen, head_chunk_size=chunk),
        record=PlanRecord.of(profile_of(estimate), model_type=estimate.model_type),
        extra_flops=_head_figures(estimate, chunk)[2] if chunk else 0,
    )


def plan_from_estimate(estimate: MemoryEstimate, budget: Any, *, whole_step: bool = False,
                       transient_in_budget: bool = False) -> CheckpointPlan:
    """The cheapest plan (least recompute FLOPs) whose predicted activation memory fits ``budget``.

    Where no plan fits and the estimate has the chunked head (``estimate.head_chunk_size``; not for a loop that
    keeps the outputs, which may read the logits), the plan is made for a step with the head chunked: its base
    (outside the blocks) and transients are smaller, its recompute FLOPs include the head's, and the plan
    carries ``head_chunk_size``. The head is chunked only when that is what makes the step fit: a training step
    with it returns no logits. The chunk is the estimate's (:func:`hf_ckpt.runtime.head.default_chunk_size`: at least 128
    tokens, or the sequence), or, where a whole-step budget needs smaller transients still, the memory rule's smaller
    chunk the estimate traced too (``estimate.head_smaller_chunk_size``).

    Args:
        estimate: A :class:`MemoryEstimate` (its ``block_bytes`` / ``block_recompute_flops`` are the profile).
        budget: Activation memory: a size (``"40GiB"``, or an int of bytes) or a fraction of what no
            checkpointing retains (``0.5``, ``"50%"``), as :func:`hf_ckpt.runtime.util.units.parse_budget` reads it. With
            ``whole_step=True`` a size is the device memory for the whole step (parameters, gradients, optimizer
            states and transients are subtracted first).
        whole_step: See ``budget``.
        transient_in_budget: A size budget was computed by subtracting the step's transients (unchunked) from
            the free memory (``budget="auto"``): a plan with the chunked head gets what its smaller transients
            leave.

    Raises:
        ValueError: no plan fits; the message gives the smallest activation memory reachable.
    """
    try:
        return _plan(estimate, budget, whole_step, None, transient_in_budget)
    except ValueError as error:
        if estimate.head_chunk_size is None or estimate.keep_outputs:
            raise
        unchunked = error
    for chunk in (c for c in (estimate.head_chunk_size, estimate.head_smaller_chunk_size) if c is not None):
        try:
            return _plan(estimate, budget, whole_step, chunk, transient_in_budget)
        except ValueError:
            continue
    raise unchunked from None


def plan_for(
    model_or_config: Any,
    *,
    batch_size: int,
    seq_len: int,
    budget: Any,
    whole_step: bool = False,
    **estimate_kwargs: Any,
) -> CheckpointPlan:
    """Make a plan from shapes alone: :func:`~hf_ckpt.estimation.estimate` then :func:`plan_from_estimate`.

    Args:
        model_or_config: As for :func:`~hf_ckpt.estimation.estimate`.
        batch_size: Sequences per step.
        seq_len: Tokens per sequence.
        budget: See :func:`plan_from_estimate` (``"40GiB"``, ``0.5``, ``"50%"``, bytes as an int).
        whole_step: The budget is the device memory for the whole step, not for activations only.
        **estimate_kwargs: ``dtype``, ``autocast``, ``device``, ``optimizer``, ``peft_config``, ``keep_outputs``
            (plan for a loop that keeps the model's outputs through backward) for the estimate.

    Returns:
        A :class:`~hf_ckpt.CheckpointPlan` to apply with ``hf_ckpt.enable(model, plan=plan)`` or save.
    """
    parse_budget(budget)  # bad budgets fail before the trace
    estimate_kwargs.pop("strategies", None)
    made = estimate(model_or_config, batch_size=batch_size, seq_len=seq_len,
                    strategies=("none", "full", "selective"), **estimate_kwargs)
    return plan_from_estimate(made, budget, whole_step=whole_step)


def write_plan(
    model_or_config: Any, path: str | os.PathLike, *, batch_size: int, seq_len: int, budget: Any, **kwargs: Any
) -> CheckpointPlan:
    """:func:`plan_for`, saved as JSON at ``path`` (what ``hf-ckpt plan --config ... --json plan.json`` does)."""
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    if not os.path.isdir(folder):
        raise ValueError(f"path: the folder {folder!r} does not exist")
    made = plan_for(model_or_config, batch_size=batch_size, seq_len=seq_len, budget=budget, **kwargs)
    made.save(path)
    return made


def _row_of(plan: CheckpointPlan, made: MemoryEstimate) -> str | None:
    """The table's row for the same setting as ``plan``: every block on one strategy (and the head as the row's)."""
    kinds = set(plan.strategies)
    if len(kinds) != 1:
        return None
    (kind,) = kinds
    if plan.head_chunk_size is not None:
        kind = f"{CHUNKED_HEAD_ROW}{plan.head_chunk_size}" if kind == EVERY_BLOCK_ROW else ""
    return kind if kind in made.activation_bytes else None


def plan_line(plan: CheckpointPlan, made: MemoryEstimate) -> str:
    """``hf-ckpt estimate``'s line on the plan that fits: its table row's figures where the table has the same setting
    (one figure per setting), else the solver's, each block counted at its largest whatever its neighbours run, as
    the line says."""
    counts = {s: plan.strategies.count(s) for s in ALL_STRATEGIES}
    head = "" if plan.head_chunk_size is None else f", head in chunks of {plan.head_chunk_size} tokens"
    row = _row_of(plan, made)
    if row is not None:
        activations, peak = made.activation_bytes[row], made.peak_bytes[row]
        recompute, ratio, source = made.recompute_flops[row], made.flops_ratio[row], f" (the table's row {row})"
    else:
        activations, recompute = plan.predicted_bytes, plan.predicted_recompute_flops
        ratio = (made.step_flops["none"] + recompute) / made.step_flops["none"]
        peak = plan_peak(made, activations, plan.head_chunk_size or False)
        source = " (activations: each block at its most, whatever its neighbours run)"
    return (f"cheapest plan that fits: {counts['full']} full, {counts['selective']} selective, {counts['none']} none"
            f"{head}; "
            f"activations {format_bytes(activations)}, peak {format_bytes(peak)}"
            f"{' per device' if made.shard != 'none' else ''}, recompute {format_flops(recompute)}"
            f", FLOPs ratio {ratio:.3f}x{source}")
