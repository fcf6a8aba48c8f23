"""``report.md`` + PNG plots from an experiment's run results (everything computed, nothing typed).

Per scenario: one figure with the ratio D_t/N_t on the reference prefixes and on the runs' own
prefixes
(mean over seeds with its bootstrap 95% band, labelled 1x and 2x noise lines), the lag ESS, the
reward,
the lag std and the sampler-prefix mismatch KL (mean over seeds with its bootstrap 95% band). One
figure
with the noise pairs, one with measured vs Gaussian ESS crossings. A table per scenario and a
verdict
per claim (see claims.py), with the intervals behind it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dlc_jax.experiments.analysis import AnalysisConfig, summarize
from dlc_jax.experiments.claims import ArmStats, arm_stats, claims
from dlc_jax.experiments.results import NoiseThreshold, RunResult, load_results
from dlc_jax.experiments.stats import bootstrap_band, mean_interval

# Order and style of arms in tables and plots; unknown arms go last in name order.
ARM_ORDER = (
    "onpolicy",
    "naive",
    "tis",
    "mis",
    "score_centering",
    "score_centering_tis",
    "ppo_clip",
    "decoupled_ppo",
    "m2po",
    "vcpo",
    "dlc",
    "dlc_noresync",
)
_COLOURS = {
    "naive": "tab:orange",
    "tis": "tab:green",
    "mis": "tab:red",
    "score_centering": "tab:brown",
    "score_centering_tis": "tab:olive",
    "ppo_clip": "tab:pink",
    "decoupled_ppo": "tab:gray",
    "m2po": "tab:cyan",
    "vcpo": "gold",
    "dlc": "tab:blue",
    "dlc_noresync": "tab:purple",
}
_STYLES = (
    ("-", "o"),
    ("--", "s"),
    ("-.", "^"),
    (":", "D"),
    ("-", "v"),
    ("--", "P"),
    ("-.", "X"),
    (":", "*"),
)


def _arm_key(arm: str):
    return (ARM_ORDER.index(arm), arm) if arm in ARM_ORDER else (len(ARM_ORDER), arm)


def arm_style(arm: str) -> dict:
    """Colour, line style and marker of an arm: every known arm has its own colour, and neighbours
    in ARM_ORDER differ in line style and marker too."""
    if arm == "onpolicy":
        return {"color": "black", "ls": "-", "marker": None, "lw": 2.2}
    i = ARM_ORDER.index(arm) if arm in ARM_ORDER else len(ARM_ORDER) + sum(map(ord, arm)) % 8
    ls, mk = _STYLES[i % len(_STYLES)]
    return {"color": _COLOURS.get(arm, "tab:olive"), "ls": ls, "marker": mk, "lw": 1.5}


def _fmt(x, nd=2):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if isinstance(x, float):
        if x != 0 and (abs(x) >= 1e4 or abs(x) < 10 ** (-nd)):
            return f"{x:.{nd}e}"
        return f"{x:.{nd}f}"
    return str(x)


def _aligned(runs: list[RunResult], key: str) -> tuple[list[int], np.ndarray]:
    """Series ``key`` of several runs on the union of their steps: (steps, [S, T] with NaN gaps)."""
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
        x,
        mean[ok],
        ls=st["ls"],
        color=st["color"],
        lw=st["lw"],
        label=label,
        marker=st["marker"],
        ms=3,
        markevery=max(1, len(x) // 8),
    )
    if rows.shape[0] > 1:
        ax.fill_between(x, lo[ok], hi[ok], color=st["color"], alpha=0.1, lw=0)


def plot_scenario(
    scenario: str,
    by_arm: dict[str, list[RunResult]],
    stats: dict[str, ArmStats],
    path: Path,
    cfg: AnalysisConfig,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5), dpi=72)
    ax_ref, ax_own, ax_ess, ax_rew, ax_lag, ax_k3 = axes.ravel()
    for arm in sorted(by_arm, key=_arm_key):
        runs, st = by_arm[arm], arm_style(arm)
        label = f"{arm} ({len(runs)} seeds)"
        a = stats.get(arm)
        for ax, rs in ((ax_ref, a.ref if a else None), (ax_own, a.own if a else None)):
            if rs is not None and len(rs.curve):
                ax.plot(
                    rs.steps,
                    rs.curve,
                    ls=st["ls"],
                    color=st["color"],
                    lw=st["lw"],
                    marker=st["marker"] or "o",
                    ms=4,
                    label=label,
                )
                ax.fill_between(rs.steps, rs.lo, rs.hi, color=st["color"], alpha=0.12, lw=0)
        if arm != "onpolicy":
            x, rows = _aligned(runs, "ess_lag")
            _band_plot(ax_ess, x, rows, st, label)
            x, rows = _aligned(runs, "ell_std")
            _band_plot(ax_lag, x, rows, st, label)
            x, rows = _aligned(runs, "mismatch_k3")
            _band_plot(ax_k3, x, rows, st, label, positive=True)
        x, rows = _aligned(runs, "reward")
        _band_plot(ax_rew, x, rows, st, label)
    for ax, what in (
        (ax_ref, "fixed reference prefixes"),
        (ax_own, "each run's own sampled prefixes"),
    ):
        ax.axhline(
            cfg.band,
            color="red",
            lw=1.2,
            ls="--",
            label=f"{cfg.band:g}x noise threshold (pass band)",
        )
        ax.axhline(1.0, color="grey", lw=1.0, ls=":", label="1x noise (on-policy vs on-policy)")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=2))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.set_title(f"KL to on-policy / noise threshold, on {what}")
        ax.set_ylabel("D_t / N_t (ratio of KLs, unitless; log scale)")
    ax_ess.axhline(
        cfg.ess_threshold,
        color="red",
        lw=1.2,
        ls="--",
        label=f"ESS = {cfg.ess_threshold:g} (resync trigger)",
    )
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
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_noise(noise: NoiseThreshold, path: Path) -> Path | None:
    if not noise.pairs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=72)
    for i, (k, v) in enumerate(sorted(noise.pairs.items())):
        ax.plot(
            noise.steps,
            [np.nan if x is None else x for x in v],
            ls=_STYLES[i % 8][0],
            marker=_STYLES[i % 8][1],
            ms=3,
            lw=1,
            alpha=0.7,
            label=k.replace("onpolicy__", ""),
        )
    ax.plot(noise.steps, noise.forward, color="black", lw=2.5, label="N_t (mean over pairs)")
    ax.set_xlabel("training step (optimizer updates)")
    ax.set_ylabel("KL(O_i || O_j) on reference prefixes (nats per token)")
    ax.set_title("noise threshold: KL between independent on-policy runs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_crossings(rows: list[tuple[str, float, float]], path: Path) -> Path | None:
    """rows: (arm, Gaussian exp(-Var ell) first-below step, measured ESS first-below step)."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 5.5), dpi=72)
    seen = set()
    arms = sorted({a for a, _, _ in rows}, key=_arm_key)
    for arm, g, m in rows:
        st = arm_style(arm)
        dx = 0.12 * (arms.index(arm) - (len(arms) - 1) / 2)  # runs often cross at one step
        ax.scatter(
            g + dx,
            m + dx,
            color=st["color"],
            marker=st["marker"] or "o",
            s=40,
            label=None if arm in seen else arm,
            alpha=0.8,
        )
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
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _table(scenario_stats: dict[str, ArmStats], band: float) -> list[str]:
    out = [
        "| arm | seeds | max_t D_t/N_t, reference prefixes [95% CI] | vs 2x band | max_t D_t/N_t, "
        "own prefixes "
        "[95% CI] | first ESS<0.5 step, measured (mean [CI]) | first exp(-Var ell)<0.5 step (mean "
        "[CI]) | "
        "ESS stays <0.5 (seeds) | resyncs (mean) | final reward of rollouts (mean [CI]) | wall "
        "time per run "
        "(s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in sorted(scenario_stats, key=_arm_key):
        a = scenario_stats[arm]
        out.append(
            f"| {arm} | {a.seeds} | {a.ref.max.fmt()} | {a.ref.max.versus(band)} | "
            f"{a.own.max.fmt() if a.own is not None else '—'} | {a.ess_first.fmt(1)} | "
            f"{a.gauss_first.fmt(1)} | "
            f"{a.stays_count}/{a.seeds} | {_fmt(a.resyncs, 1)} | {a.final_reward.fmt(3)} | "
            f"{_fmt(a.wall_s, 0)} |"
        )
    return out


def _header(
    exp: Path, results: dict[str, RunResult], notes, preset, steps, ckpt_every
) -> list[str]:
    lines = []
    # what ran, from the results (a --report-only call need not repeat --steps)
    steps = max((max(r.steps) for r in results.values() if r.steps), default=steps)
    kl_steps = sorted({s for r in results.values() for s in r.kl_steps})
    ckpt_every = kl_steps[0] if kl_steps else ckpt_every
    arms = sorted({r.arm for r in results.values() if r.arm != "onpolicy"}, key=_arm_key)
    scs = sorted({r.scenario for r in results.values() if r.scenario != "reference"})
    onp = sorted(r.name for r in results.values() if r.arm == "onpolicy")
    seeds = sorted({r.seed for r in results.values() if r.arm != "onpolicy"})
    n_steps = sorted({len(r.steps) for r in results.values()})
    lines.append(
        f"- **What ran**: {len(results)} runs with results — {len(onp)} on-policy runs "
        f"({', '.join(onp)}) "
        f"and arms {', '.join(arms) or 'none'} under scenario(s) {', '.join(scs) or 'none'} with "
        "sampling "
        f"seeds {seeds}; logged steps per run: {n_steps}."
    )
    expected = None
    if preset is not None:
        expected = len(preset.onpolicy_seeds) + len(preset.arms) * len(preset.scenarios) * len(
            preset.seeds
        )
        sc_desc = "; ".join(
            f"`{s.name}`: sync {s.sync}"
            + (f" every {s.sync_k}" if s.sync == "every_k" else "")
            + (f", {s.quantization} sampler weights" if s.quantization else "")
            + (f", weight noise {s.weight_noise}" if s.weight_noise else "")
            for s in preset.scenarios
        )
        lines.append(
            f"- **Preset `{preset.name}`**: {steps} steps per run, checkpoints every {ckpt_every} "
            "steps; "
            f"scenarios {sc_desc}; base config `{preset.base_config}` with overrides "
            f"{list(preset.overrides)}. Matrix: {expected} runs; "
            + (
                "all of them ran."
                if expected == len(results)
                else f"**{len(results)} of {expected} ran** (the others are missing from every "
                "table and figure)."
            )
        )
    mj = exp / "model.json"
    if mj.exists():
        info = json.loads(mj.read_text())
        w = info.get("warmup")
        if w:
            t = w["config"]["task"]
            lines.append(
                f"- **Task**: chain arithmetic, {t['min_terms']}-{t['max_terms']} one-digit terms, "
                "worked "
                "answer `a+b=s1,s1+c=s2,... #### total` (about 14-36 tokens); reward 1 when the "
                "`####` "
                f"number is right. Warm-up: {w['config']['steps']} SFT steps on worked answers, "
                "greedy "
                f"accuracy {w['greedy_accuracy']:.2f} on {w['config']['eval_prompts']} held-out "
                "prompts."
            )
    pj = exp / "prefixes" / "prefixes.json"
    if pj.exists():
        pm = json.loads(pj.read_text())
        lines.append(
            f"- **Reference prefixes**: {len(pm.get('prompts', []))} held-out prompts, one "
            "response each "
            f"sampled once from the initial policy (every response position is a prefix)."
        )
    timings = [json.loads(t.read_text()) for t in sorted(exp.glob("timings*.json"))]
    n_runs = sum(len(tt["runs"]) for tt in timings)
    if n_runs:
        total = sum(float(tt["total_s"]) for tt in timings)
        loads = sorted({tt.get("loadavg", "") for tt in timings} - {""})
        span = ""
        if all("started" in tt and "finished" in tt for tt in timings):
            wall = max(tt["finished"] for tt in timings) - min(tt["started"] for tt in timings)
            span = f"{wall / 60:.1f} min from the first start to the last finish; "
        lines.append(
            f"- **Wall time of the matrix**: {span}{total / 60:.1f} min summed over "
            f"{len(timings)} invocation(s) (they may overlap) for {n_runs} runs trained and "
            "evaluated"
            + (f"; load average at the end of each: {'; '.join(loads)}" if loads else "")
            + "."
        )
    lines += [f"- {n}" for n in notes]
    return lines


def write_report(
    exp_dir: str | Path,
    *,
    cfg: AnalysisConfig | None = None,
    title: str = "",
    notes: Sequence[str] = (),
    preset=None,
    steps: int | None = None,
    ckpt_every: int | None = None,
) -> Path:
    """Write ``report.md`` and ``plots/*.png`` under ``exp_dir`` from ``results/`` and
    ``noise.json``."""
    cfg = cfg or AnalysisConfig()
    exp = Path(exp_dir)
    results = load_results(exp)
    if not results:
        raise FileNotFoundError(f"no run results under {exp / 'results'}; run the experiment first")
    try:
        noise = NoiseThreshold.load(exp)
    except FileNotFoundError:
        noise = None
    summaries = {name: summarize(r, noise, cfg) for name, r in results.items()}
    lines = [
        f"# {title or 'KL to on-policy training: experiment report'}",
        "",
        "Generated by `dlc_jax.experiments.report` from the run outputs in this directory; every "
        "number "
        "below is computed from `results/*.json` and `noise.json`.",
        "",
    ]
    lines += _header(exp, results, notes, preset, steps, ckpt_every) + [""]
    lines += [
        "Definitions: D_t(s) = mean over the on-policy runs O_j of the *other* sampling seeds of "
        "KL(run_t || O_j,t); N_t = mean over on-policy pairs (i != j) of KL(O_i,t || O_j,t) — so "
        "an "
        "on-policy run compared like an arm has D_t/N_t = 1 by construction. KL: exact "
        "full-vocabulary "
        "next-token KL averaged over the prefixes, at checkpoint steps. Reference prefixes: fixed, "
        "sampled "
        "once from the initial policy. Own prefixes: the first "
        f"{preset.own_prefix_prompts if preset is not None else 16} of those prompts re-sampled at "
        "each checkpoint from "
        "the run's "
        "theta_t (what its sampler produces once synced). Ratio per arm: mean_s D_t(s) / N_t; its "
        "interval "
        "is a percentile bootstrap (2000 resamples) over the arm's seeds and the on-policy pairs. "
        f"'within' = whole 95% interval <= {cfg.band:g}, 'outside' = whole interval > "
        f"{cfg.band:g}, else "
        "'inconclusive'. Lag ESS = token ESS of exp(ell), ell = log p - log p_s; Gaussian "
        "prediction = "
        f"exp(-Var ell). 'ESS stays < 0.5': the {cfg.ess_smooth}-step trailing median of the lag "
        f"ESS is below 0.5 from that step to the end (at least {cfg.min_stay_steps} steps). Final "
        f"reward: mean over the last {cfg.final_frac:.0%} of steps of the reward of the rollouts "
        "the "
        "run trained on, i.e. of the *sampler's* answers: a never-synced sampler keeps answering "
        "with "
        "the initial weights, so arms that never sync share the same rollouts (and rewards) per "
        "seed.",
        "",
    ]
    plots = exp / "plots"
    by_sc: dict[str, dict[str, list[RunResult]]] = {}
    refs = sorted((r for r in results.values() if r.arm == "onpolicy"), key=lambda r: r.name)
    for r in results.values():
        if r.scenario != "reference":
            by_sc.setdefault(r.scenario, {}).setdefault(r.arm, []).append(r)
    all_stats: dict[str, dict[str, ArmStats]] = {}
    for sc in sorted(by_sc):
        by_arm = {a: sorted(v, key=lambda r: r.seed) for a, v in by_sc[sc].items()}
        if refs:
            by_arm["onpolicy"] = refs
        st = {a: arm_stats(a, runs, noise, summaries, cfg) for a, runs in by_arm.items()}
        all_stats[sc] = st
        png = plot_scenario(sc, by_arm, st, plots / f"{sc}.png", cfg)
        lines += [f"## Scenario `{sc}`", "", f"![{sc}](plots/{png.name})", ""]
        lines += _table(st, cfg.band) + [""]
    lines += ["## The paper's claims at this scale", ""]
    lines += claims(all_stats, results, noise, summaries, cfg) + [""]
    cross = [
        (s.arm, float(s.gaussian_first_below), float(s.ess_first_below))
        for s in summaries.values()
        if s.gaussian_first_below is not None and s.ess_first_below is not None
    ]
    cpng = plot_crossings(cross, plots / "ess_crossing.png")
    if cpng is not None:
        lines += [f"![ESS crossing](plots/{cpng.name})", ""]
    if noise is not None:
        npng = plot_noise(noise, plots / "noise.png")
        lines += ["## Noise threshold", ""]
        if npng is not None:
            lines += [f"![noise](plots/{npng.name})", ""]
        pairs = sorted(noise.pairs)
        lines += [
            "| step | N_t (mean) | "
            + " | ".join(p.replace("onpolicy__", "") for p in pairs)
            + " |",
            "|---|---|" + "---|" * len(pairs),
        ]
        for i, s in enumerate(noise.steps):
            lines.append(
                f"| {s} | {_fmt(noise.forward[i], 4)} | "
                + " | ".join(_fmt(noise.pairs[p][i], 4) for p in pairs)
                + " |"
            )
        lines.append("")
    lines += [
        "## Runs",
        "",
        "| run | arm | scenario | seed | steps | max D_t/N_t (step) | first ESS<0.5 | "
        "final reward | wall time (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results.values(), key=lambda r: (r.scenario, _arm_key(r.arm), r.seed)):
        sm = summaries[r.name]
        mx = "—" if sm.max_ratio is None else f"{_fmt(sm.max_ratio)} ({sm.max_ratio_step})"
        lines.append(
            f"| {r.name} | {r.arm} | {r.scenario} | {r.seed} | {len(r.steps)} | {mx} | "
            f"{_fmt(sm.ess_first_below)} | {_fmt(sm.final_reward, 3)} | {_fmt(r.wall_s, 1)} |"
        )
    lines.append("")
    path = exp / "report.md"
    path.write_text("\n".join(lines))
    return path


__all__ = ["write_report", "arm_style", "mean_interval"]
