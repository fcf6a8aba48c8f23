"""``report.md`` (and ``summary.json``, ``plots/``) computed from an experiment's run results."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from dlc_jax.experiments.analysis import AnalysisConfig, summarize
from dlc_jax.experiments.arm_styles import arm_key
from dlc_jax.experiments.claims import ArmStats, arm_stats, claims
from dlc_jax.experiments.evidence import (
    first_table,
    heldout_lines,
    numerics_lines,
    power_lines,
    summary_json,
    with_onpolicy,
)
from dlc_jax.experiments.heldout_split import read_overlap
from dlc_jax.experiments.matrix import run_specs
from dlc_jax.experiments.plots import plot_crossings, plot_noise, plot_scenario
from dlc_jax.experiments.results import NoiseThreshold, RunResult, load_results


def _fmt(x, nd=2):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if isinstance(x, float):
        if x != 0 and (abs(x) >= 1e4 or abs(x) < 10 ** (-nd)):
            return f"{x:.{nd}e}"
        return f"{x:.{nd}f}"
    return str(x)


def _table(scenario_stats: dict[str, ArmStats], band: float) -> list[str]:
    out = [
        "| arm | seeds | max_t D_t/N_t, reference prefixes [95% CI] | vs 2x band | max_t D_t/N_t, "
        "own prefixes [95% CI] | first ESS<0.5 step, measured (mean [CI]) | first exp(-Var ell)"
        "<0.5 step (mean [CI]) | ESS stays <0.5 (seeds) | resyncs (mean) | final reward of "
        "rollouts (mean [CI]) | wall time per run (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in sorted(scenario_stats, key=arm_key):
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
    # what ran, from the results (a --report-only call need not repeat --steps)
    steps = max((max(r.steps) for r in results.values() if r.steps), default=steps)
    kl_steps = sorted({s for r in results.values() for s in r.kl_steps})
    ckpt_every = kl_steps[0] if kl_steps else ckpt_every
    arms = sorted({r.arm for r in results.values() if r.arm != "onpolicy"}, key=arm_key)
    scs = sorted({r.scenario for r in results.values() if r.scenario != "reference"})
    onp = sorted(r.name for r in results.values() if r.arm == "onpolicy")
    seeds = sorted({r.seed for r in results.values() if r.arm != "onpolicy"})
    n_steps = sorted({len(r.steps) for r in results.values()})
    lines = [
        f"- **What ran**: {len(results)} runs with results — {len(onp)} on-policy runs "
        f"({', '.join(onp)}) and arms {', '.join(arms) or 'none'} under scenario(s) "
        f"{', '.join(scs) or 'none'} with sampling seeds {seeds}; logged steps per run: {n_steps}."
    ]
    if preset is not None:
        expected = len(run_specs(preset))
        sc_desc = "; ".join(
            f"`{s.name}`: sync {s.sync}"
            + (f" every {s.sync_k}" if s.sync == "every_k" else "")
            + (f", {s.quantization} sampler weights" if s.quantization else "")
            + (f", weight noise {s.weight_noise}" if s.weight_noise else "")
            for s in preset.scenarios
        )
        lines.append(
            f"- **Preset `{preset.name}`**: {steps} steps per run, checkpoints every {ckpt_every} "
            f"steps; scenarios {sc_desc}; base config `{preset.base_config}` with overrides "
            f"{list(preset.overrides)}. Matrix: {expected} runs; "
            + (
                "all of them ran."
                if expected == len(results)
                else f"**{len(results)} of {expected} ran** (the others are missing from every "
                "table and figure)."
            )
        )
    mj = exp / "model.json"
    w = json.loads(mj.read_text()).get("warmup") if mj.exists() else None
    if w:
        t = w["config"]["task"]
        lines.append(
            f"- **Task**: chain arithmetic, {t['min_terms']}-{t['max_terms']} one-digit terms, "
            "worked answer `a+b=s1,s1+c=s2,... #### total` (about 14-36 tokens); reward 1 when "
            f"the `####` number is right. Warm-up: {w['config']['steps']} SFT steps on worked "
            f"answers, greedy accuracy {w['greedy_accuracy']:.2f} on "
            f"{w['config']['eval_prompts']} held-out prompts."
        )
    pj = exp / "prefixes" / "prefixes.json"
    if pj.exists():
        n_prompts = len(json.loads(pj.read_text()).get("prompts", []))
        lines.append(
            f"- **Reference prefixes**: {n_prompts} held-out prompts, one "
            "response each sampled once from the initial policy (every response position is a "
            "prefix)."
        )
    timings = [json.loads(t.read_text()) for t in sorted(exp.glob("timings*.json"))]
    # "runs" also holds "<run>/eval_cpu_s" entries: count the runs only
    n_runs = sum(sum("/" not in k for k in tt["runs"]) for tt in timings)
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
    """Write ``report.md``, ``summary.json`` and ``plots/*.png`` under ``exp_dir``."""
    cfg = cfg or AnalysisConfig()
    exp = Path(exp_dir)
    results = load_results(exp)
    if not results:
        raise FileNotFoundError(f"no run results under {exp / 'results'}; run the experiment first")
    noise = NoiseThreshold.load(exp) if (exp / "noise.json").exists() else None
    summaries = {name: summarize(r, noise, cfg) for name, r in results.items()}
    lines = [
        f"# {title or 'KL to on-policy training: experiment report'}",
        "",
        "Generated by `dlc_jax.experiments.report` from the run outputs in this directory; every "
        "number below is computed from `results/*.json` and `noise.json`.",
        "",
    ]
    lines += _header(exp, results, notes, preset, steps, ckpt_every) + [""]
    lines += [
        "Definitions: D_t(s) = mean over the on-policy runs O_j of the *other* sampling seeds of "
        "KL(run_t || O_j,t); N_t = mean over on-policy pairs (i != j) of KL(O_i,t || O_j,t) — so "
        "an on-policy run compared like an arm has D_t/N_t = 1 by construction. KL: exact full-"
        "vocabulary next-token KL averaged over the prefixes, at checkpoint steps. Reference "
        "prefixes: fixed, sampled once from the initial policy. Own prefixes: the first "
        f"{preset.own_prefix_prompts if preset is not None else 16} of those prompts re-sampled at "
        "each checkpoint from the run's theta_t (what its sampler produces once synced). Ratio per "
        "arm: mean_s D_t(s) / N_t; its interval is a cluster bootstrap (2000 resamples) that draws "
        "the arm's runs and the on-policy runs with replacement and rebuilds N_t from the pairs "
        "among the drawn runs; means over runs (accuracy, paired differences) get a Student t "
        "interval; no interval is printed from fewer than 2 runs. 'within' = whole 95% interval "
        f"<= {cfg.band:g}, 'outside' = whole interval > {cfg.band:g}, else 'inconclusive'. Lag "
        "ESS = token ESS of exp(ell), ell = log p - log p_s; Gaussian prediction = exp(-Var ell). "
        f"'ESS stays < 0.5': the {cfg.ess_smooth}-step trailing median of the lag ESS is below 0.5 "
        f"from that step to the end (at least {cfg.min_stay_steps} steps). Final reward: mean over "
        f"the last {cfg.final_frac:.0%} of steps of the reward of the rollouts the run trained on, "
        "i.e. of the *sampler's* answers: a never-synced sampler keeps answering with the initial "
        "weights, so arms that never sync share the same rollouts (and rewards) per seed.",
        "",
    ]
    plots = exp / "plots"
    by_sc: dict[str, dict[str, list[RunResult]]] = {}
    refs = sorted((r for r in results.values() if r.arm == "onpolicy"), key=lambda r: r.name)
    for r in results.values():
        if r.scenario != "reference":
            by_sc.setdefault(r.scenario, {}).setdefault(r.arm, []).append(r)
    by_sc = {sc: {a: sorted(v, key=lambda r: r.seed) for a, v in by_sc[sc].items()} for sc in by_sc}
    with_refs = {sc: with_onpolicy(by_sc[sc], refs) for sc in sorted(by_sc)}
    all_stats: dict[str, dict[str, ArmStats]] = {
        sc: {a: arm_stats(a, runs, noise, summaries, cfg) for a, runs in by_arm.items()}
        for sc, by_arm in with_refs.items()
    }
    claim_lines = claims(all_stats, results, noise, summaries, cfg)
    numerics_path = exp / "numerics.json"
    numerics = json.loads(numerics_path.read_text()) if numerics_path.exists() else {}
    summary = summary_json(
        by_sc,
        refs,
        all_stats,
        {s.name: s.kind for s in preset.scenarios} if preset is not None else {},
        claim_lines,
        heldout_overlap=read_overlap(exp),
        numerics=numerics,
    )
    (exp / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines += first_table(summary, cfg.band) + [""]
    lines += numerics_lines(numerics, summary["heldout_overlap"])
    for sc, by_arm in with_refs.items():
        png = plot_scenario(sc, by_arm, all_stats[sc], plots / f"{sc}.png", cfg)
        lines += [f"## Scenario `{sc}`", "", f"![{sc}](plots/{png.name})", ""]
        lines += _table(all_stats[sc], cfg.band) + [""]
    if any(r.heldout for r in results.values()):
        lines += heldout_lines(by_sc, refs)
    lines += ["## The paper's claims at this scale", ""]
    lines += claim_lines + [""]
    lines += power_lines(all_stats, cfg.band)
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
    for r in sorted(results.values(), key=lambda r: (r.scenario, arm_key(r.arm), r.seed)):
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
