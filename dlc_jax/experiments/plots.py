"""The report's PNG figures: per scenario D_t/N_t on both prefix sets, lag ESS, reward, lag std and
mismatch KL (seed means, bootstrap bands); the noise pairs; measured vs Gaussian ESS crossings."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dlc_jax.experiments.analysis import AnalysisConfig
from dlc_jax.experiments.arm_styles import LINE_STYLES, arm_key, arm_style
from dlc_jax.experiments.claims import ArmStats
from dlc_jax.experiments.results import NoiseThreshold, RunResult
from dlc_jax.experiments.stats import bootstrap_band

BAND_SERIES = ("ess_lag", "ell_std", "mismatch_k3", "reward")  # plotted as seed bands


def _aligned(runs: list[RunResult], key: str) -> tuple[list[int], np.ndarray]:
    """Series ``key`` of runs on the union of their steps: (steps, [S, T] with NaN gaps)."""
    steps = sorted({s for r in runs for s in r.steps})
    idx = {s: i for i, s in enumerate(steps)}
    out = np.full((len(runs), len(steps)), np.nan)
    for k, r in enumerate(runs):
        for s, v in zip(r.steps, r.get(key)):
            if isinstance(v, (int, float)) and math.isfinite(v):
                out[k, idx[s]] = v
    return steps, out


def _band_plot(ax, x, rows, st, label, *, positive=False):
    mean, lo, hi = bootstrap_band(rows)
    ok = np.isfinite(mean) & ((mean > 0) if positive else True)
    if not ok.any():
        return
    x = np.asarray(x)[ok]
    ax.plot(
        x, mean[ok], **_line(st), label=label, marker=st["marker"], ms=3, markevery=len(x) // 8 or 1
    )
    if rows.shape[0] > 1:
        ax.fill_between(x, lo[ok], hi[ok], color=st["color"], alpha=0.1, lw=0)


def _line(st: dict) -> dict:
    """The line keywords of an `arm_style`."""
    return {"ls": st["ls"], "color": st["color"], "lw": st["lw"]}


def _subplots(*grid, **kw):
    """A new figure and its axes, drawn by the file-only Agg backend (72 dpi)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*grid, dpi=72, **kw)


def _save(fig, path: Path, **layout) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout(**layout)
    fig.savefig(path)
    plt.close(fig)
    return path


def _finish(fig, ax, path: Path) -> Path:
    """Grid, legend, tight layout; saved to ``path`` and closed."""
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def _threshold_line(ax, y: float, label: str) -> None:
    ax.axhline(y, color="red", lw=1.2, ls="--", label=label)


