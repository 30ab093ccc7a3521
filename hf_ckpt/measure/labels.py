"""Where to put the labels of a scatter plot so that no two overlap and none covers a point.

Greedy, in the order given: each label takes the first candidate position (right-above, right-below, left-above,
left-below of its point, then the same further up and down in steps of one label height) whose box overlaps
neither a label already placed nor any point. Coordinates are in one unit for everything (points of the figure,
for :func:`hf_ckpt.measure.report.plot_tradeoff`), y pointing up.
"""

from __future__ import annotations

from typing import Sequence

Box = tuple[float, float, float, float]  # x0, y0, x1, y1


def _overlaps(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _candidates(width: float, height: float, gap: float, rings: int) -> list[tuple[float, float]]:
    """Offsets of a label box's lower-left corner from its point, nearest first."""
    right, left = gap, -gap - width
    above, below = gap, -gap - height
    offsets = []
    for ring in range(rings):
        step = ring * (height + gap)
        offsets += [(right, above + step), (right, below - step), (left, above + step), (left, below - step)]
    return offsets


def place_labels(
    points: Sequence[tuple[float, float]],
    sizes: Sequence[tuple[float, float]],
    *,
    gap: float = 3.0,
    marker: float = 4.0,
    rings: int = 12,
) -> list[tuple[float, float]]:
    """The offset of each label's lower-left corner from its point, such that the labels do not overlap.

    Args:
        points: Where each point is.
        sizes: ``(width, height)`` of each label, in the same unit.
        gap: Space between a point and its label, and between stacked labels.
        marker: Half the size of a point's marker: no label covers the square of this half-size around a point.
        rings: How many steps up and down to try before giving up on a label (it then takes the last candidate).

    Returns:
        ``[(dx, dy), ...]``, one per point: the label's box is ``(x + dx, y + dy)`` to
        ``(x + dx + width, y + dy + height)``.
    """
    if len(points) != len(sizes):
        raise ValueError(f"points and sizes must have the same length; got {len(points)} and {len(sizes)}")
    obstacles: list[Box] = [(x - marker, y - marker, x + marker, y + marker) for x, y in points]
    placed: list[Box] = []
    offsets = []
    for (x, y), (width, height) in zip(points, sizes):
        candidates = _candidates(width, height, gap + marker, rings)
        chosen = candidates[-1]
        for dx, dy in candidates:
            box = (x + dx, y + dy, x + dx + width, y + dy + height)
            if not any(_overlaps(box, other) for other in (*obstacles, *placed)):
                chosen = (dx, dy)
                break
        placed.append((x + chosen[0], y + chosen[1], x + chosen[0] + width, y + chosen[1] + height))
        offsets.append(chosen)
    return offsets
