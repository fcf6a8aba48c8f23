"""Seed statistics for the report: 95% intervals over *runs* and the "within 2x noise" decision
(docs/experiments/README.md, "Intervals"); an arm's ratio curve ``R_t = mean_s D_t(s) / mean_pairs
N_t(i, j)`` is summarized by ``max_t R_t``."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np

N_BOOT = 2000


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate with its 95% interval (``n``: how many runs it came from)."""

    point: float
    lo: float
    hi: float
    n: int = 0

    def fmt(self, nd: int = 2) -> str:
        """``point [lo, hi]``, or the point alone when there is no interval."""
        if not math.isfinite(self.point):
            return "—"
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            return f"{self.point:.{nd}f} ({self.n} run{'s' if self.n != 1 else ''}, no interval)"
        return f"{self.point:.{nd}f} [{self.lo:.{nd}f}, {self.hi:.{nd}f}]"

    def versus(self, band: float) -> str:
        """'within' / 'outside' / 'inconclusive': the whole interval <= band / > band / neither."""
        if not math.isfinite(self.lo) or not math.isfinite(self.hi):
            return "inconclusive"
        if self.hi <= band:
            return "within"
        if self.lo > band:
            return "outside"
        return "inconclusive"


NAN_INTERVAL = Interval(float("nan"), float("nan"), float("nan"), 0)


def _floats(vals) -> list[float]:
    return [float("nan") if v is None else float(v) for v in vals]


# Student t 0.975 quantiles by degrees of freedom (1..30); beyond, the Cornish-Fisher expansion.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
Z_95 = 1.959964  # two-sided 95% normal quantile


def t_quantile(df: int) -> float:
    """The two-sided 95% Student t quantile t(0.975, df), df >= 1."""
    if df < 1:
        raise ValueError(f"t_quantile: df must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = Z_95
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df * df)


