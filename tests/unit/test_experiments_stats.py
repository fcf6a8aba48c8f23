"""Seed statistics: bootstrap intervals with hand-known answers and the band decision."""

import numpy as np
import pytest

from dlc_jax.experiments.stats import (
    Interval,
    mean_interval,
    paired_difference,
    ratio_stats,
    seed_band,
    unordered_pairs,
)


def test_band_decision_uses_the_whole_interval():
    assert Interval(1.5, 1.2, 1.9).versus(2.0) == "within"
    assert Interval(2.5, 2.1, 3.0).versus(2.0) == "outside"
    assert (
        Interval(1.8, 1.2, 2.6).versus(2.0) == "inconclusive"
    )  # the point alone would say "within"
    assert Interval(float("nan"), float("nan"), float("nan")).versus(2.0) == "inconclusive"


def test_identical_seeds_give_a_degenerate_interval():
    d = np.array([[0.1, 0.3], [0.1, 0.3], [0.1, 0.3]])
    n = np.array([[0.1, 0.1], [0.1, 0.1]])
    rs = ratio_stats(d, n, [5, 10])
    np.testing.assert_allclose(rs.curve, [1.0, 3.0])
    np.testing.assert_allclose(rs.lo, [1.0, 3.0])
    np.testing.assert_allclose(rs.hi, [1.0, 3.0])
    assert (rs.max.point, rs.max.lo, rs.max.hi, rs.max.n) == pytest.approx((3.0, 3.0, 3.0, 3))
    assert rs.max_from(10).point == pytest.approx(3.0) and np.isnan(rs.max_from(11).point)


def test_interval_covers_the_seed_spread_and_drops_zero_noise_steps():
    d = np.array([[0.0, 0.1, 0.4], [0.0, 0.3, 0.2]])
    n = np.array([[0.0, 0.1, 0.1], [0.0, 0.1, 0.1]])
    rs = ratio_stats(d, n, [0, 5, 10])
    assert rs.steps == [5, 10]  # N = 0 at step 0: skipped
    np.testing.assert_allclose(rs.curve, [2.0, 3.0])
    # resampling 2 seeds: the step-5 mean is 1, 2 or 3 (x 1/0.1)
    assert rs.lo[0] == pytest.approx(1.0) and rs.hi[0] == pytest.approx(3.0)
    # max over steps per resample: {(0.1,0.4)->4, (0.3,0.2)->3, mixed->3} so the interval is [3, 4]
    assert rs.max.lo == pytest.approx(3.0) and rs.max.hi == pytest.approx(4.0)
    with pytest.raises(ValueError, match="do not line up"):
        ratio_stats(d, n, [0, 5])


def test_pairs_are_merged_over_direction_and_mean_interval():
    rows = unordered_pairs({"a|b": [1.0, 3.0], "b|a": [3.0, 5.0], "a|c": [2.0, None]})
    np.testing.assert_allclose(rows[0], [2.0, 4.0])
    assert np.isnan(rows[1][1])
    mi = mean_interval([1.0, 1.0, 1.0, None])
    assert (mi.point, mi.lo, mi.hi, mi.n) == (1.0, 1.0, 1.0, 3)
    assert np.isnan(mean_interval([None]).point)
    mi = mean_interval([0.0, 10.0], seed=3)
    assert mi.point == 5.0 and mi.lo == 0.0 and mi.hi == 10.0


def test_paired_difference_and_seed_band():
    n = np.array([[0.1, 0.1]])
    a = np.array([[0.1, 0.1], [0.1, 0.1]])
    b = np.array([[0.3, 0.5], [0.3, 0.5]])
    diff = paired_difference(a, b, n)
    assert (diff.point, diff.lo, diff.hi) == pytest.approx((-4.0, -4.0, -4.0))
    mean, lo, hi = seed_band([[1.0, np.nan], [3.0, 2.0]])
    np.testing.assert_allclose(mean, [2.0, 2.0])
    np.testing.assert_allclose(lo, [1.0, 2.0])
    np.testing.assert_allclose(hi, [3.0, 2.0])


def test_bootstrap_band_of_three_seeds_spans_min_to_max():
    from dlc_jax.experiments.stats import bootstrap_band

    mean, lo, hi = bootstrap_band([[1.0, 2.0], [2.0, np.nan], [6.0, 4.0]])
    np.testing.assert_allclose(mean, [3.0, 3.0])
    # P(all three draws = the min) = 1/27 > 2.5%, so the percentile interval reaches min and max
    np.testing.assert_allclose(lo, [1.0, 2.0])
    np.testing.assert_allclose(hi, [6.0, 4.0])
    m1, l1, h1 = bootstrap_band([[0.5, 0.7]])
    np.testing.assert_allclose([m1, l1, h1], [[0.5, 0.7]] * 3)


def test_rank_correlation():
    from dlc_jax.experiments.claims import rank_correlation

    up = rank_correlation([(1, 10), (2, 20), (3, 25), (4, 40), (5, 41)])
    assert up.point == pytest.approx(1.0) and up.lo == pytest.approx(1.0)
    down = rank_correlation([(1, 5), (2, 4), (3, 3), (4, 2)])
    assert down.point == pytest.approx(-1.0)
    assert np.isnan(rank_correlation([(1, 2), (2, 3)]).point)  # too few runs
