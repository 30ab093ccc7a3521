"""``hf_ckpt.plan``: the cheapest per-block checkpointing plan that fits an activation-memory budget.

Upstream offers all blocks or every n-th one. The planner measures, in one profiling step per strategy, what each
block retains at the end of forward and what its recompute costs, then picks a strategy per block
(``"none"``, ``"selective"``, ``"full"``) that meets the budget at the least recompute:

1. **Profile.** For each strategy, every block is switched to it and one training step runs on the sample inputs.
   A :class:`~hf_ckpt.measure.StorageTracker` labels each storage with the block that created it, so the bytes
   alive when forward returns split per block (what is created outside the blocks, embeddings and head, is the
   fixed base). Recompute cost is counted by ``FlopCounterMode`` over whole steps: one step per strategy and
   group of twin blocks (same class, same parameter shapes: all decoder layers of a Llama, the encoder and the
   decoder blocks of a T5), less the step without checkpointing, shared among the group.
2. **Solve.** Retained bytes add up over blocks (a block's retention depends on its own strategy only: its output
   is kept whatever the next block does), so the plan is a multiple-choice knapsack: reach the required savings at
   the least recompute FLOPs. The profile's menu (per block, an option per strategy) goes through the one planning
   path of every planner, :func:`hf_ckpt.solver.verified.verified_plan`, to the one solver,
   :func:`hf_ckpt.solver.knapsack.solve_menu`: a Pareto front over the options' exact bytes, block by block (so the
   predicted memory never understates), with ties going to fewer checkpointed blocks.
3. **The head, when blocks are not enough.** Where no assignment fits and the model is a causal LM whose head can
   run in checkpointed chunks (``head_chunk_size``; the sample has ``labels`` by keyword and no ``loss_fn`` is
   given, which might read the logits), one more step measures the base with the head chunked (the full logits and
   their copy for the loss are then not retained) and one the FLOPs its recompute adds; the plan is solved again
   on that base and carries ``head_chunk_size`` (:func:`hf_ckpt.runtime.head.default_chunk_of`, the estimator's rule).
   Where blocks alone fit, the head is left whole and nothing more is measured.
4. **Verify.** The chosen plan runs one more step and its retained bytes are measured; that figure is the plan's
   ``predicted_bytes``. Where blocks interact (on some releases a mask or position tensor is kept once more when
   checkpointed and plain blocks mix) and the plan overshoots, the solver is asked for less, up to a few times:
   the one verification loop and the one plan record (``made_for``, ``head_chunk_size``) of
   :func:`~hf_ckpt.solver.verified.verified_plan`, which the op-level planner and the plans from an estimate share.

The model is left as it was found: its checkpointing setting, training mode, gradients and the global RNG state.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import torch

from hf_ckpt.planning.preserve import check_trainable
from hf_ckpt.solver.knapsack import BlockProfile, solve
from hf_ckpt.solver.knapsack import budget_bytes as _in_bytes
from hf_ckpt.solver.verified import PlanRecord, verified_plan
from hf_ckpt.runtime.target import target_model
from hf_ckpt.runtime.util.units import format_bytes as _mib
from hf_ckpt.runtime.util.units import parse_budget
from hf_ckpt.runtime.request import EnableRequest
from hf_ckpt.estimation import plan_for
from hf_ckpt.meters.step import LossFn
from hf_ckpt.planning.menus.oplevel import plan_oplevel
from hf_ckpt.runtime.plans import CheckpointPlan
from hf_ckpt.planning.profiling import measured_bytes, profile_blocks, profile_chunked_head
from hf_ckpt.strategies import FINER_CHOICES, PLANNER_CHOICES, kinds, strategy_class
from hf_ckpt.runtime import head as _head

__all__ = ["BlockProfile", "plan", "profile_blocks", "solve"]


def plan(
    model: Any,
    sample_inputs: Mapping[str, Any] | None = None,
    budget: int | float | str | None = None,
    *,
    batch_size: int | None = None,
    seq_len: int | None = None,
    strategies: Sequence[str] = ("none", "selective", "full"),
    policy: Any = None,
    loss_fn: LossFn | None = None,
    keep_outputs: bool = False,
    **checkpoint_kwargs: Any,
) -> CheckpointPlan:
    """Make the plan that fits ``budget`` at the least recompute.

    Two ways: with ``sample_inputs``, by profiling real steps of ``model`` on this machine; or, with
    ``batch_size`` and ``seq_len`` instead, from shapes alone (:func:`hf_ckpt.estimation.plan_for`: fake tensors,
    no allocation), so that ``model`` may be a config, a ``config.json`` path or a meta-device model that does not
    fit here. ``checkpoint_kwargs`` then go to the estimate (``dtype``, ``autocast``, ``device``, ``optimizer``,
    ``peft_config``; ``world_size``, ``shard``, ``offload_optimizer``, ``offload_parameters`` for the states per
    device under FSDP or ZeRO; ``whole_step=True`` to read ``budget`` as the device's memory).

    Args:
        model: A ``PreTrainedModel`` (or PEFT model) on the device it will train on. It is left as found.
        sample_inputs: A representative batch (keyword arguments of the model, with labels so it returns a loss,
            or pass ``loss_fn``). Activation memory scales with batch and sequence length: profile the shapes
            you will train with.
        budget: Bytes (an int, or a string with a unit: ``"512MiB"``, ``"40GiB"``), or a fraction of the
            activation memory retained without checkpointing (a float in ``(0, 1]``, or ``"50%"``). Checked before
            any profiling.
        strategies: The strategies the plan may use; add ``"oplevel"`` to let it choose, per block, which single
            ops keep their outputs (:mod:`hf_ckpt.strategies.oplevel`), and ``"partition"`` to let it split blocks' graphs
            with torch's min-cut partitioner at one of several budgets, run in eager mode (``"partition:<F>"``, and
            ``"partition:<F>:norms"`` where blocks have layer norms or softmaxes it may then recompute too),
            and ``"outside"`` to let it recompute cheap modules between the blocks (final norm, rotary tables,
            embeddings, a head's activation and norm) instead of keeping their tensors (``outside_blocks``).
        policy: The selective policy (see :mod:`hf_ckpt.strategies.selective.policy`).
        loss_fn: Maps the model output to the scalar loss; default ``output.loss``.
        keep_outputs: With ``batch_size`` and ``seq_len``: plan for a loop that keeps the model's outputs alive
            through backward, not the ``Trainer``'s step (see :func:`hf_ckpt.estimation.estimate`).
        **checkpoint_kwargs: Passed to ``torch.utils.checkpoint.checkpoint`` while profiling and kept for the plan's
            application.

    Returns:
        A :class:`~hf_ckpt.CheckpointPlan`; apply it with ``hf_ckpt.enable(model, plan=plan)``. Where no plan of
        the blocks fits but one with a causal LM's head and loss in checkpointed chunks does (measured on
        ``sample_inputs``), the plan carries ``head_chunk_size``: its training steps then return no logits.

    Raises:
        TypeError: ``sample_inputs`` is not a dict; ``budget`` has the wrong type.
        ValueError: ``budget`` is out of range; no parameter requires grad; no assignment of the allowed
            strategies fits the budget, even with the head chunked (the message gives the smallest activation
            memory that can be reached, with and without it).
    """
    if budget is None:
        raise TypeError("plan() needs a budget: bytes (int or '40GiB'), or a fraction (0.5 or '50%')")
    if sample_inputs is None and (batch_size is not None or seq_len is not None):
        return plan_for(model, batch_size=batch_size, seq_len=seq_len, budget=budget, keep_outputs=keep_outputs,
                        **checkpoint_kwargs)
    if keep_outputs is not False:
        raise ValueError("keep_outputs applies to a plan from shapes (batch_size and seq_len): with sample_inputs "
                         "the plan is profiled on real steps, which keep only the loss")
    if batch_size is not None or seq_len is not None:
        raise ValueError("give either sample_inputs (profile real steps) or batch_size and seq_len (estimate), not both")
    budget = parse_budget(budget)
    _check_sample_inputs(sample_inputs)
    bad = [s for s in strategies if s not in PLANNER_CHOICES]
    if bad or not strategies or isinstance(strategies, str):
        raise ValueError(f"strategies must be a non-empty subset of {', '.join(PLANNER_CHOICES)}; got {list(strategies)}")
    for kind in (s for s in strategies if s in kinds()):
        reason = strategy_class(kind).unavailable()
        if reason is not None:
            raise ValueError(f"strategies: {kind!r} cannot run here: {reason}")
    check_trainable(target_model(model), "plan: ")
    EnableRequest.parse(checkpoint_kwargs, "checkpoint_kwargs", takes_budget=False, policy=policy,
                        strategy="selective" if policy is not None else None)  # checked as enable checks them
    if set(FINER_CHOICES) & set(strategies):  # finer options: hf_ckpt.strategies.oplevel plans
        return plan_oplevel(model, sample_inputs, budget, strategies=strategies, policy=policy, loss_fn=loss_fn,
                            **checkpoint_kwargs)
    return _plan_blocks(model, sample_inputs, budget, strategies=strategies, policy=policy, loss_fn=loss_fn,
                        checkpoint_kwargs=checkpoint_kwargs)


def _plan_blocks(model: Any, sample_inputs: Mapping[str, Any], budget: int | float, *, strategies: Sequence[str],
                 policy: Any, loss_fn: LossFn | None, checkpoint_kwargs: dict[str, Any]) -> CheckpointPlan:
    """The block-level plan: the profile's menu through the one planning path
    (:func:`hf_ckpt.solver.verified.verified_plan`), again with the head chunked where the blocks are not enough."""
    profile = profile_blocks(
        model, sample_inputs, strategies=strategies, policy=policy, loss_fn=loss_fn, **checkpoint_kwargs
    )
    budget_bytes = _in_bytes(budget, profile.baseline_bytes)
    record = PlanRecord.of(profile, model)

    def verified(on: BlockProfile, chunk: int | None, head_flops: int) -> CheckpointPlan:
        """The cheapest plan on ``on`` (the head in chunks of ``chunk`` tokens, or whole) that fits, measured."""
        return verified_plan(
            on.menu(), on.base_bytes, budget_bytes, record=record, extra_flops=head_flops,
            candidate=lambda chosen: CheckpointPlan(chosen, head_chunk_size=chunk),
            measure=lambda candidate: measured_bytes(model, candidate, sample_inputs, loss_fn, policy,
                                                     dict(checkpoint_kwargs)),
        )

    try:
        return verified(profile, None, 0)
    except ValueError as error:
        chunk = _head_chunk(model, sample_inputs, loss_fn)
        if chunk is None:
            raise
        base, head_flops = profile_chunked_head(model, sample_inputs, chunk, loss_fn, **checkpoint_kwargs)
        chunked = dataclasses.replace(profile, base_bytes=base)
        try:
            return verified(chunked, chunk, head_flops)
        except ValueError:
            raise ValueError(f"{error}; with the head in chunks of {chunk} tokens (head_chunk_size), the smallest "
                             f"is {_mib(_smallest(chunked))}") from None


def _smallest(profile: BlockProfile) -> int:
    """The least activation memory a plan reaches on ``profile``."""
    return profile.base_bytes + sum(min(retained[i] for retained in profile.retained.values())
                                    for i in range(len(profile.retained["none"])))


def _head_chunk(model: Any, sample_inputs: Mapping[str, Any], loss_fn: LossFn | None) -> int | None:
    """The chunk (tokens) to plan the head with where blocks are not enough: :func:`hf_ckpt.runtime.head.default_chunk_of`
    at the shape of the sample's labels (its floor, never smaller: what a step retains at the end of forward does
    not depend on the chunk); None where the head cannot be chunked (the model refuses it, a ``loss_fn`` may read
    the logits, the labels are not given by keyword)."""
    target = target_model(model)
    labels = sample_inputs.get("labels")
    if loss_fn is not None or not isinstance(labels, torch.Tensor) or labels.dim() < 1 or labels.numel() == 0:
        return None
    if _head.refusal(target) is not None:
        return None
    seq_len = labels.shape[-1]
    return _head.default_chunk_of(target.config, labels.numel() // seq_len, seq_len)


def _check_sample_inputs(sample_inputs: Any) -> None:
    if not isinstance(sample_inputs, Mapping):
        raise TypeError(
            "sample_inputs must be a dict of keyword arguments for the model's forward, e.g. "
            f"{{'input_ids': ..., 'labels': ...}}; got {type(sample_inputs).__name__}"
        )
