"""An on-policy sweep (``--sweep``): which run length / learning rate / batch makes the on-policy
reference learn, judged by its checkpoints' held-out accuracy (``sweep.json``, ``sweep.md``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from dlc_jax.experiments.launch import log_progress
from dlc_jax.experiments.matrix import RunSpec
from dlc_jax.experiments.presets import ExperimentPreset
from dlc_jax.experiments.run_outputs import normalize_metrics, read_metrics
from dlc_jax.experiments.runner import Experiment
from dlc_jax.experiments.stats import learning_delta


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """name: the point's directory; overrides: trainer ``key=value``s; steps: 0 = the preset's."""

    name: str
    overrides: tuple[str, ...] = ()
    steps: int = 0


def run_sweep(
    preset: ExperimentPreset,
    out: str | Path,
    points: list[SweepPoint],
    *,
    seeds: tuple[int, ...] | None = None,
    workers: int = 1,
    run: set[str] | None = None,
) -> Path:
    """Train and evaluate the points named in ``run`` (default all; resumable); write the table."""
    out = Path(out).absolute()
    seeds = tuple(seeds or preset.onpolicy_seeds)
    rows = []
    for pt in points:
        exp = point_experiment(preset, out, pt, seeds, workers=workers, arms=[])
        if run is not None and pt.name not in run:  # only what an earlier call evaluated
            exp.specs = [
                s for s in exp.specs if (exp.out / "evals" / s.name / "heldout.json").exists()
            ]
            if not exp.specs:
                continue
        for spec, cfg, held, run_dir, done in train_and_evaluate(exp, f"sweep point {pt.name}"):
            _, series = normalize_metrics(read_metrics(run_dir / "logs" / "metrics.jsonl"))
            ent = [float(x) for x in series.get("entropy", []) if x is not None]
            rows.append(
                {
                    "point": pt.name,
                    "run": spec.name,
                    "seed": spec.seed,
                    "overrides": list(pt.overrides),
                    "steps": exp.steps,
                    "lr": cfg.optim.lr,
                    "batch_prompts": cfg.train.batch_prompts,
                    "n": cfg.sampler.n,
                    "heldout": held,
                    "entropy_first": ent[0] if ent else None,
                    "entropy_last": ent[-1] if ent else None,
                    "entropy_max": max(ent) if ent else None,
                    "cpu_s": done.get("cpu_s"),
                    "wall_s": done.get("wall_s"),
                    "loadavg": done.get("loadavg", ""),
                }
            )
        log_progress(f"sweep point {pt.name}: done")
    (out / "sweep.json").write_text(json.dumps(rows, indent=1))
    (out / "sweep.md").write_text("\n".join(sweep_table(rows)) + "\n")
    return out / "sweep.md"


def point_experiment(preset, out: Path, pt: SweepPoint, keep_seeds, **kw) -> Experiment:
    """The `Experiment` of ``pt`` under ``out/points/<name>``, runs of ``keep_seeds`` only."""
    exp = Experiment(
        preset,
        out / "points" / pt.name,
        steps=pt.steps or None,
        extra_overrides=pt.overrides,
        cache_dir=out / "cache",
        **kw,
    )
    exp.specs = [s for s in exp.specs if s.seed in keep_seeds]
    return exp


def train_and_evaluate(
    exp: Experiment, what: str
) -> Iterator[tuple[RunSpec, Any, dict, Path, dict]]:
    """Train ``exp.specs``, then yield (spec, config, held-out, run dir, DONE record)."""
    model_dir = exp.resolve_model()  # makes exp.out
    cfgs = {s.name: exp.run_config(s, model_dir) for s in exp.specs}
    for spec, err in exp._train_parallel(exp.specs, cfgs):
        if err is not None:
            raise RuntimeError(f"{what}: {spec.name} failed: {err}")
    for spec in exp.specs:
        held = exp.heldout.run(spec.name, cfgs[spec.name], exp.evals.model)
        run_dir = exp.out / "runs" / spec.name
        done = json.loads((run_dir / "DONE").read_text())
        yield spec, cfgs[spec.name], held, run_dir, done


def sweep_table(rows: list[dict]) -> list[str]:
    """One markdown row per point: held-out accuracy, learning delta, entropy, CPU-s."""
    out = [
        "| point | lr | prompts x samples | steps | seeds | greedy acc t=0 -> T | sampled acc "
        "t=0 -> T | sampled delta [95% CI] | greedy delta [95% CI] | entropy first -> last "
        "(max) | CPU-s per run (load) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["point"] for r in rows):
        rs = [r for r in rows if r["point"] == name]
        h = [r["heldout"] for r in rs]
        g0, g1 = (np.mean([x["greedy"][i] for x in h]) for i in (0, -1))
        s0, s1 = (np.mean([x["sampled"][i] for x in h]) for i in (0, -1))
        e0, e1 = (np.mean([r[k] for r in rs]) for k in ("entropy_first", "entropy_last"))
        emax = max(r["entropy_max"] for r in rs)
        cpus = [r["cpu_s"] for r in rs if r["cpu_s"] is not None]
        cpu = f"{np.mean(cpus):.0f}" if cpus else "—"
        loads = ", ".join(sorted({r["loadavg"].split(" ")[0] for r in rs if r["loadavg"]}))
        r0 = rs[0]
        out.append(
            f"| {name} | {r0['lr']:g} | {r0['batch_prompts']} x {r0['n']} | {r0['steps']} | "
            f"{len(rs)} | {g0:.3f} -> {g1:.3f} | {s0:.3f} -> {s1:.3f} | "
            f"{learning_delta(h, 'sampled').fmt(3)} | {learning_delta(h, 'greedy').fmt(3)} | "
            f"{e0:.2f} -> {e1:.2f} ({emax:.2f}) | {cpu} ({loads or '—'}) |"
        )
    return out


def lr_batch_point(lr: float, prompts: int, steps: int) -> SweepPoint:
    """A sweep or pilot point: learning rate x prompts per batch x steps, named by them."""
    return SweepPoint(
        f"lr{lr:g}_b{prompts}_s{steps}",
        (f"optim.lr={lr:g}", f"train.batch_prompts={prompts}"),
        steps,
    )


# The tiny preset's sweep (8 samples per prompt).
SWEEPS: dict[str, tuple[SweepPoint, ...]] = {
    "tiny": (
        lr_batch_point(2e-4, 8, 20),
        lr_batch_point(5e-5, 8, 20),
        lr_batch_point(1e-4, 8, 20),
        lr_batch_point(5e-4, 8, 20),
        lr_batch_point(1e-3, 8, 20),
        lr_batch_point(5e-4, 16, 20),
        lr_batch_point(5e-5, 32, 20),
        lr_batch_point(2e-5, 32, 20),
    )
}
