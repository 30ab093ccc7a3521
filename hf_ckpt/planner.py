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
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch import nn

from .blocks import Block, find_blocks
from .config import CheckpointConfig
from .core import _STATE_ATTRIBUTE, _target_model, apply_config, remove
from .plans import CheckpointPlan
from .selective import SelectiveRecomputeError

LossFn = Callable[[Any], torch.Tensor]
_QUANTA = 4096
#: How many times the planner measures a candidate plan and tightens its target before giving up.
_VERIFY_ROUNDS = 4


@dataclass(frozen=True)
class BlockProfile:
    """What each block retains and recomputes under each strategy, measured on one batch.

    Attributes:
        base_bytes: Bytes retained at the end of forward by storages created outside the blocks.
        retained: ``retained[strategy][i]``: bytes block ``i`` retains at the end of forward.
        recompute_flops: ``recompute_flops[strategy][i]``: FLOPs block ``i`` spends recomputing in backward.
        unusable: Strategies that could not run on this model, with the reason.
    """

    base_bytes: int
    retained: dict[str, tuple[int, ...]]
    recompute_flops: dict[str, tuple[int, ...]]
    unusable: dict[str, str]

    @property
    def baseline_bytes(self) -> int:
        """Bytes retained without any checkpointing."""
        return self.base_bytes + sum(self.retained["none"])

    def predicted_bytes(self, strategies: Sequence[str]) -> int:
        return self.base_bytes + sum(self.retained[s][i] for i, s in enumerate(strategies))

    def predicted_recompute_flops(self, strategies: Sequence[str]) -> int:
        return sum(self.recompute_flops[s][i] for i, s in enumerate(strategies))


def _loss_of(output: Any, loss_fn: LossFn | None) -> torch.Tensor:
    from .measure.step import loss_of

    return loss_of(output, loss_fn, caller="plan: ", inputs="sample_inputs")


def _retained_per_block(model: nn.Module, blocks: list[Block], inputs: Mapping[str, Any], loss_fn: LossFn | None):
    """(base bytes, bytes per block) alive when forward returns, labelled by the block that created them."""
    from .measure.memory import StorageTracker
    from .measure.step import model_device

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
    """Profile in training mode, then restore the model's checkpointing, mode, gradients and the RNG state."""
    target = _target_model(model)
    previous = target.__dict__.get(_STATE_ATTRIBUTE)
    was_training = model.training
    try:
        with torch.random.fork_rng(devices=[]):
            model.train()
            yield
    finally:
        remove(model)
        model.zero_grad(set_to_none=True)
        if previous is not None:
            apply_config(model, previous.config)
        model.train(was_training)


def _measured_bytes(
    model: nn.Module, strategies: tuple[str, ...], inputs: Mapping[str, Any], loss_fn: LossFn | None,
    policy: Any, checkpoint_kwargs: dict[str, Any],
) -> int:
    """Bytes the plan ``strategies`` retains at the end of forward, measured in one step."""
    blocks = find_blocks(_target_model(model))
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
    target = _target_model(model)
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


