"""``dlc-jax experiment --preset NAME [...]``: run a preset's matrix, or one of its side studies."""

from __future__ import annotations

import dataclasses
from typing import Any

from dlc_jax.cli_args import ArgumentParser, UsageError


def _parser() -> ArgumentParser:
    from dlc_jax.experiments.presets import ARMS, PRESETS

    ap = ArgumentParser(
        prog="dlc-jax experiment", description="KL-to-on-policy experiments and report"
    )
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--out", help="experiment directory (default experiments_out/<preset>)")
    ap.add_argument("--arms", nargs="+", choices=sorted(ARMS), help="subset of arms")
    ap.add_argument(
        "--onpolicy-only",
        action="store_true",
        help="only the on-policy runs (a learning-rate / batch sweep: see docs/experiments)",
    )
    ap.add_argument("--scenarios", nargs="+", help="subset of the preset's scenarios")
    ap.add_argument("--steps", type=int, help="steps per run (default: the preset's)")
    ap.add_argument(
        "--seeds", type=int, nargs="+", help="the arms' sampling seeds (default: the preset's)"
    )
    key_values: dict[str, Any] = dict(action="append", default=[], metavar="KEY=VALUE")
    points: dict[str, Any] = dict(nargs="*", metavar="POINT")
    ap.add_argument(
        "--override",
        **key_values,
        help="extra trainer config override for every run (repeatable), e.g. model.preset=...",
    )
    ap.add_argument(
        "--warmup",
        **key_values,
        help="chain warm-up setting (steps, lr, batch_size, eval_prompts, dims.<make_tiny arg>), "
        "e.g. dims.num_hidden_layers=1 for a CPU smoke test of an accelerator preset",
    )
    ap.add_argument(
        "--sweep",
        **points,
        help="run the preset's on-policy sweep (all points, or those named) instead of the matrix; "
        "--seeds picks the seeds",
    )
    ap.add_argument(
        "--pilot",
        **points,
        help="run the preset's pilot (on-policy vs DLC without resync, 1 seed; all points, or "
        "those named) instead of the matrix",
    )
    ap.add_argument(
        "--numerics",
        action="store_true",
        help="measure mean / p99 |delta| per token of every sampler numerics against the fp32 "
        "trainer on the preset's initial model and reference prefixes (numerics.json in --out)",
    )
    ap.add_argument(
        "--check-sources",
        type=int,
        metavar="STEPS",
        help="train TIS for STEPS steps under each scenario and tabulate its measured |delta| and "
        "|ell| (does each scenario have the error source it names?)",
    )
    ap.add_argument("--report-only", action="store_true", help="only regenerate report.md + plots")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="print the matrix's size and its estimated CPU-seconds and wall minutes; run nothing",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        help="trainings at once (each a subprocess; evaluation runs one at a time in this process)",
    )
    ap.add_argument(
        "--run-timeout", type=float, default=3600.0, help="seconds before a single run is killed"
    )
    return ap


def cli(argv: list[str]) -> int:
    from dlc_jax.experiments.presets import PRESETS
    from dlc_jax.experiments.runner import Experiment

    args = _parser().parse_args(argv)
    preset = PRESETS[args.preset]
    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    if args.scenarios:
        names = [s.name for s in preset.scenarios]
        bad = [s for s in args.scenarios if s not in names]
        if bad:
            raise UsageError(f"--scenarios: unknown {bad} for preset {preset.name} (have {names})")
    if args.warmup:
        preset = with_warmup(preset, args.warmup)
    exp = Experiment(
        preset,
        args.out or f"experiments_out/{preset.name}",
        arms=[] if args.onpolicy_only else args.arms,
        scenarios=args.scenarios,
        steps=args.steps,
        seeds=args.seeds,
        run_timeout_s=args.run_timeout,
        extra_overrides=tuple(args.override),
        workers=args.workers,
    )
    if args.check_sources is not None:
        from dlc_jax.experiments.sources import check_sources

        out = args.out or f"experiments_out/{preset.name}_sources"
        print(f"sources: {check_sources(preset, out, args.check_sources)}")
        return 0
    if args.sweep is not None:
        from dlc_jax.experiments.sweep import SWEEPS, run_sweep

        points = SWEEPS.get(preset.name, ())
        known = [p.name for p in points]
        bad = [p for p in args.sweep if p not in known]
        if bad or not points:
            raise UsageError(
                f"--sweep: unknown points {bad} for preset {preset.name} (have {known})"
            )
        chosen = {p.name for p in points if not args.sweep or p.name in args.sweep}
        out = args.out or f"experiments_out/{preset.name}_sweep"
        md = run_sweep(
            preset, out, list(points), seeds=args.seeds, workers=args.workers, run=chosen
        )
        print(f"sweep: {md}")
        return 0
    if args.dry_run:
        print(f"{preset.name}: {exp.budget().line()}")
        return 0
    if args.numerics:
        from dlc_jax.experiments.launch import log_progress
        from dlc_jax.experiments.numerics import measure_numerics, write_numerics

        model_dir = exp.resolve_model()  # makes exp.out
        found = measure_numerics(model_dir, exp.make_prefixes(model_dir), log=log_progress)
        print(f"numerics: {write_numerics(exp.out, found)}")
        return 0
    if args.pilot is not None:
        from dlc_jax.experiments.pilot import PILOTS, run_pilot

        pts = PILOTS.get(preset.name, ())
        bad = [p for p in args.pilot if p not in [q.name for q in pts]]
        if bad or not pts:
            raise UsageError(f"--pilot: unknown points {bad} for preset {preset.name}")
        picked = [p for p in pts if not args.pilot or p.name in args.pilot]
        out = args.out or f"experiments_out/{preset.name}_pilot"
        print(f"pilot: {run_pilot(preset, out, picked, workers=args.workers)}")
        return 0
    path = exp.write_report() if args.report_only else exp.run()
    print(f"report: {path}")
    return 0


def with_warmup(preset, items: list[str]):
    """``preset`` with its chain warm-up changed by ``KEY=VALUE`` items (``dims.NAME=INT``)."""
    if preset.task is None:
        raise UsageError(f"--warmup: preset {preset.name} has no chain warm-up")
    task, dims = preset.task, dict(preset.task.model_dims)
    fields = {"steps": int, "lr": float, "batch_size": int, "eval_prompts": int}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep:
            raise UsageError(f"--warmup: expected KEY=VALUE, got {item!r}")
        if key.startswith("dims."):
            dims[key[5:]] = val.lower() == "true" if val.lower() in ("true", "false") else int(val)
        elif key in fields:
            task = dataclasses.replace(task, **{key: fields[key](val)})
        else:
            raise UsageError(f"--warmup: unknown key {key!r} (use {sorted(fields)} or dims.<name>)")
    task = dataclasses.replace(task, model_dims=tuple(sorted(dims.items())))
    return dataclasses.replace(preset, task=task)
