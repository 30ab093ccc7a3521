"""The planner's partition options: each block type's ``"partition:<F>"`` strategies, measured in real steps.

For each budget ``F`` of :data:`PARTITION_BUDGETS` and each group of twin blocks, one step runs with that group
partitioned at ``F`` (:mod:`hf_ckpt.strategies.partition.graph`) and every other block plain: the bytes each block keeps
when forward returns (labelled per block, as :func:`hf_ckpt.planning.profiling.profile_blocks` does), and the step's FLOPs
and elementwise output elements less the plain step's, shared among the group. Nothing is predicted: the
partitioner's own estimates are not used.

Where the block's graph has layer norms or softmaxes, each budget is measured once more as ``"partition:<F>:norms"``
(:mod:`hf_ckpt.strategies.partition.norms`: the partitioner may recompute them too). The two sets are not nested (``F`` is a
fraction of what the partitioner keeps by default, which ``:norms`` lowers), so both are offered to the planner.
"""

from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from hf_ckpt.runtime.apply import remove
from hf_ckpt.runtime.target import target_model
from hf_ckpt.runtime.blocks import find_blocks
from hf_ckpt.runtime.plans import CheckpointPlan
from hf_ckpt.planning.profiling import apply_setting, left_as_found, measured_step, twin_groups
from hf_ckpt.solver.knapsack import Option
from hf_ckpt.strategies.partition.spec import Partition
from hf_ckpt.strategies.partition.graph import traced_norm_ops

#: The partitioner budgets profiled for the planner: its default choice (1), full recompute (0) and between.
PARTITION_BUDGETS: tuple[float, ...] = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0)


def partition_options(
    model: nn.Module, sample_inputs: Mapping[str, Any], *, loss_fn: Any = None,
    budgets: tuple[float, ...] = PARTITION_BUDGETS, **checkpoint_kwargs: Any,
) -> list[list[Option]]:
    """Per block, its measured ``"partition:<F>[:norms]"`` options for the solver (one per budget and variant, equal
    measurements once), costing recompute FLOPs plus elementwise elements, overhead rank 2."""
    blocks = find_blocks(target_model(model))
    options: list[list[Option]] = [[] for _ in blocks]
    with left_as_found(model):
        remove(model)
        _, _, none_flops, none_elementwise = measured_step(model, blocks, sample_inputs, loss_fn)
        for group in twin_groups(blocks):
            seen: set[tuple[int, int]] = set()
            settings = [Partition(budget) for budget in budgets]
            for index, setting in enumerate(settings):  # the :norms settings are appended once the block is traced
                strategy = setting.spelling
                plan = CheckpointPlan(tuple(strategy if i in group else "none" for i in range(len(blocks))))
                apply_setting(model, checkpoint_kwargs, plan=plan)
                _, per_block, flops, elementwise = measured_step(model, blocks, sample_inputs, loss_fn)
                if index == 0 and traced_norm_ops(blocks[group[0]].module):
                    settings += [Partition(budget, norms=True) for budget in budgets]
                extra_flops = max(0, flops - none_flops) // len(group)
                extra_elementwise = max(0, elementwise - none_elementwise) // len(group)
                measured = (sum(per_block[i] for i in group), extra_flops + extra_elementwise)
                if measured in seen:
                    continue  # the partitioner made the same choice at another budget
                seen.add(measured)
                for i in group:
                    options[i].append(Option(strategy, per_block[i], extra_flops + extra_elementwise, 2, extra_flops))
        remove(model)
    return options