def plot_scenario(
    scenario: str,
    by_arm: dict[str, list[RunResult]],
    stats: dict[str, ArmStats],
    path: Path,
    cfg: AnalysisConfig,
) -> Path:
    from matplotlib.ticker import FuncFormatter, LogLocator

    fig, axes = _subplots(2, 3, figsize=(17, 9.5))
    ax_ref, ax_own, ax_ess, ax_rew, ax_lag, ax_k3 = axes.ravel()
    for arm in sorted(by_arm, key=arm_key):
        runs, st = by_arm[arm], arm_style(arm)
        label = f"{arm} ({len(runs)} seeds)"
        a = stats.get(arm)
        for ax, rs in ((ax_ref, a.ref if a else None), (ax_own, a.own if a else None)):
            if rs is not None and len(rs.curve):
                marker = st["marker"] or "o"
                ax.plot(rs.steps, rs.curve, **_line(st), marker=marker, ms=4, label=label)
                ax.fill_between(rs.steps, rs.lo, rs.hi, color=st["color"], alpha=0.12, lw=0)
        for ax, key in zip((ax_ess, ax_lag, ax_k3, ax_rew), BAND_SERIES):
            if arm != "onpolicy" or key == "reward":  # on-policy runs have no lag or mismatch
                _band_plot(ax, *_aligned(runs, key), st, label, positive=key == "mismatch_k3")
    for ax, what in (
        (ax_ref, "fixed reference prefixes"),
        (ax_own, "each run's own sampled prefixes"),
    ):
        _threshold_line(ax, cfg.band, f"{cfg.band:g}x noise threshold (pass band)")
        ax.axhline(1.0, color="grey", lw=1.0, ls=":", label="1x noise (on-policy vs on-policy)")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=2))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.set_title(f"KL to on-policy / noise threshold, on {what}")
        ax.set_ylabel("D_t / N_t (ratio of KLs, unitless; log scale)")
    _threshold_line(ax_ess, cfg.ess_threshold, f"ESS = {cfg.ess_threshold:g} (resync trigger)")
    ax_ess.set_ylim(0, 1.05)
    ax_ess.set_title("lag ESS of exp(ell) (mean over seeds, 95% CI band)")
    ax_ess.set_ylabel("lag ESS (fraction of tokens, 0-1)")
    ax_rew.set_title("reward of the sampled rollouts (mean over seeds, 95% CI band)")
    ax_rew.set_ylabel("mean reward of the batch (fraction correct)")
    ax_lag.set_title("policy lag: std of ell = log p - log p_s")
    ax_lag.set_ylabel("std of ell over response tokens (nats)")
    ax_k3.set_yscale("log")
    ax_k3.set_title("conventional mismatch KL on the sampler's prefixes (k3)")
    ax_k3.set_ylabel("k3 estimate of KL(q || p) (nats per token; log)")
    for ax in axes.ravel():
        ax.set_xlabel("training step (optimizer updates)")
        ax.grid(alpha=0.3)
    for ax in (ax_ref, ax_ess):
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(
        f"scenario `{scenario}`: bands = bootstrap 95% intervals (over seeds and, for D_t/N_t, "
        "over the on-policy pairs too)"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, path, rect=(0, 0, 1, 0.96))


def plot_noise(noise: NoiseThreshold, path: Path) -> Path | None:
    if not noise.pairs:
        return None
    fig, ax = _subplots(figsize=(7, 4.5))
    for i, (k, v) in enumerate(sorted(noise.pairs.items())):
        ls, marker = LINE_STYLES[i % 8]
        y = [np.nan if x is None else x for x in v]
        label = k.replace("onpolicy__", "")
        ax.plot(noise.steps, y, ls=ls, marker=marker, ms=3, lw=1, alpha=0.7, label=label)
    ax.plot(noise.steps, noise.forward, color="black", lw=2.5, label="N_t (mean over pairs)")
    ax.set_xlabel("training step (optimizer updates)")
    ax.set_ylabel("KL(O_i || O_j) on reference prefixes (nats per token)")
    ax.set_title("noise threshold: KL between independent on-policy runs")
    return _finish(fig, ax, path)


def plot_crossings(rows: list[tuple[str, float, float]], path: Path) -> Path | None:
    """rows: (arm, Gaussian exp(-Var ell) first-below step, measured ESS first-below step)."""
    if not rows:
        return None
    fig, ax = _subplots(figsize=(6.5, 5.5))
    seen = set()
    arms = sorted({a for a, _, _ in rows}, key=arm_key)
    for arm, g, m in rows:
        st = arm_style(arm)
        dx = 0.12 * (arms.index(arm) - (len(arms) - 1) / 2)  # runs often cross at one step
        label, mk = None if arm in seen else arm, st["marker"] or "o"
        ax.scatter(g + dx, m + dx, color=st["color"], marker=mk, s=40, label=label, alpha=0.8)
        seen.add(arm)
    hi = max(max(g for _, g, _ in rows), max(m for _, _, m in rows)) * 1.1 + 1
    ax.plot([0, hi], [0, hi], "k--", lw=1, label="measured = Gaussian prediction")
    ax.set_xlabel("first step with exp(-Var ell) < 0.5 (Gaussian prediction, step)")
    ax.set_ylabel("first step with measured lag ESS < 0.5 (step)")
    ax.set_title(
        "lag ESS crossing 0.5: measured vs Gaussian\n(one point per run; arms offset "
        "slightly so equal steps stay visible)",
        fontsize=10,
    )
    return _finish(fig, ax, path)
