"""The one solver of every planner: per block, the option of least cost such that the plan's bytes fit a budget.

Every planner states its choices the same way, as a menu: per block, a list of :class:`Option` (a name, the bytes the
block retains with it, its cost, a tie-break rank and the recompute FLOPs to report), plus the bytes retained outside
the blocks, and hands it to the one planning path, :func:`hf_ckpt.solver.verified.verified_plan`, which calls
:func:`solve_menu`, measures the candidate, tightens and records the plan. The measured block planner
(:mod:`hf_ckpt.planning.planner`) and the estimated plans (:mod:`hf_ckpt.estimation`) hand it a :class:`BlockProfile`'s
menu (:meth:`BlockProfile.menu`); the op-level planner (:mod:`hf_ckpt.planning.menus.oplevel`) its menu, into which the
partition and outside menus (:mod:`hf_ckpt.planning.menus.partition`, :mod:`hf_ckpt.planning.menus.outside`) put their
options. The op frontier (:mod:`hf_ckpt.planning.menus.frontier`: which ops of one block type keep their outputs)
solves its 0/1 knapsack with the same routine, :func:`pareto_front`. :func:`solve` (a profile's menu) stays for
callers that solve a profile without a plan.

Retained bytes add up over blocks, so the problem is a multiple-choice knapsack: reach the required savings (the
bytes of no checkpointing, ``"none"`` in every block, less the budget) at the least total (cost, checkpointed blocks,
overhead), compared in that order. It is solved over the options' exact bytes, block by block, as a Pareto front of
(bytes saved so far, capped at the required savings; least total); where a front grows beyond ``max_states`` it keeps
one state per ``required / quanta`` bytes, each with its exact bytes, so the predicted memory never understates.
Ties between plans of equal total go to the plan whose later blocks save more.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

from hf_ckpt.runtime.util.units import format_bytes as _mib
from hf_ckpt.strategies import ALL_STRATEGIES, NONE, keeps_everything, kind_of

#: Where a front grows beyond :data:`MAX_STATES`, it keeps one state per 1 / QUANTA of the gain required.
QUANTA = 4096
#: The most states a front holds before it keeps one per unit (on a 32-layer Llama with op-level menus the exact
#: fronts reach 7,000 states and an exact solve takes 5 s; there the units begin at the 8th block).
MAX_STATES = 2_000


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
    (ties to fewer checkpointed blocks): :func:`solve_menu` on the profile's menu.

    Raises:
        ValueError: no assignment of the profiled strategies fits; the message gives the smallest memory reachable.
    """
    return solve_menu(profile.menu(), profile.base_bytes, budget_bytes)


def solve_menu(menu: Sequence[Sequence[Option]], base_bytes: int, budget_bytes: int, *, quanta: int = QUANTA,
               max_states: int = MAX_STATES) -> tuple[str, ...]:
    """Per block, the name of the option such that ``base_bytes`` plus the options' bytes fit ``budget_bytes`` at
    the least total (cost, checkpointed blocks, overhead); every block has a ``"none"`` option, its baseline.

    The options' bytes saved against ``"none"`` are the gains of :func:`pareto_front`, capped at what the budget
    requires; its cheapest plan that saves it all is chosen (ties: the later blocks save more), then single blocks
    are moved to cheaper options while the exact bytes fit (which changes nothing unless the front kept one state
    per unit). Where the front lost the last bytes, every block's smallest option (ties: least total).

    Raises:
        ValueError: not even every block's smallest option fits; the message gives the smallest memory reachable.
    """
    none = [next(option.retained for option in options if keeps_everything(option.name)) for options in menu]
    required = base_bytes + sum(none) - budget_bytes
    if required <= 0:
        return (NONE,) * len(menu)
    _check_reachable(menu, base_bytes + sum(none), base_bytes, budget_bytes)
    groups = [[Choice(option.name, saved - option.retained, _rank(option)) for option in options]
              for options, saved in zip(menu, none)]
    best = pareto_front(groups, cap=required, quanta=quanta, max_states=max_states)[-1]
    if best.gain < required:  # one state per unit lost the last bytes: the strongest option everywhere
        return tuple(min(options, key=lambda o: (o.retained, _rank(o))).name for options in menu)
    return _refine(menu, best.names, base_bytes, budget_bytes)


def _check_reachable(menu: Sequence[Sequence[Option]], baseline: int, base_bytes: int, budget_bytes: int) -> None:
    """ValueError where even every block's smallest option retains more than ``budget_bytes`` (``baseline``: the
    bytes of ``"none"`` everywhere, for the message)."""
    smallest = base_bytes + sum(min(option.retained for option in options) for options in menu)
    if smallest <= budget_bytes:
        return
    kinds = dict.fromkeys(kind_of(option.name) for options in menu for option in options)
    raise ValueError(
        f"no plan fits a budget of {_mib(budget_bytes)} "
        f"({100 * budget_bytes / baseline:.1f}% of the {_mib(baseline)} retained "
        f"without checkpointing): the smallest activation memory reachable with {', '.join(kinds)} is "
        f"{_mib(smallest)} ({100 * smallest / baseline:.1f}%)"
    )


