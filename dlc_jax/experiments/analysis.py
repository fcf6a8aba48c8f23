"""Per-run numbers of the report: D_t / N_t where N_t is measurably positive, the first step the
lag ESS falls below 0.5, and its Gaussian prediction (docs/CORRECTIONS.md §6): Var(ell) = a*k +
b*k^2 fitted against k = steps since the last sync, Var(k*) = ln 2 solved, step = sync step + k*."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dlc_jax.experiments.results import NoiseThreshold, RunResult

LN2 = math.log(2.0)


@dataclasses.dataclass(frozen=True)
class AnalysisConfig:
    """band: the pass band on D_t/N_t; min_noise: N_t at or below it is unmeasurable (step
    skipped); fit_points: points (k > 0) of the Var(ell) fit; final_frac: fraction of the last steps
    averaged for the final reward; min_stay_steps: logged steps the ESS must stay below the
    threshold to the end to count as "stays below", judged on the trailing median of ess_smooth
    steps (so one lucky batch does not reset the onset)."""

    ess_threshold: float = 0.5
    band: float = 2.0
    min_noise: float = 1e-9
    fit_points: int = 4
    final_frac: float = 0.1
    min_stay_steps: int = 3
    ess_smooth: int = 3


def _num(x) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(x)


def distance_ratio(run: RunResult, noise: NoiseThreshold, cfg: AnalysisConfig = AnalysisConfig()):
    """(steps, D_t / N_t) over the checkpoint steps present in both, N_t > min_noise."""
    n_by_step = {int(s): _num(v) for s, v in zip(noise.steps, noise.forward)}
    nd = [(int(s), n_by_step.get(int(s)), _num(d)) for s, d in zip(run.kl_steps, run.kl_forward)]
    kept = [(s, d / n) for s, n, d in nd if n is not None and d is not None and n > cfg.min_noise]
    return [s for s, _ in kept], [r for _, r in kept]


def first_below(steps, values, threshold) -> int | None:
    """First step whose value is < threshold (None values skipped); None if never."""
    for s, v in zip(steps, values):
        v = _num(v)
        if v is not None and v < threshold:
            return int(s)
    return None


def stays_below_from(steps, values, threshold, min_steps: int = 1) -> int | None:
    """First step from which all of at least ``min_steps`` later values are < threshold."""
    pairs = [(int(s), _num(v)) for s, v in zip(steps, values) if _num(v) is not None]
    if not pairs or pairs[-1][1] >= threshold:
        return None
    start, count = pairs[-1][0], 0
    for s, v in reversed(pairs):
        if v >= threshold:
            break
        start, count = s, count + 1
    return start if count >= min_steps else None


def trailing_median(values, window: int) -> list[float | None]:
    """Median of the last ``window`` non-missing values up to each position (fewer at the start)."""
    out: list[float | None] = []
    seen: list[float] = []
    for v in values:
        x = _num(v)
        if x is not None:
            seen.append(x)
        out.append(float(np.median(seen[-window:])) if x is not None and seen else None)
    return out


def fit_lag_variance(k, var) -> tuple[float, float] | None:
    """Least-squares (a, b) >= 0 of var = a*k + b*k^2 (k > 0); None when there is nothing to fit."""
    k, var = np.asarray(k, np.float64), np.asarray(var, np.float64)
    ok = (k > 0) & np.isfinite(var)
    k, var = k[ok], var[ok]
    if k.size == 0 or not np.any(var > 0):
        return None
    cands = []
    if k.size >= 2:
        (a, b), *_ = np.linalg.lstsq(np.stack([k, k * k], 1), var, rcond=None)
        if a >= 0 and b >= 0:
            cands.append((float(a), float(b)))
    a1 = float(np.dot(k, var) / np.dot(k, k))  # linear only (random walk)
    b1 = float(np.dot(k * k, var) / np.dot(k * k, k * k))  # quadratic only (coherent drift)
    cands += [(max(a1, 0.0), 0.0), (0.0, max(b1, 0.0))]
    resid = [float(np.sum((a * k + b * k * k - var) ** 2)) for a, b in cands]
    return cands[int(np.argmin(resid))]


def solve_crossing(a: float, b: float, target: float = LN2) -> float | None:
    """Positive k with a*k + b*k^2 = target; None if the fitted variance never grows."""
    if a <= 0 and b <= 0:
        return None
    # numerically stable root of b k^2 + a k - target = 0 (no cancellation when b is tiny)
    return float(2 * target / (a + math.sqrt(a * a + 4 * max(b, 0.0) * target)))


def predicted_crossing(run: RunResult, cfg: AnalysisConfig = AnalysisConfig()) -> float | None:
    """Gaussian-predicted step the lag ESS reaches ess_threshold (fit before the first resync)."""
    lags, stds = run.get("version_lag"), run.get("ell_std")
    ks, vs, sync_step, prev = [], [], None, None
    for s, k, sd in zip(run.steps, lags, stds):
        k, sd = _num(k), _num(sd)
        if k is None or sd is None:
            continue
        if prev is not None and k < prev:
            break  # resync: the first window ended
        prev = k
        if k > 0:
            if sync_step is None:
                sync_step = s - k
            ks.append(k)
            vs.append(sd * sd)
            if len(ks) >= cfg.fit_points:
                break
    fit = fit_lag_variance(ks, vs)
    if fit is None:
        return None
    k_star = solve_crossing(*fit, target=-math.log(cfg.ess_threshold))
    return None if k_star is None or sync_step is None else float(sync_step + k_star)


def final_value(values, frac: float, *, first: bool = False) -> float | None:
    """Mean of the last (or ``first``) ``ceil(frac * n)`` (at least 1) non-missing values."""
    vals = [x for x in (_num(v) for v in values) if x is not None]
    if not vals:
        return None
    n = max(1, math.ceil(frac * len(vals)))
    return float(np.mean(vals[:n] if first else vals[-n:]))


@dataclasses.dataclass
class RunSummary:
    """One table row."""

    name: str
    arm: str
    scenario: str
    max_ratio: float | None
    max_ratio_step: int | None
    ess_first_below: int | None
    ess_stays_below_from: int | None
    ess_predicted: float | None
    gaussian_first_below: int | None
    resyncs: int | None
    final_reward: float | None
    max_ratio_after_ess_stays_below: float | None


def summarize(
    run: RunResult, noise: NoiseThreshold | None, cfg: AnalysisConfig = AnalysisConfig()
) -> RunSummary:
    rs, rr = distance_ratio(run, noise, cfg) if noise is not None else ([], [])
    ess = run.get("ess_lag")
    stays = stays_below_from(
        run.steps, trailing_median(ess, cfg.ess_smooth), cfg.ess_threshold, cfg.min_stay_steps
    )
    after = [r for s, r in zip(rs, rr) if stays is not None and s >= stays]
    res = [x for x in (_num(v) for v in run.get("resyncs")) if x is not None]
    return RunSummary(
        name=run.name,
        arm=run.arm,
        scenario=run.scenario,
        max_ratio=max(rr) if rr else None,
        max_ratio_step=rs[int(np.argmax(rr))] if rr else None,
        ess_first_below=first_below(run.steps, ess, cfg.ess_threshold),
        ess_stays_below_from=stays,
        ess_predicted=predicted_crossing(run, cfg),
        gaussian_first_below=first_below(run.steps, run.get("ess_gaussian"), cfg.ess_threshold),
        resyncs=int(max(res)) if res else None,
        final_reward=final_value(run.get("reward"), cfg.final_frac),
        max_ratio_after_ess_stays_below=max(after) if after else None,
    )