def mean_interval(values) -> Interval:
    """Mean of ``values`` (one per run, NaNs dropped) with a Student t 95% interval."""
    x = np.asarray(_floats(values), np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return NAN_INTERVAL
    m = float(x.mean())
    if x.size < 2:
        return Interval(m, float("nan"), float("nan"), 1)
    half = t_quantile(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return Interval(m, m - half, m + half, int(x.size))


@dataclasses.dataclass
class RatioStats:
    """Per checkpoint ``steps``: ``curve`` and its ``lo``/``hi`` band; ``max`` = max_t R_t."""

    steps: list[int]
    curve: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    max: Interval

    def max_from(self, step: int) -> Interval:
        """max_t R_t over t >= step from the point/lo/hi curves (a conservative envelope)."""
        idx = [i for i, s in enumerate(self.steps) if s >= step]
        if not idx:
            return NAN_INTERVAL
        point, lo, hi = (float(np.max(x[idx])) for x in (self.curve, self.lo, self.hi))
        return Interval(point, lo, hi, self.max.n)


def pair_matrix(pairs: dict[str, list]) -> np.ndarray:
    """``{"a|b": KL_t(a || b)}`` -> M [R, R, T] by sorted name (NaN where not measured)."""
    names = sorted({n for key in pairs for n in key.split("|")})
    if not names:
        return np.zeros((0, 0, 0))
    m = np.full((len(names), len(names), max(len(v) for v in pairs.values())), np.nan)
    for key, vals in pairs.items():
        a, b = key.split("|")
        m[names.index(a), names.index(b), : len(vals)] = _floats(vals)
    return m


def _noise_of(m: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """N_t [..., T] of the drawn runs ``idx`` [..., R]: mean of M over distinct-run pairs."""
    sub = m[idx[..., :, None], idx[..., None, :]]  # [..., R, R, T]
    ok = (idx[..., :, None] != idx[..., None, :])[..., None] & np.isfinite(sub)
    total = np.where(ok, sub, 0.0).sum(axis=(-3, -2))
    count = ok.sum(axis=(-3, -2))
    with np.errstate(all="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def noise_curve(m: np.ndarray) -> np.ndarray:
    """N_t: the mean over ordered pairs of distinct runs (both directions) -> [T]."""
    return _noise_of(m, np.arange(m.shape[0]))


def noise_intervals(m: np.ndarray, *, n_boot: int = N_BOOT, seed: int = 0) -> list[Interval]:
    """N_t per step with a cluster-bootstrap 95% interval over the on-policy *runs*."""
    if m.shape[0] < 2:
        return []
    point = noise_curve(m)
    if m.shape[0] < 3:  # two runs: one pair, nothing to resample
        return [Interval(float(p), float("nan"), float("nan"), 2) for p in point]
    rng = np.random.default_rng(seed)
    boots = _noise_of(m, rng.integers(0, m.shape[0], (n_boot, m.shape[0])))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = np.nanpercentile(boots, 2.5, axis=0), np.nanpercentile(boots, 97.5, axis=0)
    return [Interval(float(p), float(a), float(b), m.shape[0]) for p, a, b in zip(point, lo, hi)]


def _keep_steps(d: np.ndarray, m: np.ndarray, min_noise: float) -> np.ndarray:
    off = ~np.eye(m.shape[0], dtype=bool)
    finite = np.isfinite(m[off]).all(0) if m.shape[0] >= 2 else np.zeros(m.shape[2], bool)
    with np.errstate(all="ignore"):
        return finite & (noise_curve(m) > min_noise) & np.isfinite(d).all(0)


def ratio_stats(
    d_rows, noise, steps, *, n_boot: int = N_BOOT, seed: int = 0, min_noise: float = 1e-9
) -> RatioStats:
    """R_t = mean_s D_t(s) / N_t and max_t R_t with cluster-bootstrap intervals: each resample draws
    the arm's runs d_rows [S, T] and the on-policy runs of ``noise`` [R, R, T] (``pair_matrix``)
    with replacement. Checkpoints where N_t is not measurably positive are dropped."""
    d = np.asarray(d_rows, np.float64)
    m = np.asarray(noise, np.float64)
    if d.ndim != 2 or m.ndim != 3 or d.shape[1] != m.shape[2] or d.shape[1] != len(steps):
        raise ValueError(
            f"ratio_stats: D {d.shape}, N {m.shape} and {len(steps)} steps do not line up"
        )
    keep = _keep_steps(d, m, min_noise)
    d, m = d[:, keep], m[:, :, keep]
    st = [int(s) for s, k in zip(steps, keep) if k]
    if d.shape[0] == 0 or m.shape[0] < 2 or d.shape[1] == 0:
        empty = np.zeros(0)
        return RatioStats(st, empty, empty, empty, NAN_INTERVAL)
    curve = d.mean(0) / noise_curve(m)
    if d.shape[0] < 2:
        nan = np.full_like(curve, np.nan)
        return RatioStats(
            st, curve, nan, nan.copy(), Interval(float(curve.max()), math.nan, math.nan, 1)
        )
    boots = _ratio_boots(d, m, n_boot, seed, min_noise)  # [B, T]
    lo, hi = np.percentile(boots, 2.5, axis=0), np.percentile(boots, 97.5, axis=0)
    mx_lo, mx_hi = np.percentile(boots.max(1), [2.5, 97.5])
    mx = Interval(float(curve.max()), float(mx_lo), float(mx_hi), int(d.shape[0]))
    return RatioStats(st, curve, lo, hi, mx)


def _ratio_boots(d, m, n_boot, seed, min_noise, other=None) -> np.ndarray:
    """[B, T] resampled D/N (minus ``other``'s D/N on the same seed draws when given)."""
    rng = np.random.default_rng(seed)
    si = rng.integers(0, d.shape[0], (n_boot, d.shape[0]))
    nb = np.maximum(_noise_of(m, rng.integers(0, m.shape[0], (n_boot, m.shape[0]))), min_noise)
    out = d[si].mean(1) / nb
    if other is not None:
        out = out.max(1, keepdims=True) - (other[si].mean(1) / nb).max(1, keepdims=True)
    return out[np.isfinite(out).all(1)]


def paired_difference(a_rows, b_rows, noise, *, n_boot: int = N_BOOT, seed: int = 0) -> Interval:
    """max_t R_t(a) - max_t R_t(b) for arms of the same seeds, their runs drawn jointly."""
    a, b, m = (np.asarray(x, np.float64) for x in (a_rows, b_rows, noise))
    if a.shape != b.shape or a.size == 0 or m.ndim != 3 or m.shape[0] < 2:
        return NAN_INTERVAL
    nm = noise_curve(m)
    point = float((a.mean(0) / nm).max() - (b.mean(0) / nm).max())
    if a.shape[0] < 2:
        return Interval(point, float("nan"), float("nan"), 1)
    diff = _ratio_boots(a, m, n_boot, seed, 1e-9, other=b)[:, 0]
    lo, hi = (float(np.percentile(diff, q)) for q in (2.5, 97.5))
    return Interval(point, lo, hi, int(a.shape[0]))


def bootstrap_band(rows, *, n_boot: int = N_BOOT, seed: int = 0):
    """(mean, lo, hi) per step of rows [S, T]: mean over seeds, percentile-bootstrap 95%."""
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
    """Held-out accuracy at the last checkpoint minus at step 0, t interval over runs."""
    c = f"{key}_correct"
    return mean_interval([float(np.mean(h[c][-1]) - np.mean(h[c][0])) for h in heldout_runs if h])
