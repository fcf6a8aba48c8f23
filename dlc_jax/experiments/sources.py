"""Does each scenario have the error source it names? One arm (TIS: its trainer logs both delta
and ell) trains a few steps per scenario, and its mean |delta| and |ell| per step are tabulated
next to the scenario's kind (``sources.json`` / ``sources.md``; ``--check-sources STEPS``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from dlc_jax.experiments.presets import ExperimentPreset
from dlc_jax.experiments.run_outputs import normalize_metrics, read_metrics
from dlc_jax.experiments.runner import Experiment

ERROR_KEYS = ("delta_abs_mean", "ell_abs_mean")  # the series tabulated per scenario


def check_sources(preset: ExperimentPreset, out: str | Path, steps: int, arm: str = "tis") -> Path:
    out = Path(out).absolute()
    exp = Experiment(
        dataclasses.replace(preset, checkpoint_every=steps), out, arms=[arm], seeds=[0], steps=steps
    )
    model_dir = exp.resolve_model()
    rows = []
    for spec in [s for s in exp.specs if s.arm == arm]:
        cfg = exp.run_config(spec, model_dir)
        run_dir = exp.train(spec, cfg)
        _, series = normalize_metrics(read_metrics(run_dir / "logs" / "metrics.jsonl"))
        sc = preset.scenario(spec.scenario)
        done = json.loads((run_dir / "DONE").read_text())
        errors = {k: [float(v) for v in series.get(k, []) if v is not None] for k in ERROR_KEYS}
        rows.append({"scenario": sc.name, "kind": sc.kind, **errors, "cpu_s": done.get("cpu_s")})
    (out / "sources.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        f"| scenario | kind | mean abs delta per step (1..{steps}) | mean abs ell per step | "
        "verdict |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        d, e = np.asarray(r["delta_abs_mean"]), np.asarray(r["ell_abs_mean"])
        lines.append(
            f"| {r['scenario']} | {r['kind']} | {' '.join(f'{x:.2g}' for x in d)} | "
            f"{' '.join(f'{x:.2g}' for x in e)} | {source_verdict(r['kind'], d, e)} |"
        )
    md = out / "sources.md"
    md.write_text("\n".join(lines) + "\n")
    return md


def source_verdict(kind: str, delta, ell, *, tol: float = 1e-3) -> str:
    """'separated' when the errors above ``tol`` match the kind, else 'NOT separated'."""
    d = float(np.max(delta)) if len(delta) else float("nan")
    e = float(np.max(ell)) if len(ell) else float("nan")
    want = {"lag": (False, True), "discrepancy": (True, False), "both": (True, True)}[kind]
    return "separated" if (d > tol, e > tol) == want else "NOT separated"
