"""Seed statistics for the report: bootstrap 95% intervals and the "within 2x noise" decision.

An arm run with sampling seed s has a distance curve D_t(s) (mean KL to the on-policy runs of the
other
seeds); the on-policy runs give pair curves N_t(i, j). The arm's ratio curve is
``R_t = mean_s D_t(s) / mean_pairs N_t(i, j)`` and its summary ``max_t R_t``. The bootstrap
resamples the
arm's seeds and the on-policy pairs (unordered; both directions averaged), each with replacement,
and
recomputes the curve: the 2.5/97.5 percentiles give the intervals. With three seeds and three pairs
an
interval is coarse; it is still the honest amount of evidence, and the decision uses it:

* ``within``: the whole interval of max_t R_t is <= band,
* ``outside``: the whole interval is > band,
* ``inconclusive``: the interval straddles the band.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np

N_BOOT = 2000


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap 95% interval (``n``: how many units it was resampled
    from)."""

    point: float
    lo: float
    hi: float
    n: int = 0

    def fmt(self, nd: int = 2) -> str:
        if not math.isfinite(self.point):
            return "—"
        return f"{self.point:.{nd}f} [{self.lo:.{nd}f}, {self.hi:.{nd}f}]"

    def versus(self, band: float) -> str:
        """'within' / 'outside' / 'inconclusive' for the band (see the module docstring)."""
        if not math.isfinite(self.lo) or not math.isfinite(self.hi):
            return "inconclusive"
        if self.hi <= band:
            return "within"
        if self.lo > band:
            return "outside"
        return "inconclusive"


NAN_INTERVAL = Interval(float("nan"), float("nan"), float("nan"), 0)


def unordered_pairs(pairs: dict[str, list]) -> np.ndarray:
    """``{"a|b": [...], "b|a": [...]}`` -> rows [P, T], one per unordered pair (both directions
    averaged)."""
    rows: dict[tuple[str, str], list[np.ndarray]] = {}
    for key, vals in pairs.items():
        a, b = key.split("|")
        rows.setdefault(tuple(sorted((a, b))), []).append(np.asarray(_floats(vals)))  # type: ignore[arg-type]
    return (
        np.stack([np.mean(v, axis=0) for _, v in sorted(rows.items())])
        if rows
        else np.zeros((0, 0))
    )


def _floats(vals) -> list[float]:
    return [float("nan") if v is None else float(v) for v in vals]


