"""Which ops of a block to save: the memory / recompute frontier of one block type.

**Items.** Only ops that cost recompute FLOPs are worth saving (saving any other op adds memory and avoids no
FLOPs), and only those no later op writes into in place. Candidates whose outputs share a storage (views of one
another) are merged into one item, since keeping either keeps the storage: an item's weight is the bytes of its
distinct fresh storages, its value the recompute FLOPs it avoids. Items are independent: SAC's recompute runs
every op that is not saved, whatever else is saved, so values add up (see :mod:`._profile`).

**Frontier.** For each byte cap, the most FLOPs a set of items within the cap avoids: a 0/1 knapsack.

* With at most :data:`EXACT_ITEMS` items (a transformer block has 5 to 10: the projections, the attention
  matmuls or the fused attention op, the MLP matmuls) every subset is enumerated and the Pareto frontier is
  **exact**.
* With more, a dynamic program over byte weights rounded *up* to ``unit = total bytes / QUANTA`` gives, for every
  cap ``C``, a set that fits ``C`` (rounding up never understates memory) and avoids at least as many FLOPs as
  the best set that fits ``C - n * unit`` (each of the ``n`` items loses under one unit): **within n units of
  exact**, i.e. at most ``n / QUANTA`` of the block's savable bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ._profile import BlockOpProfile

#: Up to this many items, the frontier is found by enumerating every subset.
EXACT_ITEMS = 16
#: Byte resolution of the dynamic program used beyond :data:`EXACT_ITEMS`.
QUANTA = 4096


@dataclass(frozen=True)
class FrontierPoint:
    """One Pareto-optimal op set of a block type: ``saved`` keys, the bytes they keep and the FLOPs they avoid."""

    saved: tuple[str, ...]
    bytes: int
    avoided_flops: int


def _items(profile: BlockOpProfile) -> list[tuple[tuple[str, ...], int, int]]:
    """(keys, bytes, avoided FLOPs) of each independent item."""
    candidates = [op for op in profile.ops if op.recompute_flops > 0 and not op.written and op.storages]
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
        items.append((keys, profile.saved_bytes(keys), profile.saved_flops(keys)))
    return items


def _pareto(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """Keep the points no other point beats (fewer or equal bytes and more avoided FLOPs), by increasing bytes."""
    points.sort(key=lambda p: (p.bytes, -p.avoided_flops, len(p.saved)))
    frontier: list[FrontierPoint] = []
    for point in points:
        if not frontier or point.avoided_flops > frontier[-1].avoided_flops:
            frontier.append(point)
    return frontier


def _exact(items: list[tuple[tuple[str, ...], int, int]]) -> list[FrontierPoint]:
    points = []
    for mask in range(1 << len(items)):
        keys: list[str] = []
        size = flops = 0
        for i, (item_keys, item_bytes, item_flops) in enumerate(items):
            if mask >> i & 1:
                keys.extend(item_keys)
                size += item_bytes
                flops += item_flops
        points.append(FrontierPoint(tuple(keys), size, flops))
    return _pareto(points)


def _dynamic(items: list[tuple[tuple[str, ...], int, int]]) -> list[FrontierPoint]:
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
    return _pareto(points)


def frontier(profile: BlockOpProfile) -> list[FrontierPoint]:
    """The memory / avoided-recompute Pareto frontier of ``profile``'s block type, from saving nothing upwards."""
    items = _items(profile)
    return _exact(items) if len(items) <= EXACT_ITEMS else _dynamic(items)
