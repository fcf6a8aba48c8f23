"""Seed statistics: bootstrap intervals with hand-known answers and the band decision."""

import numpy as np
import pytest

from dlc_jax.experiments.stats import (
    Interval,
    mean_interval,
    noise_intervals,
    pair_matrix,
    paired_difference,
    ratio_stats,
    seed_band,
    t_quantile,
)


def _noise(runs: int, values) -> np.ndarray:
    """M [R, R, T]: every pair of distinct runs has KL ``values`` per step."""
    m = np.tile(np.asarray(values, float), (runs, runs, 1))
    m[np.arange(runs), np.arange(runs)] = np.nan
    return m


def test_band_decision_uses_the_whole_interval():
    assert Interval(1.5, 1.2, 1.9).versus(2.0) == "within"
    assert Interval(2.5, 2.1, 3.0).versus(2.0) == "outside"
    assert (
        Interval(1.8, 1.2, 2.6).versus(2.0) == "inconclusive"
    )  # the point alone would say "within"
    assert Interval(float("nan"), float("nan"), float("nan")).versus(2.0) == "inconclusive"


def test_identical_seeds_give_a_degenerate_interval():
    d = np.array([[0.1, 0.3], [0.1, 0.3], [0.1, 0.3]])
    n = _noise(3, [0.1, 0.1])
    rs = ratio_stats(d, n, [5, 10])
    np.testing.assert_allclose(rs.curve, [1.0, 3.0])
    np.testing.assert_allclose(rs.lo, [1.0, 3.0])
    np.testing.assert_allclose(rs.hi, [1.0, 3.0])
    assert (rs.max.point, rs.max.lo, rs.max.hi, rs.max.n) == pytest.approx((3.0, 3.0, 3.0, 3))
    assert rs.max_from(10).point == pytest.approx(3.0) and np.isnan(rs.max_from(11).point)


def test_interval_covers_the_seed_spread_and_drops_zero_noise_steps():
    d = np.array([[0.0, 0.1, 0.4], [0.0, 0.3, 0.2]])
    n = _noise(3, [0.0, 0.1, 0.1])
    rs = ratio_stats(d, n, [0, 5, 10])
    assert rs.steps == [5, 10]  # N = 0 at step 0: skipped
    np.testing.assert_allclose(rs.curve, [2.0, 3.0])
    # resampling 2 seeds: the step-5 mean is 1, 2 or 3 (x 1/0.1)
    assert rs.lo[0] == pytest.approx(1.0) and rs.hi[0] == pytest.approx(3.0)
    # max over steps per resample: {(0.1,0.4)->4, (0.3,0.2)->3, mixed->3} so the interval is [3, 4]
    assert rs.max.lo == pytest.approx(3.0) and rs.max.hi == pytest.approx(4.0)
    with pytest.raises(ValueError, match="do not line up"):
        ratio_stats(d, n, [0, 5])


def test_pair_matrix_and_t_interval_of_the_mean():
    m = pair_matrix({"a|b": [1.0, 3.0], "b|a": [3.0, 5.0], "a|c": [2.0, None]})
    assert m.shape == (3, 3, 2) and m[0, 1, 1] == 3.0 and np.isnan(m[0, 2, 1])
    assert np.isnan(m[0, 0, 0])  # no run is paired with itself
    mi = mean_interval([1.0, 1.0, 1.0, None])
    assert (mi.point, mi.lo, mi.hi, mi.n) == (1.0, 1.0, 1.0, 3)
    assert np.isnan(mean_interval([None]).point)
    # two runs: mean 5, sd 7.071, t(0.975, 1) = 12.706 -> half-width 63.53 (a percentile
    # bootstrap of two values would say [0, 10])
    mi = mean_interval([0.0, 10.0])
    assert mi.point == 5.0 and (mi.lo, mi.hi) == pytest.approx((5 - 63.53, 5 + 63.53), abs=0.01)
    assert [t_quantile(k) for k in (1, 2, 4, 9)] == [12.706, 4.303, 2.776, 2.262]
    assert t_quantile(60) == pytest.approx(2.000, abs=2e-3)


def test_no_interval_from_one_run():
    one = mean_interval([17.0])
    assert one.point == 17.0 and np.isnan(one.lo) and np.isnan(one.hi)
    assert one.fmt(1) == "17.0 (1 run, no interval)" and one.versus(2.0) == "inconclusive"
    rs = ratio_stats(np.array([[0.1, 0.3]]), _noise(3, [0.1, 0.1]), [5, 10])
    assert rs.max.point == pytest.approx(3.0) and np.isnan(rs.max.lo) and rs.max.n == 1
    diff = paired_difference([[0.1, 0.1]], [[0.3, 0.5]], _noise(3, [0.1, 0.1]))
    assert diff.point == pytest.approx(-4.0) and np.isnan(diff.lo)


def test_noise_interval_resamples_runs_not_pairs():
    # four on-policy runs, one of them (d) far from the other three: 3 pairs at 0.1, 3 at 1.0.
    # Drawing runs, a resample without d (p = (3/4)^4 = 0.32) has N = 0.1 exactly, so the lower
    # end is 0.1; resampling the 6 pairs as if independent needs all 6 draws from the near half
    # (p = 1/64 < 2.5%), so it would put the lower end at 0.25.
    m = _noise(4, [0.1])
    m[3, :3] = m[:3, 3] = 1.0
    iv = noise_intervals(m)[0]
    assert iv.point == pytest.approx(0.55) and iv.lo == pytest.approx(0.1) and iv.hi > 0.55
    # the same goes for the ratio: D = 0.1 in both seeds, N from 0.1 upward: R up to 1.0
    rs = ratio_stats(np.array([[0.1], [0.1]]), m, [5])
    assert rs.max.hi == pytest.approx(1.0) and rs.max.point == pytest.approx(0.1 / 0.55)
    assert noise_intervals(_noise(2, [0.3]))[0].fmt() == "0.30 (2 runs, no interval)"


def test_paired_difference_and_seed_band():
    n = _noise(2, [0.1, 0.1])
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