def mean_interval(values, *, n_boot: int = N_BOOT, seed: int = 0) -> Interval:
    """Mean of ``values`` (NaNs dropped) with a percentile bootstrap interval."""
    x = np.asarray(_floats(values), np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return NAN_INTERVAL
    rng = np.random.default_rng(seed)
    boots = x[rng.integers(0, x.size, (n_boot, x.size))].mean(axis=1)
    return Interval(
        float(x.mean()),
        float(np.percentile(boots, 2.5)),
        float(np.percentile(boots, 97.5)),
        int(x.size),
    )


@dataclasses.dataclass
class RatioStats:
    """Per checkpoint: ``curve`` (point), ``lo``/``hi`` (bootstrap band); ``max`` = max_t R_t with
    its
    interval; ``steps`` the checkpoint steps used."""

    steps: list[int]
    curve: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    max: Interval

    def max_from(self, step: int, *, d=None, n=None) -> Interval:
        """max_t R_t over checkpoints t >= step (from the stored band: point, lo, hi of the max are
        the
        max of the point/lo/hi curves, a conservative envelope)."""
        idx = [i for i, s in enumerate(self.steps) if s >= step]
        if not idx:
            return NAN_INTERVAL
        return Interval(
            float(np.max(self.curve[idx])),
            float(np.max(self.lo[idx])),
            float(np.max(self.hi[idx])),
            self.max.n,
        )


def ratio_stats(
    d_rows, n_rows, steps, *, n_boot: int = N_BOOT, seed: int = 0, min_noise: float = 1e-9
) -> RatioStats:
    """Bootstrap of R_t = mean_s D_t(s) / mean_p N_t(p) and of max_t R_t.

    d_rows: [S, T] an arm's distance per seed; n_rows: [P, T] noise per on-policy pair; steps: [T].
    Checkpoints where the mean noise is not measurably positive are dropped."""
    d = np.asarray(d_rows, np.float64)
    n = np.asarray(n_rows, np.float64)
    if d.ndim != 2 or n.ndim != 2 or d.shape[1] != n.shape[1] or d.shape[1] != len(steps):
        raise ValueError(
            f"ratio_stats: D {d.shape}, N {n.shape} and {len(steps)} steps do not line up"
        )
    keep = np.isfinite(n).all(0) & (np.nanmean(n, 0) > min_noise) & np.isfinite(d).all(0)
    d, n = d[:, keep], n[:, keep]
    st = [int(s) for s, k in zip(steps, keep) if k]
    if d.shape[0] == 0 or n.shape[0] == 0 or d.shape[1] == 0:
        empty = np.zeros(0)
        return RatioStats(st, empty, empty, empty, NAN_INTERVAL)
    curve = d.mean(0) / n.mean(0)
    rng = np.random.default_rng(seed)
    di = rng.integers(0, d.shape[0], (n_boot, d.shape[0]))
    ni = rng.integers(0, n.shape[0], (n_boot, n.shape[0]))
    boots = d[di].mean(1) / np.maximum(n[ni].mean(1), min_noise)  # [B, T]
    lo, hi = np.percentile(boots, 2.5, axis=0), np.percentile(boots, 97.5, axis=0)
    mx = boots.max(1)
    return RatioStats(
        st,
        curve,
        lo,
        hi,
        Interval(
            float(curve.max()),
            float(np.percentile(mx, 2.5)),
            float(np.percentile(mx, 97.5)),
            int(d.shape[0]),
        ),
    )


def paired_difference(a_rows, b_rows, n_rows, *, n_boot: int = N_BOOT, seed: int = 0) -> Interval:
    """max_t R_t(a) - max_t R_t(b), bootstrapping seeds jointly (a and b ran with the same seeds,
    row i
    of each is seed i) and the noise pairs."""
    a, b, n = (np.asarray(x, np.float64) for x in (a_rows, b_rows, n_rows))
    if a.shape != b.shape or a.size == 0 or n.size == 0:
        return NAN_INTERVAL
    nm = n.mean(0)
    point = float((a.mean(0) / nm).max() - (b.mean(0) / nm).max())
    rng = np.random.default_rng(seed)
    si = rng.integers(0, a.shape[0], (n_boot, a.shape[0]))
    ni = rng.integers(0, n.shape[0], (n_boot, n.shape[0]))
    nb = n[ni].mean(1)
    diff = (a[si].mean(1) / nb).max(1) - (b[si].mean(1) / nb).max(1)
    return Interval(
        point, float(np.percentile(diff, 2.5)), float(np.percentile(diff, 97.5)), int(a.shape[0])
    )


def bootstrap_band(rows, *, n_boot: int = N_BOOT, seed: int = 0):
    """(mean, lo, hi) per step of rows [S, T]: the mean over seeds and its percentile-bootstrap 95%
    interval (seeds resampled with replacement; NaN-aware). With 3 seeds it spans min..max."""
    x = np.asarray(rows, np.float64)
    with warnings.catch_warnings():  # all-NaN columns (a step no seed logged) stay NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(x, 0)
        if x.shape[0] < 2:
            return mean, mean.copy(), mean.copy()
        idx = np.random.default_rng(seed).integers(0, x.shape[0], (n_boot, x.shape[0]))
        boots = np.nanmean(x[idx], axis=1)  # [B, T]
        return mean, np.nanpercentile(boots, 2.5, axis=0), np.nanpercentile(boots, 97.5, axis=0)


def seed_band(rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, min, max) over seeds per step of rows [S, T] (NaN-aware): the plotted seed band."""
    x = np.asarray(rows, np.float64)
    with np.errstate(all="ignore"):
        return np.nanmean(x, 0), np.nanmin(x, 0), np.nanmax(x, 0)


def learning_delta(heldout_runs: list[dict], key: str = "sampled") -> Interval:
    """Held-out accuracy at the last checkpoint minus at step 0, mean over runs, with a two-level
    percentile bootstrap (runs, then prompts within each run, both with replacement): the interval
    covers both the seed-to-seed spread and the finite prompt set."""
    rows = [
        np.asarray(h[f"{key}_correct"][-1], float) - np.asarray(h[f"{key}_correct"][0], float)
        for h in heldout_runs
        if h
    ]
    if not rows:
        return mean_interval([])
    per = np.stack(rows)  # [runs, prompts]
    rng = np.random.default_rng(7)
    n_boot = 2000
    ri = rng.integers(0, per.shape[0], (n_boot, per.shape[0]))
    pi = rng.integers(0, per.shape[1], (n_boot, per.shape[0], per.shape[1]))
    boots = np.take_along_axis(per[ri], pi, axis=2).mean(axis=(1, 2))
    return Interval(
        float(per.mean()),
        float(np.percentile(boots, 2.5)),
        float(np.percentile(boots, 97.5)),
        int(per.shape[0]),
    )
