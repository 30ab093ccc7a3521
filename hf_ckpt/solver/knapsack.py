"""The one solver of every planner: per block, the option of least cost such that the plan's bytes fit a budget.

Every planner states its choices the same way, as a menu: per block, a list of :class:`Option` (a name, the bytes the
block retains with it, its cost, a tie-break rank and the recompute FLOPs to report), plus the bytes retained outside
the blocks, and hands it to the one planning path, :func:`hf_ckpt.solver.verified.verified_plan`, which calls
:func:`solve_menu`, measures the candidate, tightens and records the plan. The measured block planner
(:mod:`hf_ckpt.planning.planner`) and the estimated plans (:mod:`hf_ckpt.estimation`) hand it a :class:`BlockProfile`'s
menu (:meth:`BlockProfile.menu`); the op-level planner (:mod:`hf_ckpt.planning.menus.oplevel`) its menu, into which the
partition and outside menus (:mod:`hf_ckpt.planning.menus.partition`, :mod:`hf_ckpt.planning.menus.outside`) put their
options, solved with ``exact=True``. :func:`solve` (a profile's menu, quantised) stays for callers that solve a profile
without a plan.

Retained bytes add up over blocks, so the problem is a multiple-choice knapsack: reach the required savings (the
bytes of no checkpointing, ``"none"`` in every block, less the budget) at the least total (cost, checkpointed blocks,
overhead), compared in that order. It is solved by dynamic programming over savings quantised *down* to a byte unit of
``required / quanta`` (so the predicted memory never understates); with ``exact=True``, first over the options' exact
bytes, as a Pareto front that gives way to the quantised programme where it grows beyond ``max_states``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

from hf_ckpt.runtime.util.units import format_bytes as _mib
from hf_ckpt.strategies import ALL_STRATEGIES, NONE, keeps_everything, kind_of

#: The byte units of the quantised programme: the savings a plan requires are counted in this many units.
QUANTA = 4096
#: The exact front gives way to the quantised programme where it holds more states than this (on a 32-layer Llama
#: with op-level menus the fronts reach 7,000 states and an exact solve takes 5 s; there it gives way at the 8th block).
MAX_STATES = 2_000

_Total = tuple[float, float, float]
_INFINITY: _Total = (math.inf, math.inf, math.inf)


class Option(NamedTuple):
    """One way to run one block, as the solver sees it.

    Attributes:
        name: The strategy's spelling (``"full"``, ``"oplevel:<name>"``, ``"partition:0.5"``): what the plan records.
        retained: Bytes the block retains at the end of forward with it.
        cost: What the solver minimises over the plan (recompute FLOPs; for the op-level planner, plus recompute
            elementwise output elements).
        overhead: Tie-break between plans of equal cost and equal checkpointed blocks (lower first).
        flops: Recompute FLOPs, for the plan's report only (the solver does not read them).
    """

    name: str
    retained: int
    cost: int
    overhead: int = 0
    flops: int = 0


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
        """Bytes retained with ``strategies[i]`` on block ``i``."""
        return self.base_bytes + sum(self.retained[s][i] for i, s in enumerate(strategies))

    def predicted_recompute_flops(self, strategies: Sequence[str]) -> int:
        """Recompute FLOPs with ``strategies[i]`` on block ``i``."""
        return sum(self.recompute_flops[s][i] for i, s in enumerate(strategies))

    def menu(self) -> list[list[Option]]:
        """Per block, an :class:`Option` per profiled strategy (in :data:`~hf_ckpt.strategies.ALL_STRATEGIES`'
        order), costing its recompute FLOPs, with no overhead rank."""
        strategies = [s for s in ALL_STRATEGIES if s in self.retained]
        return [
            [Option(s, self.retained[s][i], self.recompute_flops[s][i], 0, self.recompute_flops[s][i])
             for s in strategies]
            for i in range(len(self.retained["none"]))
        ]


def solve(profile: BlockProfile, budget_bytes: int) -> tuple[str, ...]:
    """The per-block strategies that keep the predicted bytes within ``budget_bytes`` at the least recompute FLOPs
    (ties to fewer checkpointed blocks): :func:`solve_menu` on the profile's menu, quantised.

    Raises:
        ValueError: no assignment of the profiled strategies fits; the message gives the smallest memory reachable.
    """
    return solve_menu(profile.menu(), profile.base_bytes, budget_bytes)


def solve_menu(menu: Sequence[Sequence[Option]], base_bytes: int, budget_bytes: int, *, exact: bool = False,
               quanta: int = QUANTA, max_states: int = MAX_STATES) -> tuple[str, ...]:
    """Per block, the name of the option such that ``base_bytes`` plus the options' bytes fit ``budget_bytes`` at
    the least total (cost, checkpointed blocks, overhead); every block has a ``"none"`` option, its baseline.

    The two ways keep the results each planner had before they shared this solver (the exact way on the block
    planners' menus gives the same figures on the tests' models, but on 19 of their plans puts the same options on
    other twin blocks, ``("full", "full", "selective", "selective")`` for ``("selective", "selective", "full",
    "full")``: the ties between equal totals fall the other way, so the plans would change). Quantised (the block
    planners): dynamic programming over savings quantised down to ``required / quanta`` bytes; where the rounding
    loses the last bytes, every block's smallest option (ties: menu order). ``exact=True`` (the op-level planner): first the
    exact Pareto front, up to ``max_states`` states; where it gives way, the quantised programme, then single blocks
    moved to cheaper options while the exact bytes fit; where the rounding loses the last bytes, every block's
    smallest option (ties: least cost).

    Raises:
        ValueError: not even every block's smallest option fits; the message gives the smallest memory reachable.
    """
    none = [next(option.retained for option in options if keeps_everything(option.name)) for options in menu]
    required = base_bytes + sum(none) - budget_bytes
    if required <= 0:
        return (NONE,) * len(menu)
    _check_reachable(menu, base_bytes, budget_bytes)
    if exact:
        found = _exact_plan(menu, none, required, max_states)
        if found is not None:
            return found
    chosen = _quantised_plan(menu, none, required, quanta)
    if chosen is None:  # quantisation lost the last few bytes: the strongest option everywhere
        key: Any = (lambda o: (o.retained, o.cost)) if exact else (lambda o: o.retained)
        return tuple(min(options, key=key).name for options in menu)
    return _refine(menu, chosen, base_bytes, budget_bytes) if exact else chosen


def _check_reachable(menu: Sequence[Sequence[Option]], base_bytes: int, budget_bytes: int) -> None:
    """ValueError where even every block's smallest option retains more than ``budget_bytes``."""
    smallest = base_bytes + sum(min(option.retained for option in options) for options in menu)
    if smallest <= budget_bytes:
        return
    baseline = base_bytes + sum(next(o.retained for o in options if keeps_everything(o.name)) for options in menu)
    kinds = dict.fromkeys(kind_of(option.name) for options in menu for option in options)
    raise ValueError(
        f"no plan fits a budget of {_mib(budget_bytes)} "
        f"({100 * budget_bytes / baseline:.1f}% of the {_mib(baseline)} retained "
        f"without checkpointing): the smallest activation memory reachable with {', '.join(kinds)} is "
        f"{_mib(smallest)} ({100 * smallest / baseline:.1f}%)"
    )


