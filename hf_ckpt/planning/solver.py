"""The planner's solver: the cheapest per-block strategies whose predicted memory fits a budget.

A :class:`BlockProfile` says what each block retains and recomputes under each strategy, however it was obtained
(measured by :func:`hf_ckpt.planning.planner.profile_blocks`, or estimated on fake tensors by :mod:`hf_ckpt.estimate`);
:func:`solve` picks a strategy per block. Retained bytes add up over blocks, so the problem is a multiple-choice
knapsack: reach the required savings at the least recompute FLOPs, solved exactly by dynamic programming over
savings quantised *down* (the predicted memory never understates), ties going to fewer checkpointed blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from hf_ckpt.runtime.units import format_bytes as _mib
from hf_ckpt.strategies import ALL_STRATEGIES, kind_class

_QUANTA = 4096


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


def solve(profile: BlockProfile, budget_bytes: int) -> tuple[str, ...]:
    """The per-block strategies that keep the predicted bytes within ``budget_bytes`` at the least recompute."""
    options = [s for s in ALL_STRATEGIES if s in profile.retained]
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
                cost = (flops + profile.recompute_flops[strategy][i], count + kind_class(strategy).recomputes)
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


def budget_bytes(budget: float | int, baseline: int) -> int:
    """A budget already checked by :func:`hf_ckpt.runtime.units.parse_budget`, in bytes."""
    return int(budget * baseline) if isinstance(budget, float) else budget
