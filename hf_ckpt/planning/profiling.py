"""Profiling real training steps, block by block: what the planners measure.

* :func:`profile_blocks` -> :class:`~hf_ckpt.solver.knapsack.BlockProfile`: each block's retained bytes and recompute
  FLOPs under each strategy, one step per strategy. A :class:`~hf_ckpt.measure.StorageTracker` labels each storage
  with the block that created it, so the bytes alive when forward returns split per block (what is created
  outside the blocks, embeddings and head, is the fixed base). Recompute cost is counted by ``FlopCounterMode``
  over whole steps: one step per strategy and group of twin blocks (same class, same parameter shapes), less the
  step without checkpointing, shared among the group.
* :func:`measured_bytes`: what a candidate plan retains, measured in one step.
* :func:`profile_chunked_head`: what the base retains, and what the step recomputes, with the LM head and loss in
  checkpointed chunks (``head_chunk_size``), measured the same way.
* :func:`left_as_found`: every step runs inside it, so the model ends as it started (checkpointing, training
  flags, gradients, RNG).

The block-level planner (:mod:`hf_ckpt.planning.planner`) and the op-level one (:mod:`hf_ckpt.strategies.oplevel`) both build on it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Sequence

import torch
from torch import nn

from hf_ckpt.runtime.apply import apply_request, remove
from hf_ckpt.planning.preserve import preserved
from hf_ckpt.solver.knapsack import BlockProfile
from hf_ckpt.runtime.request import EnableRequest
from hf_ckpt.runtime.state import suspended
from hf_ckpt.runtime.target import target_model
from hf_ckpt.runtime.blocks import Block, find_blocks
from hf_ckpt.meters.flops import count_flops
from hf_ckpt.meters.memory import StorageTracker, block_labels
from hf_ckpt.meters.step import LossFn, loss_of, model_device, run_forward
from hf_ckpt.runtime.plans import CheckpointPlan
from hf_ckpt.strategies.selective.policy import SelectiveRecomputeError
from hf_ckpt.strategies import kind_class


def loss_of_sample(output: Any, loss_fn: LossFn | None) -> torch.Tensor:
    """The loss of a profiling step, with the planner's wording when there is none."""
    return loss_of(output, loss_fn, caller="plan: ", inputs="sample_inputs")


def retained_per_block(model: nn.Module, blocks: list[Block], inputs: Mapping[str, Any], loss_fn: LossFn | None):
    """(base bytes, bytes per block) alive when forward returns, labelled by the block that created them."""
    with block_labels(blocks) as label, StorageTracker(label=label) as tracker:
        loss = loss_of_sample(run_forward(model, inputs), loss_fn)
        by_block = tracker.live_bytes_by_label(str(model_device(model)))
        loss.backward()
    return by_block.get(None, 0), tuple(by_block.get(block.index, 0) for block in blocks)


def step_counts(model: nn.Module, inputs: Mapping[str, Any], loss_fn: LossFn | None) -> Any:
    """What :func:`hf_ckpt.meters.flops.count_flops` counted over one step (``.total`` FLOPs, ``.elementwise``)."""
    torch.manual_seed(0)
    model.zero_grad(set_to_none=True)
    with count_flops() as counted:
        loss_of_sample(run_forward(model, inputs), loss_fn).backward()
    return counted


def step_flops(model: nn.Module, inputs: Mapping[str, Any], loss_fn: LossFn | None) -> int:
    return step_counts(model, inputs, loss_fn).total


def apply_setting(model: nn.Module, checkpoint_kwargs: Mapping[str, Any], **setting: Any) -> None:
    """Take back the model's checkpointing setting and apply ``setting`` (a ``strategy``, a ``plan``, ...) with
    ``checkpoint_kwargs``: how a profiling step configures the model."""
    remove(model)
    apply_request(model, EnableRequest.parse(dict(checkpoint_kwargs), "checkpoint_kwargs", takes_budget=False,
                                             **setting))


def measured_step(model: nn.Module, blocks: list[Block], inputs: Mapping[str, Any],
                  loss_fn: LossFn | None) -> tuple[int, tuple[int, ...], int, int]:
    """(base bytes, bytes per block, FLOPs, elementwise elements) of one step of the model as it is configured."""
    torch.manual_seed(0)
    model.zero_grad(set_to_none=True)
    base, per_block = retained_per_block(model, blocks, inputs, loss_fn)
    counted = step_counts(model, inputs, loss_fn)
    return base, per_block, counted.total, counted.elementwise


def twin_groups(blocks: list[Block]) -> list[list[int]]:
    """Blocks of the same class with parameters of the same shapes: they cost the same to recompute."""
    groups: dict[tuple, list[int]] = {}
    for block in blocks:
        shapes = tuple((name, tuple(p.shape)) for name, p in block.module.named_parameters())
        groups.setdefault((type(block.module), shapes), []).append(block.index)
    return list(groups.values())