def _rank(option: Option) -> tuple[int, bool, int]:
    """What an option adds to a plan's total: (cost, checkpointed or not, overhead), compared in order."""
    return option.cost, not keeps_everything(option.name), option.overhead


def _quantised_plan(menu: Sequence[Sequence[Option]], none: list[int], required: int,
                    quanta: int) -> tuple[str, ...] | None:
    """The options of least total whose savings, each rounded down to ``required / quanta`` bytes, reach
    ``required``; None where the rounded savings cannot."""
    unit = max(1, math.ceil(required / quanta))
    target = math.ceil(required / unit)
    best: list[_Total] = [(0, 0, 0)] + [_INFINITY] * target
    history = []
    for i, options in enumerate(menu):
        step = [_INFINITY] * (target + 1)
        picked: list[tuple[int, str] | None] = [None] * (target + 1)
        for k, total in enumerate(best):
            if total[0] == math.inf:
                continue
            for option in options:
                reach = min(target, k + max(0, (none[i] - option.retained) // unit))
                rank = _rank(option)
                candidate = (total[0] + rank[0], total[1] + rank[1], total[2] + rank[2])
                if candidate < step[reach]:
                    step[reach] = candidate
                    picked[reach] = (k, option.name)
        best = step
        history.append(picked)
    if best[target] == _INFINITY:
        return None
    chosen: list[str] = []
    k = target
    for picked in reversed(history):
        k, name = picked[k]
        chosen.append(name)
    return tuple(reversed(chosen))


def _exact_plan(menu: Sequence[Sequence[Option]], none: list[int], required: int,
                max_states: int) -> tuple[str, ...] | None:
    """The options of least total that save at least ``required`` bytes, over their exact bytes; None where a
    front grows beyond ``max_states``.

    After each block the states are the plans' savings so far (capped at ``required``: beyond it, saving more is
    worth nothing) and their least total; a state that saves less at no lower total than another is dropped, since
    whatever the later blocks add, the other does at least as well; so is an option another beats
    (:func:`_undominated`)."""
    front: dict[int, tuple[_Total, Any]] = {0: ((0, 0, 0), None)}
    history = []
    for i, options in enumerate(menu):
        step: dict[int, tuple[_Total, Any]] = {}
        useful = _undominated(options, none[i])
        for saved, (total, _) in front.items():
            for name, bytes_, rank in useful:
                reach = min(required, saved + none[i] - bytes_)
                candidate = (total[0] + rank[0], total[1] + rank[1], total[2] + rank[2])
                if reach not in step or candidate < step[reach][0]:
                    step[reach] = (candidate, (saved, name))
        front, least = {}, None
        for saved in sorted(step, reverse=True):  # Pareto: each state cheaper than every state saving more
            if least is None or step[saved][0] < least:
                front[saved], least = step[saved], step[saved][0]
        if len(front) > max_states:
            return None
        history.append(front)
    if required not in front:
        return None
    chosen, saved = [], required
    for states in reversed(history):
        saved, name = states[saved][1]
        chosen.append(name)
    return tuple(reversed(chosen))


def _undominated(options: Sequence[Option], none: int) -> list[tuple[str, int, tuple[int, bool, int]]]:
    """(name, bytes, rank) of the options no other option beats: none keeps fewer or as many bytes at a lower or
    equal :func:`_rank`; an option keeping more than ``none`` never pays."""
    kept: list[tuple[str, int, tuple[int, bool, int]]] = []
    for option in sorted((o for o in options if o.retained <= none), key=lambda o: (o.retained, _rank(o))):
        if not kept or _rank(option) < kept[-1][2]:
            kept.append((option.name, option.retained, _rank(option)))
    return kept


def _refine(menu: Sequence[Sequence[Option]], chosen: tuple[str, ...], base_bytes: int,
            budget_bytes: int) -> tuple[str, ...]:
    """``chosen`` with single blocks moved to cheaper options while the exact bytes fit: the quantised programme
    rounds each block's saving down to its byte unit, which can leave a cheaper plan unseen by a few KiB."""
    current = [next(o for o in options if o.name == name) for options, name in zip(menu, chosen)]
    total = base_bytes + sum(option.retained for option in current)
    improved = True
    while improved:
        improved = False
        for i, options in enumerate(menu):
            better = [o for o in options
                      if _rank(o) < _rank(current[i]) and total - current[i].retained + o.retained <= budget_bytes]
            if better:
                best = min(better, key=_rank)
                total += best.retained - current[i].retained
                current[i], improved = best, True
    return tuple(option.name for option in current)


def budget_bytes(budget: float | int, baseline: int) -> int:
    """A budget already checked by :func:`hf_ckpt.runtime.util.units.parse_budget`, in bytes."""
    return int(budget * baseline) if isinstance(budget, float) else budget
