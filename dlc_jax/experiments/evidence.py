"""The practical outcome next to the KL: held-out accuracy of theta_t per arm, accuracy per
CPU-second, the scenarios' measured delta / ell, paired arm differences with the seeds that would
decide them, and ``summary.json``; all computed from ``results/*.json`` and the claims' lines."""

from __future__ import annotations

import math
import re

import numpy as np

from dlc_jax.experiments.arm_styles import arm_key
from dlc_jax.experiments.results import RunResult
from dlc_jax.experiments.stats import NAN_INTERVAL, Z_95, Interval, learning_delta, mean_interval

Z_80 = 0.841621  # one-sided 80% power quantile
# The accuracy of the summary, the first table and the paired differences.
HEADLINE = "greedy"
# How each claim's interval is computed (summary.json's ``interval_method``).
INTERVAL_METHODS = {
    1: "cluster bootstrap over runs (arm runs and on-policy runs drawn with replacement, N_t "
    "rebuilt from the drawn runs' pairs), 2000 resamples",
    2: "cluster bootstrap over runs, 2000 resamples (max D_t/N_t after the ESS onset)",
    3: "cluster bootstrap over runs of the paired (same seed) difference DLC minus "
    "DLC-without-resync in max D_t/N_t, 2000 resamples",
    4: "cluster bootstrap over runs, own-prefix and sampler-prefix ratios, 2000 resamples",
}


def with_onpolicy(by_arm: dict[str, list[RunResult]], refs: list[RunResult]) -> dict:
    """``by_arm`` with the on-policy runs ``refs`` as arm ``onpolicy`` (when there are any)."""
    return dict(by_arm, **({"onpolicy": refs} if refs else {}))


def final_heldout(run: RunResult, key: str = HEADLINE) -> float | None:
    """Held-out accuracy of the run's last checkpoint (None when not measured)."""
    vals = run.heldout.get(key) or []
    return float(vals[-1]) if vals and vals[-1] is not None else None


def scenario_error_stats(runs: list[RunResult]) -> dict[str, float | None]:
    """Mean over runs and steps of the logged mean |delta|, mean |ell| and p99 |delta|."""
    out: dict[str, float | None] = {}
    for key in ("delta_abs_mean", "ell_abs_mean", "delta_abs_p99"):
        vals = [float(v) for r in runs for v in r.get(key) if v is not None]
        out[key] = float(np.mean(vals)) if vals else None
    return out


def seeds_to_decide(diffs: list[float]) -> int | None:
    """Seeds a paired difference with this spread needs for a 95% interval that excludes zero
    with 80% power at the measured mean (normal approximation; None when the mean is 0 or the
    spread is unmeasured)."""
    d = np.asarray(diffs, float)
    if d.size < 2 or not np.isfinite(d).all():
        return None
    sd, mean = float(d.std(ddof=1)), float(abs(d.mean()))
    return None if mean == 0.0 else max(2, math.ceil(((Z_95 + Z_80) * sd / mean) ** 2))


def paired_heldout(
    by_arm: dict[str, list[RunResult]], a: str, b: str
) -> tuple[Interval, list[float]]:
    """Final held-out accuracy of arm ``a`` minus ``b`` per common seed, with a t interval."""
    fa = {r.seed: final_heldout(r) for r in by_arm.get(a, [])}
    fb = {r.seed: final_heldout(r) for r in by_arm.get(b, [])}
    common = sorted(s for s in fa if s in fb and fa[s] is not None and fb[s] is not None)
    diffs = [float(fa[s]) - float(fb[s]) for s in common]  # type: ignore[arg-type]
    return (mean_interval(diffs) if diffs else NAN_INTERVAL), diffs


def resync_counts(runs: list[RunResult]) -> dict[str, float | None]:
    """Resyncs per run (the last logged count): mean and min over the arm's runs."""
    per_run = ([float(v) for v in r.get("resyncs") if v is not None] for r in runs)
    counts = [vals[-1] for vals in per_run if vals]
    if not counts:
        return {"mean": None, "min": None}
    return {"mean": round(float(np.mean(counts)), 6), "min": int(min(counts))}


