"""The pilot: at which learning rate / steps / batch does the on-policy reference still learn
held-out accuracy while DLC-without-resync's lag ESS falls below 0.5 under ``lag_never``? One seed
per point, evaluated on the held-out prompts only (``pilot.json``, ``pilot.md``; ``--pilot``)."""

from __future__ import annotations

import json
from pathlib import Path

from dlc_jax.experiments.launch import log_progress
from dlc_jax.experiments.presets import ExperimentPreset
from dlc_jax.experiments.run_outputs import read_metrics
from dlc_jax.experiments.sweep import (
    SweepPoint,
    lr_batch_point,
    point_experiment,
    train_and_evaluate,
)

PILOT_ARM, PILOT_SCENARIO = "dlc_noresync", "lag_never"
ESS_KEYS = (("token", "ess_lag"), ("sequence", "ess_lag_seq"))


def ess_crossings(rows: list[dict], threshold: float = 0.5) -> dict[str, dict]:
    """Per statistic: the first step its value is < threshold (None: never) and its minimum."""
    out = {}
    for name, key in ESS_KEYS:
        vals = [(int(r["step"]), float(r[key])) for r in rows if r.get(key) is not None]
        first = next((s for s, v in vals if v < threshold), None)
        out[name] = {"first_below": first, "min": min((v for _, v in vals), default=None)}
    return out


def run_pilot(
    preset: ExperimentPreset,
    out: str | Path,
    points: list[SweepPoint],
    *,
    seed: int = 0,
    workers: int = 2,
) -> Path:
    """Train and evaluate every point (resumable); write ``pilot.json`` and ``pilot.md``."""
    out = Path(out).absolute()
    done_json = out / "pilot.json"
    names = {p.name for p in points}
    rows = [
        r
        for r in (json.loads(done_json.read_text()) if done_json.exists() else [])
        if r["point"] not in names
    ]
    for pt in points:
        exp = point_experiment(
            preset,
            out,
            pt,
            (seed,),
            arms=[PILOT_ARM],
            scenarios=[PILOT_SCENARIO],
            seeds=(seed,),
            workers=workers,
        )
        for spec, _, held, run_dir, done in train_and_evaluate(exp, f"pilot point {pt.name}"):
            metrics = read_metrics(run_dir / "logs" / "metrics.jsonl")
            res = [int(r["resync_count"]) for r in metrics if r.get("resync_count") is not None]
            rows.append(
                {
                    "point": pt.name,
                    "run": spec.name,
                    "arm": spec.arm,
                    "seed": spec.seed,
                    "overrides": list(pt.overrides),
                    "steps": exp.steps,
                    "heldout": {k: held[k] for k in ("greedy", "sampled")},
                    "ess": ess_crossings(metrics),
                    "resyncs": max(res) if res else None,
                    "cpu_s": done.get("cpu_s"),
                    "loadavg": done.get("loadavg", ""),
                }
            )
        log_progress(f"pilot point {pt.name}: done")
        (out / "pilot.json").write_text(json.dumps(rows, indent=1))
        (out / "pilot.md").write_text("\n".join(pilot_table(rows)) + "\n")
    return out / "pilot.md"


def pilot_table(rows: list[dict]) -> list[str]:
    """One markdown row per run: held-out accuracy, first lag ESS < 0.5 (min), CPU-s (load)."""
    out = [
        "| point | run | steps | greedy acc t=0 -> T | sampled acc t=0 -> T | token ESS first < "
        "0.5 (min) | sequence ESS first < 0.5 (min) | CPU-s (load) |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def ess_cell(e: dict) -> str:
        m = e["min"]
        return f"{e['first_below'] if e['first_below'] is not None else 'never'} " + (
            f"({m:.3f})" if m is not None else "(—)"
        )

    for r in rows:
        h = r["heldout"]
        cpu = f"{r['cpu_s']:.0f}" if r.get("cpu_s") is not None else "—"
        load = (r.get("loadavg") or "—").split(" ")[0]
        out.append(
            f"| {r['point']} | {r['arm']} | {r['steps']} | {h['greedy'][0]:.3f} -> "
            f"{h['greedy'][-1]:.3f} | {h['sampled'][0]:.3f} -> {h['sampled'][-1]:.3f} | "
            f"{ess_cell(r['ess']['token'])} | {ess_cell(r['ess']['sequence'])} | {cpu} ({load}) |"
        )
    return out


# The tiny preset's pilot points (8 samples per prompt).
PILOTS: dict[str, tuple[SweepPoint, ...]] = {
    "tiny": (
        lr_batch_point(1e-4, 32, 40),
        lr_batch_point(2e-4, 32, 20),
        lr_batch_point(1.5e-4, 32, 30),
        lr_batch_point(1e-4, 16, 60),
        lr_batch_point(2e-4, 64, 20),
        lr_batch_point(2e-4, 16, 30),
        lr_batch_point(1e-4, 16, 40),
    )
}
