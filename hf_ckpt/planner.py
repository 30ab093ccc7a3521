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
   the least recompute FLOPs. It is solved exactly by dynamic programming over savings quantised *down* (so the
   predicted memory never understates), with ties going to fewer checkpointed blocks.
3. **Verify.** The chosen plan runs one more step and its retained bytes are measured; that figure is the plan's
   ``predicted_bytes``. Where blocks interact (on some releases a mask or position tensor is kept once more when
   checkpointed and plain blocks mix) and the plan overshoots, the solver is asked for the overshoot less, up to
   a few times.

The model is left as it was found: its checkpointing setting, training mode, gradients and the global RNG state.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Sequence

import torch
from torch import nn

from ._preserve import check_trainable, preserved
from ._state import suspended
from ._target import target_model
from ._units import format_bytes as _mib
from ._units import parse_budget
from ._solver import BlockProfile, solve
from .block_strategy import ALL_STRATEGIES
from .blocks import Block, find_blocks
from .config import CheckpointConfig
from .core import apply_config, remove
from .estimate import plan_for
from .measure.step import LossFn, loss_of, model_device
from .plans import CheckpointPlan, model_signature
from .selective import SelectiveRecomputeError
#: How many times the planner measures a candidate plan and tightens its target before giving up.
_VERIFY_ROUNDS = 4



def _loss_of(output: Any, loss_fn: LossFn | None) -> torch.Tensor:
    return loss_of(output, loss_fn, caller="plan: ", inputs="sample_inputs")


def _retained_per_block(model: nn.Module, blocks: list[Block], inputs: Mapping[str, Any], loss_fn: LossFn | None):
    """(base bytes, bytes per block) alive when forward returns, labelled by the block that created them."""
    from .measure.memory import StorageTracker

    current: list[int | None] = [None]
    handles = []
    for block in blocks:
        handles.append(block.module.register_forward_pre_hook(lambda m, a, i=block.index: current.__setitem__(0, i)))
        handles.append(block.module.register_forward_hook(lambda m, a, o: current.__setitem__(0, None)))
    try:
        with StorageTracker(label=lambda: current[0]) as tracker:
            loss = _loss_of(model(**inputs), loss_fn)
            by_block = tracker.live_bytes_by_label(str(model_device(model)))
            loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    return by_block.get(None, 0), tuple(by_block.get(block.index, 0) for block in blocks)


def _step_flops(model: nn.Module, inputs: Mapping[str, Any], loss_fn: LossFn | None) -> int:
    from .measure.flops import count_flops

    torch.manual_seed(0)
    model.zero_grad(set_to_none=True)
    with count_flops() as flops:
        _loss_of(model(**inputs), loss_fn).backward()
    return flops.total


def _twin_groups(blocks: list[Block]) -> list[list[int]]:
    """Blocks of the same class with parameters of the same shapes: they cost the same to recompute."""
    groups: dict[tuple, list[int]] = {}
    for block in blocks:
        shapes = tuple((name, tuple(p.shape)) for name, p in block.module.named_parameters())
        groups.setdefault((type(block.module), shapes), []).append(block.index)
    return list(groups.values())


def _recompute_flops_per_block(
    model: nn.Module, blocks: list[Block], strategy: str, config: dict[str, Any], inputs: Mapping[str, Any],
    loss_fn: LossFn | None, none_flops: int,
) -> tuple[int, ...]:
    """Each block's recompute FLOPs under ``strategy``: whole-step FLOPs with the strategy on one group of twin
    blocks, less the FLOPs without checkpointing, shared among the group. Whole-step totals are exact where
    per-module attribution of the recompute (which runs in backward) is not."""
    per_block = [0] * len(blocks)
    for group in _twin_groups(blocks):
        strategies = tuple(strategy if i in group else "none" for i in range(len(blocks)))
        remove(model)
        apply_config(model, CheckpointConfig.from_arguments(config, dict_name="checkpoint_kwargs", plan=CheckpointPlan(strategies)))
        extra = max(0, _step_flops(model, inputs, loss_fn) - none_flops)
        share, remainder = divmod(extra, len(group))
        for position, index in enumerate(group):
            per_block[index] = share + (1 if position < remainder else 0)
    return tuple(per_block)


@contextlib.contextmanager
def _left_as_found(model: nn.Module) -> Iterator[None]:
    """Profile in training mode with grad, then put everything back: the checkpointing attributes of every module
    (hf_ckpt's record and hooks, or upstream's flags), each module's training flag, accumulated gradients and the
    RNG state."""
    with preserved(model), suspended(target_model(model)), torch.enable_grad():
        model.train()
        yield


def _measured_bytes(
    model: nn.Module, strategies: tuple[str, ...], inputs: Mapping[str, Any], loss_fn: LossFn | None,
    policy: Any, checkpoint_kwargs: dict[str, Any],
) -> int:
    """Bytes the plan ``strategies`` retains at the end of forward, measured in one step."""
    blocks = find_blocks(target_model(model))
    with _left_as_found(model):
        remove(model)
        options = {"policy": policy} if "selective" in strategies else {}
        apply_config(model, CheckpointConfig.from_arguments(
            checkpoint_kwargs, dict_name="checkpoint_kwargs", plan=CheckpointPlan(strategies), **options
        ))
        torch.manual_seed(0)
        base, per_block = _retained_per_block(model, blocks, inputs, loss_fn)
    return base + sum(per_block)