def acc_per_kcpu_s(runs: list[RunResult]) -> float:
    """Mean held-out greedy accuracy gained per 1000 mean CPU-seconds of training."""
    gain = [(final_heldout(r) or 0.0) - float(r.heldout[HEADLINE][0]) for r in runs if r.heldout]
    cpu = [float(r.info.get("cpu_s") or np.nan) for r in runs]
    if not gain or not np.isfinite(cpu).any():
        return float("nan")
    return 1000.0 * float(np.mean(gain)) / float(np.nanmean(cpu))


def verdict_of_difference(iv: Interval) -> str:
    """higher / lower when the interval excludes 0; "identical on every seed" when every paired
    difference is 0; otherwise inconclusive, or not measured from fewer than 2 seeds."""
    if not math.isfinite(iv.lo):
        return "not measured"
    if iv.lo == iv.hi == iv.point == 0.0:
        return "identical on every seed"
    if iv.lo > 0:
        return "higher"
    if iv.hi < 0:
        return "lower"
    return "inconclusive"


def heldout_lines(by_sc: dict[str, dict[str, list[RunResult]]], refs: list[RunResult]) -> list[str]:
    """The held-out section: on-policy learning, per arm accuracy, paired differences."""
    lines = ["## Held-out accuracy of theta_t (from checkpoints)", ""]
    h0 = [r.heldout for r in refs if r.heldout]
    if h0:
        acc = {
            k: f"{np.mean([h[k][0] for h in h0]):.3f} -> {np.mean([h[k][-1] for h in h0]):.3f}, "
            f"change {learning_delta(h0, k).fmt(3)}"
            for k in ("sampled", "greedy")
        }
        lines += [
            f"- **On-policy learning** ({len(h0)} runs): sampled accuracy {acc['sampled']}; greedy "
            f"{acc['greedy']} (paired per run, t interval over runs; the interval excluding 0 is "
            "the bar the baseline must clear).",
            "",
        ]
    for sc in sorted(by_sc):
        by_arm = with_onpolicy(by_sc[sc], refs)
        lines += [
            f"### `{sc}`",
            "",
            "| arm | seeds | final sampled acc [95% CI] | final greedy acc [95% CI] | "
            "resyncs per run (mean, min) | acc gain per 1000 CPU-s | CPU-s per run |",
            "|---|---|---|---|---|---|---|",
        ]
        for arm in sorted(by_arm, key=arm_key):
            runs = by_arm[arm]
            fin = [final_heldout(r, "sampled") for r in runs]
            gre = [final_heldout(r, "greedy") for r in runs]
            cpu = [float(r.info.get("cpu_s") or np.nan) for r in runs]
            rs = resync_counts(runs)
            res = "—" if rs["mean"] is None else f"{rs['mean']:.1f}, {rs['min']}"
            lines.append(
                f"| {arm} | {len(runs)} | {mean_interval(fin).fmt(3)} | "
                f"{mean_interval(gre).fmt(3)} | {res} | {_num(acc_per_kcpu_s(runs), 4)} | "
                f"{_num(float(np.nanmean(cpu)) if np.isfinite(cpu).any() else float('nan'), 0)} |"
            )
        lines.append("")
        for b in sorted(by_arm, key=arm_key):
            if b == "dlc" or "dlc" not in by_arm:
                continue
            iv, diffs = paired_heldout(by_arm, "dlc", b)
            if not diffs:
                continue
            need, v = seeds_to_decide(diffs), verdict_of_difference(iv)
            decide = v == "inconclusive" and need is not None
            tail = f"; {need} seeds would decide it at the measured spread" if decide else ""
            lines.append(
                f"- dlc - {b}, final held-out greedy accuracy paired over {len(diffs)} seeds: "
                f"{iv.fmt(3)} ({v}){tail}."
            )
        lines.append("")
    return lines


def _num(x: float, nd: int) -> str:
    return "—" if not math.isfinite(x) else f"{x:.{nd}f}"


def _rnd(x) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


def _iv_json(iv: Interval) -> dict:
    return {"mean": _rnd(iv.point), "lo": _rnd(iv.lo), "hi": _rnd(iv.hi)}


