"""Which ops of a block to save: the memory / recompute frontier of one block type.

**Cost.** The recompute cost of an op is its FLOPs (matmuls, attention) plus, for an op without a FLOP formula,
its output elements, one each (norms, activations, softmax, dropout, pointwise arithmetic; see
:mod:`hf_ckpt.meters.flops`). FLOP counts alone are blind to the latter, which is all that selective recompute
reruns; counting them lets the solver spend spare memory on them once the matmuls are kept. Matmuls cost about
``hidden / 2`` FLOPs per byte kept, an elementwise op a quarter of one, so matmuls are always kept first.

**Items.** Only ops that cost recompute are worth saving (saving any other op adds memory and avoids nothing),
and only those no later op writes into in place and that do not themselves write into an input (code goes on
with the input, not with the saved return value). Candidates whose outputs share a storage (views of one
another) are merged into one item, since keeping either keeps the storage: an item's weight is the bytes of its
distinct fresh storages, its value the recompute cost it avoids. Items are independent: SAC's recompute runs
every op that is not saved, whatever else is saved, so values add up (see
:mod:`hf_ckpt.strategies.oplevel.ops.profile`).

**Frontier.** For each byte cap, the most recompute a set of items within the cap avoids: a 0/1 knapsack, solved
by the planners' one routine, :func:`hf_ckpt.solver.knapsack.pareto_front`, each item a group of two choices (leave
it, or keep it: its avoided cost gained at its bytes and its ops). Item by item it keeps the Pareto front of
(avoided cost; least bytes, then fewer kept ops, then the earlier ops): **exact** on a transformer block (5 to 10
items for the matmuls alone; 20 to 32 once elementwise ops count). Beyond
:data:`~hf_ckpt.solver.knapsack.MAX_STATES` points it keeps the best point per 1/4096 of the avoidable cost, each
with its exact bytes and cost.

The planner offers every frontier point to every block of the type; beyond :data:`MAX_POINTS` points the frontier
is thinned to the best point under each of :data:`MAX_POINTS` evenly spaced byte caps (so a cap between two kept
points is served by a point at most ``bytes / MAX_POINTS`` below it), plus the smallest point of each distinct
FLOP saving: every change of the kept matmuls stays on offer exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from hf_ckpt.solver.knapsack import Choice, pareto_front
from hf_ckpt.strategies.oplevel.ops.profile import BlockOpProfile

#: At most this many frontier points per block type are offered to the planner.
MAX_POINTS = 64


@dataclass(frozen=True)
class FrontierPoint:
    """One Pareto-optimal op set of a block type.

    Attributes:
        saved: The op occurrences it keeps.
        bytes: The bytes they keep.
        avoided_flops: The recompute FLOPs they avoid.
        avoided_elementwise: The recompute elementwise output elements they avoid.
    """

    saved: tuple[str, ...]
    bytes: int
    avoided_flops: int
    avoided_elementwise: int = 0

    @property
    def avoided_cost(self) -> int:
        """What the solver maximises: avoided FLOPs plus avoided elementwise elements."""
        return self.avoided_flops + self.avoided_elementwise


def _items(profile: BlockOpProfile) -> list[tuple[tuple[str, ...], int, int]]:
    """(keys, bytes, avoided cost) of each independent item."""
    candidates = [op for op in profile.ops if op.recompute_cost > 0 and not op.written and not op.mutates and op.storages]
    parent = list(range(len(candidates)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[int, int] = {}
    for i, op in enumerate(candidates):
        for storage in op.storages:
            if storage in owner:
                parent[find(i)] = find(owner[storage])
            else:
                owner[storage] = i
    groups: dict[int, list[int]] = {}
    for i in range(len(candidates)):
        groups.setdefault(find(i), []).append(i)
    items = []
    for members in groups.values():
        keys = tuple(candidates[i].key for i in members)
        items.append((keys, profile.saved_bytes(keys), profile.saved_flops(keys) + profile.saved_elementwise(keys)))
    return items


def _point(profile: BlockOpProfile, keys: tuple[str, ...]) -> FrontierPoint:
    return FrontierPoint(keys, profile.saved_bytes(keys), profile.saved_flops(keys), profile.saved_elementwise(keys))


def _thinned(points: list[FrontierPoint], limit: int) -> list[FrontierPoint]:
    """The best point under each of ``limit`` evenly spaced byte caps, plus the smallest point of each distinct
    FLOP saving (the corners where the kept matmuls change, which carry almost all of the value)."""
    if len(points) <= limit:
        return points
    top = points[-1].bytes
    kept: dict[int, FrontierPoint] = {}
    j = 0
    for step in range(limit + 1):
        cap = top * step // limit
        while j + 1 < len(points) and points[j + 1].bytes <= cap:
            j += 1
        kept[id(points[j])] = points[j]
    flops_seen: set[int] = set()
    for point in points:  # by increasing bytes
        if point.avoided_flops not in flops_seen:
            flops_seen.add(point.avoided_flops)
            kept[id(point)] = point
    return sorted(kept.values(), key=lambda point: point.bytes)


def frontier(profile: BlockOpProfile, *, max_points: int | None = None) -> list[FrontierPoint]:
    """The memory / avoided-recompute Pareto frontier of ``profile``'s block type, from saving nothing upwards.

    Args:
        profile: One block type's op profile.
        max_points: Thin the frontier to at most this many points (plus its ends); None keeps every point.
    """
    items = _items(profile)
    # last item first: where op sets tie, the one that keeps the earlier ops (the front's ties favour later groups)
    groups = [[Choice("", 0, (0, 0)), Choice("kept", cost, (size, len(keys)))] for keys, size, cost in reversed(items)]
    points = [_point(profile, tuple(key for (keys, _, _), name in zip(items, reversed(state.names)) if name
                                    for key in keys))
              for state in pareto_front(groups)]
    # a point is kept where no point of as few bytes avoids more (the front ranks fewer kept ops below bytes)
    points = [point for point, following in zip(points, points[1:] + [None])
              if following is None or following.bytes > point.bytes]
    return points if max_points is None else _thinned(points, max_points)
