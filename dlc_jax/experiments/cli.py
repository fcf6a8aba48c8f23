"""``dlc-jax experiment --preset NAME [--out DIR] [--arms ...] [--scenarios ...] [--steps N] [--seeds ...]``.

``--report-only`` regenerates ``report.md`` and the plots from the existing run outputs.
"""

from __future__ import annotations

import argparse


def _parser() -> argparse.ArgumentParser:
    from dlc_jax.experiments.presets import ARMS, PRESETS

    ap = argparse.ArgumentParser(
        prog="dlc-jax experiment", description="KL-to-on-policy experiments and report"
    )
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument(
        "--out", default=None, help="experiment directory (default experiments_out/<preset>)"
    )
    ap.add_argument("--arms", nargs="+", default=None, choices=sorted(ARMS), help="subset of arms")
    ap.add_argument("--scenarios", nargs="+", default=None, help="subset of the preset's scenarios")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default: the preset's)")
    ap.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="the arms' sampling seeds (default: the preset's)",
    )
    ap.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra trainer config override for every run (repeatable), e.g. model.preset=...",
    )
    ap.add_argument("--report-only", action="store_true", help="only regenerate report.md + plots")
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
        raise SystemExit(f"--steps must be >= 1, got {args.steps}")
    if args.scenarios:
        names = [s.name for s in preset.scenarios]
        bad = [s for s in args.scenarios if s not in names]
        if bad:
            raise SystemExit(f"--scenarios: unknown {bad} for preset {preset.name} (have {names})")
    exp = Experiment(
        preset,
        args.out or f"experiments_out/{preset.name}",
        arms=args.arms,
        scenarios=args.scenarios,
        steps=args.steps,
        seeds=args.seeds,
        run_timeout_s=args.run_timeout,
        extra_overrides=tuple(args.override),
    )
    path = exp.write_report() if args.report_only else exp.run()
    print(f"report: {path}")
    return 0