def _budget_bytes(budget: Any, baseline: int) -> int:
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise TypeError(
            f"budget must be a number of bytes (int) or a fraction of the no-checkpointing activation memory "
            f"(float in (0, 1]); got {budget!r} of type {type(budget).__name__}"
        )
    if isinstance(budget, float):
        if not 0.0 < budget <= 1.0:
            raise ValueError(f"budget as a fraction must be in (0, 1]; got {budget!r}")
        return int(budget * baseline)
    if budget <= 0:
        raise ValueError(f"budget in bytes must be positive; got {budget!r}")
    return budget


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def solve(profile: BlockProfile, budget_bytes: int) -> tuple[str, ...]:
    """The per-block strategies that keep the predicted bytes within ``budget_bytes`` at the least recompute."""
    options = [s for s in ("none", "selective", "full") if s in profile.retained]
    num_blocks = len(profile.retained["none"])
    required = profile.baseline_bytes - budget_bytes
    if required <= 0:
        return ("none",) * num_blocks
    smallest = profile.base_bytes + sum(min(profile.retained[s][i] for s in options) for i in range(num_blocks))
    if smallest > budget_bytes:
        raise ValueError(
            f"no plan fits a budget of {_mib(budget_bytes)} "
            f"({100 * budget_bytes / profile.baseline_bytes:.1f}% of the {_mib(profile.baseline_bytes)} retained "
            f"without checkpointing): the smallest activation memory reachable with {', '.join(options)} is "
            f"{_mib(smallest)} ({100 * smallest / profile.baseline_bytes:.1f}%)"
        )
    unit = max(1, math.ceil(required / _QUANTA))
    target = math.ceil(required / unit)
    infinity = (math.inf, math.inf)
    best: list[tuple[float, float]] = [(0, 0)] + [infinity] * target
    choices: list[list[str | None]] = [[]]
    history = []
    for i in range(num_blocks):
        step = [infinity] * (target + 1)
        picked: list[tuple[int, str] | None] = [None] * (target + 1)
        for k, (flops, count) in enumerate(best):
            if flops == math.inf:
                continue
            for strategy in options:
                saved = (profile.retained["none"][i] - profile.retained[strategy][i]) // unit
                reach = min(target, k + max(0, saved))
                cost = (flops + profile.recompute_flops[strategy][i], count + (strategy != "none"))
                if cost < step[reach]:
                    step[reach] = cost
                    picked[reach] = (k, strategy)
        best = step
        history.append(picked)
    if best[target] == infinity:  # quantisation lost the last few bytes: fall back to the strongest plan
        return tuple(min(options, key=lambda s: profile.retained[s][i]) for i in range(num_blocks))
    strategies: list[str] = []
    k = target
    for picked in reversed(history):
        k, strategy = picked[k]
        strategies.append(strategy)
    return tuple(reversed(strategies))


def plan(
    model: nn.Module,
    sample_inputs: Mapping[str, Any],
    budget: int | float,
    *,
    strategies: Sequence[str] = ("none", "selective", "full"),
    policy: Any = None,
    loss_fn: LossFn | None = None,
    **checkpoint_kwargs: Any,
) -> CheckpointPlan:
    """Make the plan that fits ``budget`` at the least recompute.

    Args:
        model: A ``PreTrainedModel`` (or PEFT model) on the device it will train on. It is left as found.
        sample_inputs: A representative batch (keyword arguments of the model, with labels so it returns a loss,
            or pass ``loss_fn``). Activation memory scales with batch and sequence length: profile the shapes
            you will train with.
        budget: Bytes (int), or a fraction of the activation memory retained without checkpointing (float in
            ``(0, 1]``).
        strategies: The strategies the plan may use; add ``"oplevel"`` to let it choose, per block, which single
            ops keep their outputs (:mod:`hf_ckpt.oplevel`).
        policy: The selective policy (see :mod:`hf_ckpt.selective`).
        loss_fn: Maps the model output to the scalar loss; default ``output.loss``.
        **checkpoint_kwargs: Passed to ``torch.utils.checkpoint.checkpoint`` while profiling and kept for the plan's
            application.

    Returns:
        A :class:`~hf_ckpt.CheckpointPlan`; apply it with ``hf_ckpt.enable(model, plan=plan)``.

    Raises:
        ValueError: no assignment of the allowed strategies fits the budget; the message gives the smallest
            activation memory that can be reached.
    """
    bad = [s for s in strategies if s not in ("none", "selective", "full", "oplevel")]
    if bad or not strategies:
        raise ValueError(f"strategies must be a non-empty subset of none, selective, full, oplevel; got {list(strategies)}")
    if "oplevel" in strategies:  # op-level policies among the options: hf_ckpt.oplevel plans
        from .oplevel import plan_oplevel

        return plan_oplevel(model, sample_inputs, budget, strategies=strategies, policy=policy, loss_fn=loss_fn, **checkpoint_kwargs)
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
        model_type=getattr(getattr(_target_model(model), "config", None), "model_type", None),
    )
