"""A :class:`~hf_ckpt.CheckpointPlan` from an estimate: the planner's solver on the estimated per-block profile."""

from __future__ import annotations

import os
from typing import Any

from .._solver import BlockProfile, solve
from .._units import format_bytes, parse_budget
from ..plans import CheckpointPlan
from ._estimate import estimate
from ._result import MemoryEstimate

_PLANNED = ("none", "selective", "full")


def profile_of(estimate: MemoryEstimate) -> BlockProfile:
    """The estimate as the planner's :class:`~hf_ckpt.planner.BlockProfile` (none, selective, full per block)."""
    kept = [s for s in _PLANNED if s in estimate.block_bytes]
    return BlockProfile(
        base_bytes=estimate.base_bytes,
        retained={s: tuple(estimate.block_bytes[s]) for s in kept},
        recompute_flops={s: tuple(estimate.block_recompute_flops[s]) for s in kept},
        unusable=dict(estimate.unusable),
    )


def _activation_budget(estimate: MemoryEstimate, budget: Any, whole_step: bool) -> int:
    profile = profile_of(estimate)
    parsed = parse_budget(budget)
    if isinstance(parsed, float):
        if whole_step:
            raise ValueError("budget: with whole_step=True the budget is device memory: give a size such as 80GiB")
        return int(parsed * profile.baseline_bytes)
    if not whole_step:
        return parsed
    transient = max(estimate.transient_bytes.values())
    available = parsed - estimate.fixed_bytes - transient
    if available <= 0:
        raise ValueError(
            f"no plan fits a budget of {format_bytes(parsed)}: parameters, gradients and optimizer states alone "
            f"take {format_bytes(estimate.fixed_bytes)}, and the step's transients {format_bytes(transient)}"
            + _way_out(estimate)
        )
    return available


def _way_out(estimate: MemoryEstimate) -> str:
    if estimate.world_size > 1 and estimate.shard != "none":
        hint = " (per device, with the engine's buffers and gathers)"
        if estimate.shard.startswith("zero") and not estimate.offload_optimizer:
            hint += "; offload the optimizer (offload_optimizer, --offload-optimizer) or shard over more devices"
        return hint
    return "; shard them over devices (world_size and shard, --world-size and --shard)"


def plan_from_estimate(estimate: MemoryEstimate, budget: Any, *, whole_step: bool = False) -> CheckpointPlan:
    """The cheapest plan (least recompute FLOPs) whose predicted activation memory fits ``budget``.

    Args:
        estimate: A :class:`MemoryEstimate` (its ``block_bytes`` / ``block_recompute_flops`` are the profile).
        budget: Activation memory: a size (``"40GiB"``, or an int of bytes) or a fraction of what no
            checkpointing retains (``0.5``, ``"50%"``), as :func:`hf_ckpt._units.parse_budget` reads it. With
            ``whole_step=True`` a size is the device memory for the whole step (parameters, gradients, optimizer
            states and transients are subtracted first).
        whole_step: See ``budget``.

    Raises:
        ValueError: no plan fits; the message gives the smallest activation memory reachable.
    """
    profile = profile_of(estimate)
    budget_bytes = _activation_budget(estimate, budget, whole_step)
    chosen = solve(profile, budget_bytes)
    return CheckpointPlan(
        strategies=chosen,
        predicted_bytes=profile.predicted_bytes(chosen),
        predicted_recompute_flops=profile.predicted_recompute_flops(chosen),
        baseline_bytes=profile.baseline_bytes,
        budget_bytes=budget_bytes,
        block_bytes=profile.retained,
        block_recompute_flops=profile.recompute_flops,
        model_type=estimate.model_type,
    )


def plan_for(
    model_or_config: Any,
    *,
    batch_size: int,
    seq_len: int,
    budget: Any,
    whole_step: bool = False,
    **estimate_kwargs: Any,
) -> CheckpointPlan:
    """Make a plan from shapes alone: :func:`~hf_ckpt.estimate.estimate` then :func:`plan_from_estimate`.

    Args:
        model_or_config: As for :func:`~hf_ckpt.estimate.estimate`.
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
