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
every op that is not saved, whatever else is saved, so values add up (see :mod:`._profile`).

**Frontier.** For each byte cap, the most FLOPs a set of items within the cap avoids: a 0/1 knapsack.

* With at most :data:`EXACT_ITEMS` items (a transformer block has 5 to 10: the projections, the attention
  matmuls or the fused attention op, the MLP matmuls) every subset is enumerated and the Pareto frontier is
  **exact**.
* With more (a transformer block once its elementwise ops count: 20 to 32), a dynamic program over byte weights rounded *up*
  to ``unit = total bytes / QUANTA`` gives, for every cap ``C``, a set that fits ``C`` (rounding up never
  understates memory) and avoids at least as much recompute as the best set that fits ``C - n * unit`` (each of
  the ``n`` items loses under one unit): **within n units of exact**, i.e. at most ``n / QUANTA`` of the block's
  savable bytes.

The planner offers every frontier point to every block of the type; beyond :data:`MAX_POINTS` points the frontier
is thinned to the best point under each of :data:`MAX_POINTS` evenly spaced byte caps (so a cap between two kept
points is served by a point at most ``bytes / MAX_POINTS`` below it), plus the smallest point of each distinct
FLOP saving: every change of the kept matmuls stays on offer exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hf_ckpt.strategies.oplevel.ops.profile import BlockOpProfile

#: Up to this many items, the frontier is found by enumerating every subset.
EXACT_ITEMS = 16
#: Byte resolution of the dynamic program used beyond :data:`EXACT_ITEMS`.
QUANTA = 4096
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


def _pareto(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """Keep the points no other point beats (fewer or equal bytes and more avoided cost), by increasing bytes."""
    points.sort(key=lambda p: (p.bytes, -p.avoided_cost, len(p.saved)))
    frontier: list[FrontierPoint] = []
    for point in points:
        if not frontier or point.avoided_cost > frontier[-1].avoided_cost:
            frontier.append(point)
    return frontier


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


def _exact(items: list[tuple[tuple[str, ...], int, int]]) -> list[tuple[str, ...]]:
    points = []
    for mask in range(1 << len(items)):
        keys: list[str] = []
        size = cost = 0
        for i, (item_keys, item_bytes, item_cost) in enumerate(items):
            if mask >> i & 1:
                keys.extend(item_keys)
                size += item_bytes
                cost += item_cost
        points.append(FrontierPoint(tuple(keys), size, cost))
    return [point.saved for point in _pareto(points)]


def _dynamic(items: list[tuple[tuple[str, ...], int, int]]) -> list[tuple[str, ...]]:
    total = sum(size for _, size, _ in items)
    unit = max(1, math.ceil(total / QUANTA))
    weights = [math.ceil(size / unit) for _, size, _ in items]
    capacity = sum(weights)
    best: list[tuple[int, tuple[int, ...]] | None] = [None] * (capacity + 1)
    best[0] = (0, ())
    for i, ((_, _, flops), weight) in enumerate(zip(items, weights)):
        for cap in range(capacity, weight - 1, -1):
            previous = best[cap - weight]
            if previous is not None and (best[cap] is None or previous[0] + flops > best[cap][0]):
                best[cap] = (previous[0] + flops, previous[1] + (i,))
    points = []
    for entry in best:
        if entry is not None:
            chosen = entry[1]
            keys = tuple(key for i in chosen for key in items[i][0])
            points.append(FrontierPoint(keys, sum(items[i][1] for i in chosen), entry[0]))
    return [point.saved for point in _pareto(points)]


def frontier(profile: BlockOpProfile, *, max_points: int | None = None) -> list[FrontierPoint]:
    """The memory / avoided-recompute Pareto frontier of ``profile``'s block type, from saving nothing upwards.

    Args:
        profile: One block type's op profile.
        max_points: Thin the frontier to at most this many points (plus its ends); None keeps every point.
    """
    items = _items(profile)
    sets = _exact(items) if len(items) <= EXACT_ITEMS else _dynamic(items)
    points = [_point(profile, keys) for keys in sets]
    return points if max_points is None else _thinned(points, max_points)
