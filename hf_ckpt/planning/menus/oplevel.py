"""Op-level planning: per block, one of none / full / selective or an op-level policy, within a memory budget.

1. **Profile.** :func:`hf_ckpt.planning.planner.profile_blocks` measures each block's retained bytes and recompute FLOPs
   under the block-level strategies; :func:`profile_ops` profiles one block per twin group op by op.
2. **Menu.** Each block's options: the block-level strategies, plus every point of its type's op-level frontier
   (:func:`~hf_ckpt.planning.menus.frontier.frontier`), predicted as ``full`` plus the kept bytes and ``full``'s
   recompute less the avoided recompute; points that avoid no FLOPs are left out (they would trade plain
   checkpointing for per-op selective dispatch to save elementwise work only). An option's cost is its recompute
   FLOPs plus its recompute elementwise output elements (one each, :mod:`hf_ckpt.meters.flops`): ``none`` costs
   0, ``full`` the whole block's recompute, ``selective`` the measured FLOPs plus the elementwise ops its policy does
   not keep (the op profile asks the policy).
3. **Solve.** Through the one planning path of every planner, :func:`hf_ckpt.solver.verified.verified_plan`, the
   one solver, :func:`hf_ckpt.solver.knapsack.solve_menu`: a multiple-choice knapsack over blocks, solved over the
   options' exact bytes (a Pareto front, block by block, which keeps one state per byte unit where it grows too
   large: many blocks of many types), as for the block-level planner. Ties go to fewer checkpointed blocks, then
   to plain ``full`` over a selective policy (the options' overhead ranks: less dispatch overhead).
4. **Verify.** The plan runs one step and its retained bytes are measured; on an overshoot the solver is asked for
   less, up to a few times (the same loop, error and plan record as the block-level planner's: ``made_for`` is
   recorded; ``head_chunk_size`` is None, the op-level planner does not chunk the head).
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from hf_ckpt.runtime.apply import remove
from hf_ckpt.solver.knapsack import Option
from hf_ckpt.solver.knapsack import budget_bytes as in_bytes
from hf_ckpt.solver.verified import PlanRecord, verified_plan
from hf_ckpt.runtime.target import target_model
from hf_ckpt.runtime.blocks import find_blocks
from hf_ckpt.runtime.plans import CheckpointPlan
from hf_ckpt.planning.profiling import left_as_found, loss_of_sample, measured_bytes, profile_blocks, twin_groups
from hf_ckpt.strategies.selective.policy import check_policy, policy_function
from hf_ckpt.strategies import FINER_CHOICES, OUTSIDE, kind_class, kind_of
from hf_ckpt.strategies.oplevel.spec import OpLevel
from hf_ckpt.planning.menus.outside import outside_option
from hf_ckpt.planning.menus.partition import partition_options
from hf_ckpt.strategies.partition.spec import Partition
from hf_ckpt.strategies.oplevel.ops.profile import BlockOpProfile, capture_inputs, profile_block
from hf_ckpt.planning.menus.frontier import MAX_POINTS, frontier

#: Tie-breaks between options of equal FLOPs: no checkpoint, then plain checkpointing, then selective contexts.
_OVERHEAD = {"none": 0, "full": 1}


def profile_ops(
    model: nn.Module, sample_inputs: Mapping[str, Any], *, loss_fn: Any = None, policy: Any = None
) -> list[BlockOpProfile]:
    """Profile, op by op, the first block of each group of twin blocks (see :mod:`hf_ckpt.strategies.oplevel.ops.profile`).

    ``policy`` is the block-level selective policy (default ``"matmuls_and_attention"``): each op records whether
    it keeps the op's output. The model is left as found (checkpointing setting, mode, gradients, RNG state).
    """
    if not isinstance(sample_inputs, Mapping):
        raise TypeError(
            f"sample_inputs must be a mapping of keyword arguments for the model; got {type(sample_inputs).__name__}"
        )
    target = target_model(model)
    blocks = find_blocks(target)
    if not blocks:
        raise ValueError(f"{type(target).__name__} has no repeated blocks to profile")
    check_policy(policy)
    selective_fn = policy_function(policy)
    groups = twin_groups(blocks)
    firsts = [blocks[group[0]] for group in groups]
    profiles = []
    with left_as_found(model):
        remove(model)
        torch.manual_seed(0)
        inputs = dict(sample_inputs)
        if "use_cache" in inspect.signature(target.forward).parameters:
            inputs.setdefault("use_cache", False)  # a cache captured with the inputs would grow on each rerun
        captured = capture_inputs(model, firsts, lambda: loss_of_sample(model(**inputs), loss_fn))
        for block, group in zip(firsts, groups):
            if block.index not in captured:
                continue  # the block never ran on this batch (a decoder without decoder inputs)
            torch.manual_seed(0)
            args, kwargs = captured[block.index]
            profiles.append(profile_block(block, args, kwargs, tuple(group), selective_fn))
    return profiles


def _elementwise(profile: BlockOpProfile | None, strategy: str) -> int:
    """Recompute elementwise elements of a block-level strategy, from the op profile (0 without one)."""
    if profile is None or not kind_class(strategy).recomputes:
        return 0
    return profile.selective_elementwise if kind_class(strategy).takes_policy else profile.recompute_elementwise


def _menu(block_profile: Any, op_profiles: list[BlockOpProfile]) -> tuple[list[list[Option]], dict[str, tuple[str, ...]]]:
    """Per block, the options: strategy, predicted bytes, predicted recompute cost (FLOPs plus elementwise
    elements), overhead rank and the recompute FLOPs alone."""
    num_blocks = len(block_profile.retained["none"])
    of_block = {i: profile for profile in op_profiles for i in profile.blocks}
    menu: list[list[Option]] = [[] for _ in range(num_blocks)]
    for strategy, retained in block_profile.retained.items():
        for i in range(num_blocks):
            flops = block_profile.recompute_flops[strategy][i]
            cost = flops + _elementwise(of_block.get(i), strategy)
            menu[i].append(Option(strategy, retained[i], cost, _OVERHEAD.get(strategy, 3), flops))
    policies: dict[str, tuple[str, ...]] = {}
    used_names: set[str] = set()
    for number, profile in enumerate(op_profiles):
        prefix = profile.block_type if profile.block_type not in used_names else f"{profile.block_type}{number}"
        used_names.add(prefix)
        for k, point in enumerate(frontier(profile, max_points=MAX_POINTS)):
            if not point.avoided_flops:
                # Saving nothing is plain "full". A policy that avoids elementwise work only would swap plain
                # checkpointing for per-op selective dispatch, which can cost more time than it saves.
                continue
            name = f"{prefix}-{k}"
            policies[name] = point.saved
            for i in profile.blocks:
                flops = max(0, block_profile.recompute_flops["full"][i] - point.avoided_flops)
                elementwise = profile.recompute_elementwise - point.avoided_elementwise
                menu[i].append(Option(
                    OpLevel(name, point.saved).spelling, block_profile.retained["full"][i] + point.bytes,
                    flops + elementwise, 2, flops
                ))
    return menu, policies


def _finer_menu(model: nn.Module, sample_inputs: Mapping[str, Any], strategies: Sequence[str], block_profile: Any,
                policy: Any, loss_fn: Any, checkpoint_kwargs: dict) -> tuple[list[list[Option]], dict, int, tuple]:
    """(menu, op-level policies, base bytes, outside module names): the block-level options allowed, op-level
    policies, partitions and, as one more row, the modules between the blocks (``"outside"``)."""
    op_profiles = profile_ops(model, sample_inputs, loss_fn=loss_fn, policy=policy)  # elementwise costs too
    menu, policies = _menu(block_profile, op_profiles)
    allowed = set(strategies) - set(FINER_CHOICES)
    menu = [
        [o for o in options if o.name in allowed or (kind_of(o.name) == OpLevel.kind and OpLevel.kind in strategies)]
        for options in menu
    ]
    if Partition.kind in strategies:
        for options, more in zip(menu, partition_options(model, sample_inputs, loss_fn=loss_fn, **checkpoint_kwargs)):
            options.extend(more)
    base_bytes, outside = block_profile.base_bytes, ()
    if OUTSIDE in strategies:
        outside, row = outside_option(model, sample_inputs, loss_fn=loss_fn, **checkpoint_kwargs)
        if row:  # one more row: keep the outside modules' tensors (bytes of the base) or recompute them
            menu.append(row)
            base_bytes -= row[0].retained
    return menu, policies, base_bytes, outside


def plan_oplevel(
    model: nn.Module,
    sample_inputs: Mapping[str, Any],
    budget: int | float,
    *,
    strategies: Sequence[str] = ("none", "selective", "full", "oplevel"),
    policy: Any = None,
    loss_fn: Any = None,
    **checkpoint_kwargs: Any,
) -> CheckpointPlan:
    """:func:`hf_ckpt.plan` with op-level policies (``"oplevel"`` in ``strategies``), graph partitions
    (``"partition"``: :mod:`hf_ckpt.planning.menus.partition`) or the modules between the blocks (``"outside"``:
    :mod:`hf_ckpt.planning.menus.outside`) among the options."""
    block_strategies = tuple(dict.fromkeys(s for s in (*strategies, "full") if s not in FINER_CHOICES))
    block_profile = profile_blocks(
        model, sample_inputs, strategies=block_strategies, policy=policy, loss_fn=loss_fn, **checkpoint_kwargs
    )
    budget_bytes = in_bytes(budget, block_profile.baseline_bytes)
    menu, policies, base_bytes, outside = _finer_menu(model, sample_inputs, strategies, block_profile, policy, loss_fn,
                                                      checkpoint_kwargs)
    num_blocks = len(block_profile.retained["none"])

    def candidate(chosen: tuple[str, ...]) -> CheckpointPlan:
        used = {name for name in policies if OpLevel(name, ()).spelling in chosen}
        return CheckpointPlan(strategies=chosen[:num_blocks], policies={name: policies[name] for name in sorted(used)},
                              outside_blocks=outside if OUTSIDE in chosen else ())

    return verified_plan(
        menu, base_bytes, budget_bytes, candidate=candidate, record=PlanRecord.of(block_profile, model),
        measure=lambda plan: measured_bytes(model, plan, sample_inputs, loss_fn, policy, dict(checkpoint_kwargs)),
    )