def profile_blocks(
    model: nn.Module,
    sample_inputs: Mapping[str, Any],
    *,
    strategies: Sequence[str] = ("none", "full", "selective"),
    policy: Any = None,
    loss_fn: LossFn | None = None,
    **checkpoint_kwargs: Any,
) -> BlockProfile:
    """Measure each block's retained bytes and recompute FLOPs under each strategy (one step per strategy).

    A strategy the model cannot run (``"selective"`` on a block that writes into a saved output) is left out and
    listed in :attr:`BlockProfile.unusable` with the reason.
    """
    target = target_model(model)
    blocks = find_blocks(target)
    if not blocks:
        raise ValueError(f"{type(target).__name__} has no repeated blocks to plan for")
    retained: dict[str, tuple[int, ...]] = {}
    recompute: dict[str, tuple[int, ...]] = {}
    unusable: dict[str, str] = {}
    base_bytes = 0
    with _left_as_found(model):
        remove(model)
        none_flops = _step_flops(model, sample_inputs, loss_fn)
        for strategy in dict.fromkeys(("none", *strategies)):
            remove(model)
            options = {"policy": policy} if strategy == "selective" else {}
            if strategy != "none":
                apply_config(model, CheckpointConfig.from_arguments(
                    checkpoint_kwargs, dict_name="checkpoint_kwargs", strategy=strategy, **options
                ))
            try:
                torch.manual_seed(0)
                model.zero_grad(set_to_none=True)
                base, retained[strategy] = _retained_per_block(model, blocks, sample_inputs, loss_fn)
            except SelectiveRecomputeError as error:
                unusable[strategy] = str(error)
                continue
            if strategy == "none":
                base_bytes = base
                recompute[strategy] = (0,) * len(blocks)
            else:
                recompute[strategy] = _recompute_flops_per_block(
                    model, blocks, strategy, {**checkpoint_kwargs, **options}, sample_inputs, loss_fn, none_flops
                )
    return BlockProfile(base_bytes=base_bytes, retained=retained, recompute_flops=recompute, unusable=unusable)


def _budget_bytes(budget: float | int, baseline: int) -> int:
    """A budget already checked by :func:`hf_ckpt._units.parse_budget`, in bytes."""
    return int(budget * baseline) if isinstance(budget, float) else budget



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
    **checkpoint_kwargs: Any,
) -> CheckpointPlan:
    """Make the plan that fits ``budget`` at the least recompute.

    Two ways: with ``sample_inputs``, by profiling real steps of ``model`` on this machine; or, with
    ``batch_size`` and ``seq_len`` instead, from shapes alone (:func:`hf_ckpt.estimate.plan_for`: fake tensors,
    no allocation), so that ``model`` may be a config, a ``config.json`` path or a meta-device model that does not
    fit here. ``checkpoint_kwargs`` then go to the estimate (``dtype``, ``device``, ``optimizer``, ``peft_config``).

    Args:
        model: A ``PreTrainedModel`` (or PEFT model) on the device it will train on. It is left as found.
        sample_inputs: A representative batch (keyword arguments of the model, with labels so it returns a loss,
            or pass ``loss_fn``). Activation memory scales with batch and sequence length: profile the shapes
            you will train with.
        budget: Bytes (an int, or a string with a unit: ``"512MiB"``, ``"40GiB"``), or a fraction of the
            activation memory retained without checkpointing (a float in ``(0, 1]``, or ``"50%"``). Checked before
            any profiling.
        strategies: The strategies the plan may use.
        policy: The selective policy (see :mod:`hf_ckpt.selective`).
        loss_fn: Maps the model output to the scalar loss; default ``output.loss``.
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
        return plan_for(model, batch_size=batch_size, seq_len=seq_len, budget=budget, **checkpoint_kwargs)
    if batch_size is not None or seq_len is not None:
        raise ValueError("give either sample_inputs (profile real steps) or batch_size and seq_len (estimate), not both")
    budget = parse_budget(budget)
    _check_sample_inputs(sample_inputs)
    bad = [s for s in strategies if s not in ALL_STRATEGIES]
    if bad or not strategies or isinstance(strategies, str):
        raise ValueError(f"strategies must be a non-empty subset of none, selective, full; got {strategies!r}")
    check_trainable(target_model(model), "plan: ")
    CheckpointConfig.from_arguments(checkpoint_kwargs, dict_name="checkpoint_kwargs", policy=policy,
                                    strategy="selective" if policy is not None else None)
    profile = profile_blocks(
        model, sample_inputs, strategies=strategies, policy=policy, loss_fn=loss_fn, **checkpoint_kwargs
    )
    budget_bytes = _budget_bytes(budget, profile.baseline_bytes)
    target = budget_bytes
    for _ in range(_VERIFY_ROUNDS):
        chosen = solve(profile, target)
        measured = _measured_bytes(model, chosen, sample_inputs, loss_fn, policy, dict(checkpoint_kwargs))
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