_CLAIM = re.compile(r"^\s+(\d)\. \*.*?\*: \*\*(held|not held|inconclusive)\*\* — (.*)$")


def claim_verdicts(claim_lines: list[str]) -> list[dict]:
    """Each claim over all scenarios: held in every one, not held in any, else inconclusive."""
    per: dict[int, list[tuple[str, str, str]]] = {}
    scenario = ""
    for line in claim_lines:
        if m := re.match(r"^- Scenario `([^`]+)`:", line):
            scenario = m.group(1)
        elif c := _CLAIM.match(line):
            per.setdefault(int(c.group(1)), []).append((scenario, c.group(2), c.group(3)))
    out = []
    for n in (1, 2, 3, 4):
        got = per.get(n, [])
        verdicts = [v for _, v, _ in got]
        held = bool(got) and all(v == "held" for v in verdicts)
        verdict = "held" if held else "not held" if "not held" in verdicts else "inconclusive"
        ev = "; ".join(f"{sc}: {v} ({e})" for sc, v, e in got) or "not tested"
        out.append({"claim": n, "verdict": verdict, "evidence": ev})
    return out


def summary_json(
    by_sc: dict[str, dict[str, list[RunResult]]],
    refs: list[RunResult],
    arm_stats: dict,
    kinds: dict[str, str],
    claim_lines: list[str],
    *,
    heldout_overlap: int | None = None,
    numerics: dict | None = None,
) -> dict:
    """The issue's summary schema (see docs/experiments/README.md)."""
    learn = learning_delta([r.heldout for r in refs], HEADLINE)
    scen = {}
    for sc in sorted(by_sc):
        runs = [r for rs in by_sc[sc].values() for r in rs]
        with_ref = with_onpolicy(by_sc[sc], refs)
        arms = {}
        for arm in sorted(by_sc[sc], key=arm_key):
            st = arm_stats.get(sc, {}).get(arm)
            rs = by_sc[sc][arm]
            arms[arm] = {
                "seeds": len(rs),
                "heldout_acc": _iv_json(mean_interval([final_heldout(r) for r in rs])),
                "max_ratio": _iv_json(st.ref.max if st is not None else NAN_INTERVAL),
                "heldout_sampled_acc": _iv_json(
                    mean_interval([final_heldout(r, "sampled") for r in rs])
                ),
                "resyncs": resync_counts(rs),
                "acc_per_kcpu_s": _rnd(acc_per_kcpu_s(rs)),
            }
            if arm != "dlc" and "dlc" in by_sc[sc]:
                arms[arm]["dlc_minus"] = _iv_json(paired_heldout(with_ref, "dlc", arm)[0])
        scen[sc] = {
            "kind": kinds.get(sc, "both"),
            **{k: _rnd(v) for k, v in scenario_error_stats(runs).items()},
            "arms": arms,
        }
    claims = claim_verdicts(claim_lines)
    for c in claims:
        c["interval_method"] = INTERVAL_METHODS[c["claim"]]
    return {
        "onpolicy_learning": {
            "delta": _rnd(learn.point),
            "lo": _rnd(learn.lo),
            "hi": _rnd(learn.hi),
            "seeds": learn.n,
        },
        "scenarios": scen,
        "claims": claims,
        "heldout_overlap": heldout_overlap,
        "numerics": numerics or {},
    }