def recompute_flops_per_block(
    model: nn.Module, blocks: list[Block], strategy: str, config: dict[str, Any], inputs: Mapping[str, Any],
    loss_fn: LossFn | None, none_flops: int,
) -> tuple[int, ...]:
    """Each block's recompute FLOPs under ``strategy``: whole-step FLOPs with the strategy on one group of twin
    blocks, less the FLOPs without checkpointing, shared among the group. Whole-step totals are exact where
    per-module attribution of the recompute (which runs in backward) is not."""
    per_block = [0] * len(blocks)
    for group in twin_groups(blocks):
        strategies = tuple(strategy if i in group else "none" for i in range(len(blocks)))
        apply_setting(model, config, plan=CheckpointPlan(strategies))
        extra = max(0, step_flops(model, inputs, loss_fn) - none_flops)
        share, remainder = divmod(extra, len(group))
        for position, index in enumerate(group):
            per_block[index] = share + (1 if position < remainder else 0)
    return tuple(per_block)


@contextlib.contextmanager
def left_as_found(model: nn.Module) -> Iterator[None]:
    """Profile in training mode with grad, then put everything back: the checkpointing attributes of every module
    (hf_ckpt's record and hooks, or upstream's flags), each module's training flag, accumulated gradients and the
    RNG state."""
    with preserved(model), suspended(target_model(model)), torch.enable_grad():
        model.train()
        yield


def measured_bytes(
    model: nn.Module, strategies: tuple[str, ...] | CheckpointPlan, inputs: Mapping[str, Any],
    loss_fn: LossFn | None, policy: Any, checkpoint_kwargs: dict[str, Any],
) -> int:
    """Bytes the plan (``strategies``, or a whole :class:`CheckpointPlan` with its op-level policies) retains at
    the end of forward, measured in one step."""
    plan = strategies if isinstance(strategies, CheckpointPlan) else CheckpointPlan(strategies)
    blocks = find_blocks(target_model(model))
    with left_as_found(model):
        options = {"policy": policy} if any(kind_class(s).takes_policy for s in plan.strategies) else {}
        apply_setting(model, checkpoint_kwargs, plan=plan, **options)
        torch.manual_seed(0)
        base, per_block = retained_per_block(model, blocks, inputs, loss_fn)
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
    with left_as_found(model):
        remove(model)
        none_flops = step_flops(model, sample_inputs, loss_fn)
        for strategy in dict.fromkeys(("none", *strategies)):
            remove(model)
            options = {"policy": policy} if kind_class(strategy).takes_policy else {}
            if kind_class(strategy).recomputes:
                apply_setting(model, checkpoint_kwargs, strategy=strategy, **options)
            try:
                torch.manual_seed(0)
                model.zero_grad(set_to_none=True)
                base, retained[strategy] = retained_per_block(model, blocks, sample_inputs, loss_fn)
            except SelectiveRecomputeError as error:
                unusable[strategy] = str(error)
                continue
            if not kind_class(strategy).recomputes:
                base_bytes = base
                recompute[strategy] = (0,) * len(blocks)
            else:
                recompute[strategy] = recompute_flops_per_block(
                    model, blocks, strategy, {**checkpoint_kwargs, **options}, sample_inputs, loss_fn, none_flops
                )
    return BlockProfile(base_bytes=base_bytes, retained=retained, recompute_flops=recompute, unusable=unusable)


def profile_chunked_head(model: nn.Module, sample_inputs: Mapping[str, Any], chunk: int, loss_fn: LossFn | None,
                         **checkpoint_kwargs: Any) -> tuple[int, int]:
    """(base bytes, recompute FLOPs) of a step whose head runs in checkpointed chunks of ``chunk`` tokens, every
    block plain: what the storages created outside the blocks retain at the end of forward (the full logits and
    their copy for the loss no longer among them), and the step's FLOPs less those of the step without it (the
    head's projection recomputed in backward), both measured as :func:`profile_blocks` measures blocks."""
    blocks = find_blocks(target_model(model))
    with left_as_found(model):
        remove(model)
        none_flops = step_flops(model, sample_inputs, loss_fn)
        apply_setting(model, checkpoint_kwargs, plan=CheckpointPlan(("none",) * len(blocks), head_chunk_size=chunk))
        torch.manual_seed(0)
        model.zero_grad(set_to_none=True)
        base, _ = retained_per_block(model, blocks, sample_inputs, loss_fn)
        flops = step_flops(model, sample_inputs, loss_fn)
    return base, max(0, flops - none_flops)