def _rank(option: Option) -> tuple[int, int, int]:
    """What an option adds to a plan's total: (cost, checkpointed or not, overhead), compared in order."""
    return option.cost, int(not keeps_everything(option.name)), option.overhead


class Choice(NamedTuple):
    """One choice of one group, as :func:`pareto_front` sees it.

    Attributes:
        name: What the plan records for the group.
        gain: What a plan wants more of (bytes saved; recompute avoided).
        total: What it wants less of, added up over the groups and compared in order (a plan's cost).
    """

    name: str
    gain: int
    total: tuple[int, ...]


class FrontState(NamedTuple):
    """One point of a Pareto front: per group its choice's name, and what they add up to."""

    gain: int
    total: tuple[int, ...]
    names: tuple[str, ...]


def pareto_front(groups: Sequence[Sequence[Choice]], *, cap: int | None = None, quanta: int = QUANTA,
                 max_states: int = MAX_STATES) -> list[FrontState]:
    """The plans (one choice per group) that no other beats, by increasing gain: each with the least total of the
    plans that gain at least as much (the one knapsack of every planner and of the op frontier).

    Built group by group: the states are the plans so far, keyed by their gain (capped at ``cap``: beyond it,
    gaining more is worth nothing); a state that gains less at no lower total than another is dropped, since
    whatever the later groups add, the other does at least as well. Ties between equal totals go to the plan whose
    later groups gain more, compared from the last group back. Where a front holds more than ``max_states`` states,
    it keeps the best state per unit of ``cap / quanta`` (without a cap, of the most the groups can gain): every
    state keeps its exact gain and total, so a plan never claims more than it gains, but the cheapest plan can be
    missed by a few units (:func:`solve_menu` then moves single blocks to cheaper options).
    """
    span = cap if cap is not None else sum(max(choice.gain for choice in choices) for choices in groups)
    unit = max(1, math.ceil(span / quanta))
    front = [_State(0, tuple(0 for _ in groups[0][0].total) if groups else (), (), ())]
    for choices in groups:
        useful = _undominated(choices)
        best: dict[int, _State] = {}
        for state in front:
            for choice in useful:
                gain = state.gain + choice.gain if cap is None else min(cap, state.gain + choice.gain)
                total = tuple(map(operator.add, state.total, choice.total))
                held = best.get(gain)
                if held is not None and total > held.total:
                    continue
                order = (-choice.gain,) + state.order
                if held is None or (total, order) < held.key:
                    best[gain] = _State(gain, total, order, state.names + (choice.name,))
        front = _pareto(best.values())
        if len(front) > max_states:
            front = _pareto(_bucketed(front, unit, cap))
    # a state kept for the tie order alone (as much total as one that gains more) is no point of the front
    points = [state for state, more in zip(front, [None, *front]) if more is None or state.total < more.total]
    return [FrontState(state.gain, state.total, state.names) for state in reversed(points)]


class _State(NamedTuple):
    gain: int
    total: tuple[int, ...]
    order: tuple[int, ...]  # the choices' gains negated, from the last group back: the tie order
    names: tuple[str, ...]

    @property
    def key(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return self.total, self.order


def _pareto(states: Iterable[_State]) -> list[_State]:
    """By decreasing gain, each state better than every state gaining more."""
    front: list[_State] = []
    for state in sorted(states, key=lambda s: s.gain, reverse=True):
        if not front or state.key < front[-1].key:
            front.append(state)
    return front


def _undominated(choices: Sequence[Choice]) -> list[Choice]:
    """The choices no other choice of the group beats (as much gain or more at a lower or equal total)."""
    kept: list[Choice] = []
    for choice in sorted(choices, key=lambda c: (-c.gain, c.total)):
        if not kept or choice.total < kept[-1].total:
            kept.append(choice)
    return kept


def _bucketed(front: list[_State], unit: int, cap: int | None) -> list[_State]:
    """The best state per ``unit`` of gain; a state at ``cap`` keeps a bucket of its own."""
    best: dict[tuple[int, bool], _State] = {}
    for state in front:
        bucket = (state.gain // unit, state.gain == cap)
        if bucket not in best or state.key < best[bucket].key:
            best[bucket] = state
    return list(best.values())


def _refine(menu: Sequence[Sequence[Option]], chosen: tuple[str, ...], base_bytes: int,
            budget_bytes: int) -> tuple[str, ...]:
    """``chosen`` with single blocks moved to cheaper options while the exact bytes fit: a front that keeps one
    state per unit can miss the cheapest plan by a few bytes."""
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