def first_table(summary: dict, band: float) -> list[str]:
    """The report's first table: per arm and scenario, held-out accuracy and max KL ratio."""
    scen = summary["scenarios"]
    if not scen:
        return []
    names = list(scen)
    arms = sorted({a for s in scen.values() for a in s["arms"]}, key=arm_key)
    learn = summary["onpolicy_learning"]
    out = [
        "## At a glance",
        "",
        "Per scenario: final held-out greedy accuracy of theta_t [95% CI] and max_t D_t/N_t on "
        f"the reference prefixes [95% CI] (within / outside / inconclusive against {band:g}x the "
        "on-policy noise). On-policy learning (held-out greedy accuracy, last checkpoint minus "
        f"the initial policy): {_fmt_iv(learn['delta'], learn['lo'], learn['hi'])} over "
        f"{learn['seeds']} runs.",
        "",
        "| scenario | kind | mean abs delta | mean abs ell |",
        "|---|---|---|---|",
    ]
    out += [
        f"| {sc} | {s['kind']} | {_num(_f(s['delta_abs_mean']), 4)} | "
        f"{_num(_f(s['ell_abs_mean']), 4)} |"
        for sc, s in scen.items()
    ]
    out += ["", "| arm | " + " | ".join(f"`{sc}`" for sc in names) + " |"]
    out.append("|---|" + "---|" * len(names))
    for arm in arms:
        cells = []
        for sc in names:
            a = scen[sc]["arms"].get(arm)
            if a is None:
                cells.append("—")
                continue
            h, m = a["heldout_acc"], a["max_ratio"]
            iv = Interval(_f(m["mean"]), _f(m["lo"]), _f(m["hi"]))
            cells.append(
                f"acc {_fmt_iv(h['mean'], h['lo'], h['hi'])}; ratio "
                f"{_fmt_iv(m['mean'], m['lo'], m['hi'], 2)} {iv.versus(band)}"
            )
        out.append(f"| {arm} | " + " | ".join(cells) + " |")
    return out


def _f(x) -> float:
    return float("nan") if x is None else float(x)


def _fmt_iv(m, lo, hi, nd: int = 3) -> str:
    return "—" if m is None else f"{m:.{nd}f} [{_num(_f(lo), nd)}, {_num(_f(hi), nd)}]"


def seeds_from_interval(iv: Interval, band: float) -> int | None:
    """Seeds (and on-policy runs, scaled together) for the 95% interval of max_t D_t/N_t to
    exclude ``band`` with 80% power: the half-width shrinks as 1/sqrt(seeds), times
    (z_95 + z_80) / z_95 for the power (normal approximation)."""
    if iv.n < 1 or not (math.isfinite(iv.lo) and math.isfinite(iv.hi)):
        return None
    gap = abs(iv.point - band)
    if gap == 0.0:
        return None
    half = (iv.hi - iv.lo) / 2.0 * (Z_95 + Z_80) / Z_95
    return max(iv.n, math.ceil(iv.n * (half / gap) ** 2))


def power_lines(all_stats: dict, band: float) -> list[str]:
    """For every arm whose KL-ratio verdict is inconclusive: the seeds that would decide it."""
    rows = []
    for sc in sorted(all_stats):
        for arm in sorted(all_stats[sc], key=arm_key):
            iv = all_stats[sc][arm].ref.max
            if arm == "onpolicy" or iv.versus(band) != "inconclusive":
                continue
            need = seeds_from_interval(iv, band)
            rows.append(
                f"| {sc} | {arm} | {iv.n} | {iv.fmt()} | {need if need is not None else '—'} |"
            )
    if not rows:
        return []
    return [
        "## How many seeds would decide the inconclusive verdicts",
        "",
        f"For max_t D_t/N_t against {band:g}: the bootstrap interval's half-width scaled by "
        "sqrt(seeds now / seeds then), seeds and on-policy runs grown together, for an interval "
        "that excludes the band with 80% power at the measured point (normal approximation; "
        "'—' when the point sits on the band).",
        "",
        "| scenario | arm | seeds | max_t D_t/N_t [95% CI] | seeds needed |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]


def numerics_lines(numerics: dict, heldout_overlap: int | None) -> list[str]:
    """The held-out split's training overlap and the sampler numerics table."""
    out = [
        "- **Held-out split**: "
        + (
            "overlap with the training rows not recorded (the split predates the count)."
            if heldout_overlap is None
            else f"{heldout_overlap} of its prompts are training prompts (counted)."
        ),
        "",
    ]
    if numerics:
        out += [
            "## Sampler numerics against the fp32 trainer",
            "",
            "Per token, over the reference prefixes' responses: |delta| = |log p_trainer - "
            "log q_sampler| at the same weights.",
            "",
            "| numerics | mean abs delta | p99 abs delta |",
            "|---|---|---|",
        ]
        for name, v in numerics.items():
            out.append(
                f"| {name} | {_num(_f(v.get('delta_abs_mean')), 4)} | "
                f"{_num(_f(v.get('delta_abs_p99')), 4)} |"
            )
        out.append("")
    return out
