"""`dlc-jax bench plan`: the pod-plan table (docs/bench/PLAN.md) from `dlc-jax plan` runs, one
subprocess per case (`plan_cases`), its JSON cached under ``cache_dir`` while the case's arguments
are unchanged (``--force`` reruns). Targets: 1.7B 8 x 32,768 on v5p-16 fits with >= 25% of HBM
left; 8B 64 x 16,384 on v5p-64 fits; the 0.6B and 1.7B plans compile in < 60 s.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

from dlc_jax.bench import common
from dlc_jax.bench.plan_cases import (
    BEFORE,
    SHIPPED,
    TARGETS,
    TWO_SLICE,
    PlanCase,
    dedupe,
    matrix_cases,
    our_case,
    peer_json,
)
from dlc_jax.bench.plan_notes import (
    issue30_sections,
    peer_roofline,
    sections,
    stale,
    vocab_parallel,
)
from dlc_jax.plan.markdown import TABLE_COLUMNS, _row, plan_markdown

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PlanBenchConfig:
    cases: tuple[PlanCase, ...]
    cache_dir: str = "docs/bench/plan"
    force: bool = False
    timeout_s: int = 3600
    cached_only: bool = False  # render the cached cases only; list the others as not run
    stale: bool = False  # rerun the cached cases `plan_notes.stale` names (older trainer code)
    write_cache: bool = True  # write refreshed analytic FLOPs / roofline back to the cached JSON


SIZES = {
    # the targets first, then the "before" cases, the 2-slice run and the matrix (cached per case)
    "full": PlanBenchConfig(cases=dedupe(TARGETS + SHIPPED + BEFORE + TWO_SLICE + matrix_cases())),
    "targets": PlanBenchConfig(cases=dedupe(TARGETS + SHIPPED + BEFORE)),
    "before": PlanBenchConfig(cases=BEFORE),
}


ARGS = common.Options(
    "plan",
    SIZES,
    ("--force", "force", "rerun cases whose JSON is cached"),
    (
        "--cache-dir",
        "cache_dir",
        {"default": "", "help": "per-case plan JSON (default docs/bench/plan)"},
    ),
    ("--cached-only", "cached_only", "do not run plans; render the cached"),
    ("--stale", "stale", "rerun cached cases compiled with older trainer code"),
)
add_args, from_args = ARGS.add_args, ARGS.from_args


def run_case(case: PlanCase, cache_dir: Path, force: bool, timeout_s: int) -> dict:
    """The plan JSON of ``case`` (cached), with the subprocess's wall time and load average."""

    def annotate(r: dict, proc, run: dict) -> dict:
        verdict = proc.stderr.strip().splitlines()[-1] if proc.returncode else "fits"
        r["bench"] = {**run, "returncode": proc.returncode, "verdict": verdict, "argv": case.argv()}
        log.info("plan %s: fits=%s compile %.0f s", case.key, r["fits"], r["compile_s"])
        return r

    cmd = [sys.executable, "-m", "dlc_jax.cli", "plan", *case.argv(), "--json"]
    out = cache_dir / f"{case.key}.json"
    return common.cached_run(out, cmd, f"plan {case}", annotate, force=force, timeout_s=timeout_s)


def refresh_flops(r: dict) -> dict:
    """A cached plan with its analytic FLOPs and notes recomputed by today's ``dlc_jax.plan`` (the
    cache may predate a fix there; the compiled figures are kept)."""
    from types import SimpleNamespace

    from dlc_jax.plan.abstract_state import model_config
    from dlc_jax.plan.flops import StepShape, chunks_replicated, explain, step_flops

    c, t = r["config"], r["topology"]
    step = r["programs"]["train_step"]
    if step["oom"]:
        return r
    qcfg = model_config(SimpleNamespace(path=c["model"], preset="tiny"))
    shape = StepShape(
        rows=c["rows"],
        seq_len=c["seq_len"],
        micro_batches=c["micro_batches"],
        chunk_size=256,
        chips=t["chips"],
        remat_policy=c["remat_policy"],
        scanned_layers=c["scanned_layers"],
        pallas_attention="splash" in c["attention"],
        snapshot_forward=r["analytic_flops"]["snapshot_forward"] > 0,
        fsdp=int(t["mesh"].get("fsdp", 1)),
        slices=int(t.get("slices", 1)),
        # the layout it was compiled with: 0 (flattened chunks) before rl.vocab_parallel
        vocab_shards=int(r["analytic_flops"].get("logprob_vocab_shards", 0)),
        position_shards=int(r["analytic_flops"].get("logprob_position_shards", 0)),
    )
    fl = step_flops(qcfg, shape)
    xla = r["xla_flops_per_device"]
    out = dict(
        r,
        analytic_flops=fl,
        logprob_chunks_replicated=chunks_replicated(fl, xla["train_step"]),
        flops_note=explain(fl, xla["train_step"], xla["snapshot_forward"], shape),
    )
    if not r["programs"]["snapshot_forward"]["oom"]:
        from dlc_jax.plan.chips import chip
        from dlc_jax.plan.roofline import roofline

        rl = roofline(out, chip(t["chip"]))
        if "xla_flags" not in r:  # compiled before issue 30: no bytes accessed, flags unset
            rl["note"] = "compiled before the plan set its flags: HBM term not recorded (0)"
        out.update(roofline=rl, roofline_step_s=rl["step_s"])
    return out


