"""Labels of the bench plot: placed so that no two overlap and none covers a point."""

import itertools

import pytest

from hf_ckpt.measure.labels import place_labels

#: Nothing here builds a model or config, runs autograd or starts a process (tests/release_guard.py checks it).
pytestmark = pytest.mark.any_release


def _boxes(points, sizes, offsets):
    return [(x + dx, y + dy, x + dx + w, y + dy + h) for (x, y), (w, h), (dx, dy) in zip(points, sizes, offsets)]


def _overlap(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.parametrize(
    "points",
    [
        [(100.0, 100.0)] * 4,  # the same point four times (full and offload measure alike)
        [(100.0, 100.0), (103.0, 101.0), (98.0, 99.0), (101.0, 97.0), (300.0, 50.0)],  # a cluster and one apart
        [(100.0 + i, 100.0) for i in range(8)],  # a row closer together than a label is wide
    ],
    ids=["identical", "cluster", "row"],
)
def test_labels_of_overlapping_points_do_not_overlap(points):
    sizes = [(40.0 + 5 * i, 9.0) for i in range(len(points))]  # e.g. "plan:0.5", "selective", ...
    marker = 4.0
    boxes = _boxes(points, sizes, place_labels(points, sizes, marker=marker))
    for a, b in itertools.combinations(boxes, 2):
        assert not _overlap(a, b), (a, b)
    for box, (x, y) in itertools.product(boxes, points):
        assert not _overlap(box, (x - marker, y - marker, x + marker, y + marker)), (box, (x, y))


def test_a_lone_label_sits_next_to_its_point():
    [(dx, dy)] = place_labels([(10.0, 10.0)], [(30.0, 8.0)], gap=3.0, marker=4.0)
    assert (dx, dy) == (7.0, 7.0)  # right-above, just clear of the marker


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="points and sizes"):
        place_labels([(0.0, 0.0)], [])
