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
   the least recompute FLOPs. The profile's menu (per block, an option per strategy) goes to the one solver,
   :func:`hf_ckpt.planning.solver.solve`: dynamic programming over savings quantised *down* (so the predicted memory
   never understates), with ties going to fewer checkpointed blocks.
3. **Verify.** The chosen plan runs one more step and its retained bytes are measured; that figure is the plan's
   ``predicted_bytes``. Where blocks interact (on some releases a mask or position tensor is kept once more when
   checkpointed and plain blocks mix) and the plan overshoots, the solver is asked for the overshoot less, up to
   a few times.

The model is left as it was found: its checkpointing setting, training mode, gradients and the global RNG state.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hf_ckpt.planning.preserve import check_trainable
from hf_ckpt.planning.solver import BlockProfile, solve
from hf_ckpt.planning.solver import budget_bytes as _in_bytes
from hf_ckpt.runtime.target import target_model
from hf_ckpt.runtime.units import format_bytes as _mib
from hf_ckpt.runtime.units import parse_budget
from hf_ckpt.runtime.config import CheckpointConfig
from hf_ckpt.estimate import plan_for
from hf_ckpt.measure.step import LossFn
from hf_ckpt.strategies.oplevel.menu import plan_oplevel
from hf_ckpt.runtime.plans import CheckpointPlan, model_signature
from hf_ckpt.planning.profiling import measured_bytes, profile_blocks
from hf_ckpt.strategies import FINER_CHOICES, KIND_MODULES, PLANNER_CHOICES, strategy_class

__all__ = ["BlockProfile", "plan", "profile_blocks", "solve"]

#: How many times the planner measures a candidate plan and tightens its target before giving up.
_VERIFY_ROUNDS = 4



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
    ``batch_size`` and ``seq_len`` instead, from shapes alone (:func:`hf_ckpt.estimate.plan_for`: fake tensors,
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
            through backward, not the ``Trainer``'s step (see :func:`hf_ckpt.estimate.estimate`).
        **checkpoint_kwargs: Passed to ``torch.utils.checkpoint.checkpoint`` while profiling and kept for the plan's
            application.

    Returns:
        A :class:`~hf_ckpt.CheckpointPlan`; apply it with ``hf_ckpt.enable(model, plan=plan)``.

    Raises:
        TypeError: ``sample_inputs`` is not a dict; ``budget`` has the wrong type.
        ValueError: ``budget`` is out of range; no parameter requires grad; no assignment of the allowed
            strategies fits the budget (the message gives the smallest activation memory that can be reached).
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
    for kind in (s for s in strategies if s in KIND_MODULES):
        reason = strategy_class(kind).unavailable()
        if reason is not None:
            raise ValueError(f"strategies: {kind!r} cannot run here: {reason}")
    check_trainable(target_model(model), "plan: ")
    CheckpointConfig.from_arguments(checkpoint_kwargs, dict_name="checkpoint_kwargs", policy=policy,
                                    strategy="selective" if policy is not None else None)
    if set(FINER_CHOICES) & set(strategies):  # finer options: hf_ckpt.strategies.oplevel plans
        return plan_oplevel(model, sample_inputs, budget, strategies=strategies, policy=policy, loss_fn=loss_fn,
                            **checkpoint_kwargs)
    profile = profile_blocks(
        model, sample_inputs, strategies=strategies, policy=policy, loss_fn=loss_fn, **checkpoint_kwargs
    )
    budget_bytes = _in_bytes(budget, profile.baseline_bytes)
    target = budget_bytes
    for _ in range(_VERIFY_ROUNDS):
        chosen = solve(profile, target)
        measured = measured_bytes(model, chosen, sample_inputs, loss_fn, policy, dict(checkpoint_kwargs))
        if measured <= budget_bytes:
            break
        # Blocks interact a little on some releases (a mask or position tensor kept once more when checkpointed
        # and plain blocks mix): ask the solver for the overshoot less.
        target -= measured - budget_bytes
    else:
        raise ValueError(
            f"no plan fits a budget of {_mib(budget_bytes)}: the best plan found retains {_mib(measured)} when "
            f"measured ({100 * measured / profile.baseline_bytes:.1f}% of the {_mib(profile.baseline_bytes)} "
            "retained without checkpointing)"
        )
    return CheckpointPlan(
        strategies=chosen,
        predicted_bytes=measured,
        predicted_recompute_flops=profile.predicted_recompute_flops(chosen),
        baseline_bytes=profile.baseline_bytes,
        budget_bytes=budget_bytes,
        block_bytes=profile.retained,
        block_recompute_flops=profile.recompute_flops,
        model_type=getattr(getattr(target_model(model), "config", None), "model_type", None),
        made_for=model_signature(target_model(model)),
    )


def _check_sample_inputs(sample_inputs: Any) -> None:
    if not isinstance(sample_inputs, Mapping):
        raise TypeError(
            "sample_inputs must be a dict of keyword arguments for the model's forward, e.g. "
            f"{{'input_ids': ..., 'labels': ...}}; got {type(sample_inputs).__name__}"
        )