def _write_refreshed(path: Path, r: dict) -> None:
    """Keep the cached JSON's analytic FLOPs and note in step with the rendered table."""
    text = json.dumps(r, indent=1, sort_keys=True)
    if path.exists() and path.read_text() != text:
        path.write_text(text)


COLUMNS = [*TABLE_COLUMNS, "XLA vs rules", "log-prob layout", "load (1 min)", "before (issue 14)"]


def layout(r: dict) -> str:
    """The log-prob layout the plan was compiled with (its JSON: `plan_notes.vocab_parallel`)."""
    n = vocab_parallel(r)
    if not n:
        return "flattened (old)"
    autodiff = stale(r) == "autodiff log-prob backward"
    return f"vocab-parallel /{n}" + (" (autodiff backward)" if autodiff else "")


def xla_check(r: dict) -> str:
    """XLA's per-device counts over the predictions (rules 1-3), with the implied windowed share
    (rule 4) when a count is below the no-windowing prediction."""
    from dlc_jax.plan.flops import MATCH_LOW, windowed_share

    a, x = r["analytic_flops"], r["xla_flops_per_device"]
    if r["programs"]["train_step"]["oom"] or "xla_all_windowed_train_step_per_device" not in a:
        return "n/a"
    replicated = "_chunks_replicated" if r.get("logprob_chunks_replicated") else ""
    out = []
    for name, prog, suffix in (("step", "train_step", replicated), ("fwd", "snapshot_forward", "")):
        xla, pred = x[prog], a[f"xla_visible_{prog}_per_device{suffix}"]
        low = a[f"xla_all_windowed_{prog}_per_device"]
        if not pred or not xla:
            continue
        text = f"{name} {xla / pred:.2f}"
        share = windowed_share(pred, low, xla)
        if xla / pred < MATCH_LOW and share is not None:
            text += f" ({100 * min(max(share, 0.0), 1.0):.0f}% windowed)"
        out.append(text)
    return ", ".join(out) or "n/a"


def run(cfg: PlanBenchConfig) -> dict:
    res = common.new_result(
        "PLAN", "Pod plans: dlc-jax plan (AOT-compiled for TPU topologies on this CPU)", COLUMNS
    )
    res["config"] = {"cases": [dataclasses.asdict(c) for c in cfg.cases]}
    found: dict[PlanCase, dict] = {}
    not_run = []
    for case in cfg.cases:
        cached = Path(cfg.cache_dir) / f"{case.key}.json"
        on = f"{case.model} on {case.topology}"
        if cfg.cached_only and not cached.exists():
            not_run.append(f"{on} x{case.slices} {case.rows}x{case.seq_len}")
            continue
        try:
            redo = cfg.stale and cached.exists() and bool(stale(json.loads(cached.read_text())))
            found[case] = run_case(case, Path(cfg.cache_dir), cfg.force or redo, cfg.timeout_s)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            res["notes"].append(f"{on} {case.rows}x{case.seq_len}: failed: {e}")
            continue
        r = found[case] = refresh_flops(found[case])
        if cfg.write_cache:
            _write_refreshed(cached, r)
        row = _row(r)
        row["XLA vs rules"] = xla_check(r)
        row["log-prob layout"] = layout(r)
        row["load (1 min)"] = r.get("bench", {}).get("loadavg_start", [None])[0]
        row["before (issue 14)"] = case.before
        res["rows"].append(row)
    _targets(res, found)
    if not_run:
        res["notes"].append(
            f"not run yet ({len(not_run)} cases; `dlc-jax bench plan --size full --out docs/bench` "
            f"runs them, one compile at a time): " + "; ".join(not_run)
        )
    res["notes"] += sections()["TABLE_NOTES"].format(cache_dir=cfg.cache_dir).split("\n")
    notes = _issue30_notes(found, cfg)
    res["sections"] = [
        *sections()["FLOPS"].split("\n"),
        *notes,
        "### Details of the target plans",
        "",
    ] + [plan_markdown(r) for c, r in found.items() if c in TARGETS or c.shipped]
    res["sections"] += ["", *sections()["MOE_HISTORY"].split("\n")]
    return common.finish(res)


