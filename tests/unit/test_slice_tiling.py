"""`sliced_push.SliceTiling`: the boxes of a sliced push must tile a tensor exactly (in bounds, no
overlap, volumes adding up to the tensor's)."""

from __future__ import annotations

import pytest

from dlc_jax.sampler.push.sliced import SliceTiling
from dlc_jax.sampler.push.weight_checks import PushError


def _verified(t: SliceTiling, start, stop) -> None:
    t.covered += t.add(start, stop)


def test_exact_tiling_is_complete():
    t = SliceTiling("w", (4, 6))
    for start, stop in [((0, 0), (2, 6)), ((2, 0), (4, 3)), ((2, 3), (4, 6))]:
        assert not t.complete
        _verified(t, start, stop)
    assert t.complete and t.covered == 24


@pytest.mark.parametrize(
    "start, stop, why",
    [
        ((1, 5), (3, 6), "overlaps"),  # overlaps the first box in both dimensions
        ((2, 0), (5, 6), "out of bounds"),
        ((0, 6), (2, 7), "out of bounds"),
        ((3, 1), (3, 2), "empty"),
        ((0,), (4,), "rank"),
    ],
)
def test_bad_boxes_are_refused(start, stop, why):
    t = SliceTiling("w", (4, 6))
    _verified(t, (0, 0), (2, 6))
    with pytest.raises(PushError, match=why):
        t.add(start, stop)
    assert len(t.boxes) == 1


def test_touching_boxes_do_not_overlap_and_a_gap_stays_incomplete():
    t = SliceTiling("b", (10,))
    _verified(t, (0,), (4,))
    _verified(t, (4,), (9,))  # touches [0, 4): fine
    assert not t.complete and t.covered == 9