def beside_peer(ours: dict, peer: dict) -> dict:
    """Our roofline step over tunix's (`peer_roofline`), the compute floor, our programs' bounds."""
    prl = peer_roofline(peer, ours)
    rl = ours["roofline"]["programs"].values()
    return {
        "peer": prl,
        "ratio": ours["roofline"]["step_s"] / prl["projected_s"],
        "floor": sum(p["seconds"]["compute"] for p in rl) / prl["seconds"]["compute"],
        "bound": "/".join(sorted({f"{p['bound']}-bound" for p in rl})),
    }


def _issue30_notes(found: dict, cfg: PlanBenchConfig) -> list[str]:
    """`plan_notes.issue30_sections` over the cached plans it quotes (the 2-layer rows and tunix's
    steps of `dlc-jax bench plan-peers` beside this cache: docs/bench/plan_peers/)."""
    peers_dir = Path(cfg.cache_dir).parent / "plan_peers"
    by_shape = _by_shape(found)
    plans: dict[str, dict | None] = {
        "headline": by_shape.get(("1.7B", "v5p-16", 8, 32768, 1)),
        "8B_v5e_16k": by_shape.get(("8B", "v5litepod-64", 64, 16384, 1)),
        "moe": by_shape.get(("30B-A3B", "v5p-64", 64, 8192, 1)),
        "full_1.7B_4k": by_shape.get(("1.7B", "v5p-16", 8, 4096, 1)),
        "full_0.6B_4k": by_shape.get(("0.6B", "v5p-8", 8, 4096, 1)),
        "v5e_1.7B_4k": by_shape.get(("1.7B", "v5litepod-32", 32, 4096, 1)),
        "8B_shipped": by_shape.get(("8B", "v5p-64", 64, 16384, 1)),
    }
    # the roles beside a tunix step of `dlc-jax bench plan-peers`: the whole models at 8 x 4,096
    # (plan-peers --size committed) and the 2-layer rows (their plans are only in this cache)
    beside = {"full_1.7B_4k": ("1.7B", "v5p-16", 4096), "full_0.6B_4k": ("0.6B", "v5p-8", 4096)}
    for model, topo in (("1.7B:2", "v5p-16"), ("0.6B:2", "v5p-8")):
        for length, tag in ((4096, "4k"), (32768, "32k")):
            role = f"{model}_{tag}"
            beside[role] = (model, topo, length)
            case = our_case("docs/bench/plan_peers", model, topo, 8, length)
            path = Path(cfg.cache_dir) / f"{case.key}.json"
            ours = refresh_flops(json.loads(path.read_text())) if path.exists() else None
            if ours and cfg.write_cache:
                _write_refreshed(path, ours)
            plans[role] = ours
    ratios = {}
    for role, (model, topo, length) in beside.items():
        peer_path = peer_json(peers_dir, model, topo, 8, length)
        if (ours := plans[role]) and peer_path.exists():
            ratios[role] = beside_peer(ours, json.loads(peer_path.read_text()))
    missing = [k for k, v in plans.items() if v is None]
    if missing:
        return [f"(the issue-30 notes quote cached plans not there: {', '.join(missing)})", ""]
    return issue30_sections({k: v for k, v in plans.items() if v}, ratios, list(found.values()))


def _by_shape(found: dict) -> dict:
    """{(model, topology, rows, seq_len, slices): plan} of the cases run."""
    return {(c.model, c.topology, c.rows, c.seq_len, c.slices): r for c, r in found.items()}


def _targets(res: dict, found: dict) -> None:
    by_shape = _by_shape(found)
    t = by_shape.get(("1.7B", "v5p-16", 8, 32768, 1))
    left = None if t is None or not t["fits"] else t["hbm_left_fraction"]
    t = by_shape.get(("8B", "v5p-64", 64, 16384, 1))
    fits = None if t is None else float(t["fits"])
    res["targets"] += [
        common.target("1.7B 8 x 32,768 on v5p-16: HBM left (fits)", left, 0.25, ">="),
        common.target("8B 64 x 16,384 on v5p-64: fits (1 = yes)", fits, 1.0, ">="),
    ]
    # issue 14's compile baselines: 0.6B 16 x 2,048 (232 s) and 1.7B 8 x 8,192 (433 s) on v5p-16;
    # wall seconds of the whole plan, with the 1-minute load average the case ran at (on this
    # shared 2-CPU machine the wall time doubles when other work runs: see the load column)
    for model, rows, length in (("0.6B", 16, 2048), ("1.7B", 8, 8192)):
        t = by_shape.get((model, "v5p-16", rows, length, 1))
        load = ((t or {}).get("bench") or {}).get("loadavg_start") or [None]
        what = f"{model} {rows} x {length:,} on v5p-16: plan compile, wall s (load {load[0]})"
        res["targets"].append(
            common.target(what, None if t is None else t["compile_s"], 60.0, "<=")
        )
