"""``dlc-jax plan``: will this config fit on that TPU slice, how long is a step, how long to
compile?

    dlc-jax plan --config configs/qwen3_1p7b_dlc.yaml --topology v5p-16 [--slices N] [--json OUT]
                 [--markdown OUT] [--efficiency E] [--nic-gbps G] [key.sub=value ...]

Runs on a CPU machine without a TPU or network: libtpu describes the slice's devices and compiles
the trainer's real jitted programs for them ahead of time. Prints a table; exit status 0 when it
fits, 1 when it does not (with one line on stderr saying by how much and what to change), 2 on bad
input.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from argparse import RawDescriptionHelpFormatter
from pathlib import Path

from dlc_jax.cli_args import ArgumentParser
from dlc_jax.errors import UserError

log = logging.getLogger(__name__)


class PlanInputError(UserError):
    """A bad ``dlc-jax plan`` input: topology, slices, efficiency."""


def _parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="dlc-jax plan", description=__doc__, formatter_class=RawDescriptionHelpFormatter
    )
    p.add_argument("--config", required=True, help="training config YAML")
    p.add_argument(
        "--topology",
        default="",
        help="GCP accelerator type (v4-8, v5p-16, v5litepod-16, v6e-8) or topology (v5p:2x2x2); "
        "default: the config's plan.topology",
    )
    p.add_argument(
        "--slices",
        type=int,
        default=0,
        help="number of slices (multi-slice over DCN); default plan.slices",
    )
    p.add_argument("--json", default="", help="write the plan as JSON here")
    p.add_argument("--markdown", default="", help="write the plan as a markdown section here")
    p.add_argument(
        "--efficiency",
        type=float,
        default=None,
        help="fraction of the chip's bf16 peak the step is assumed to reach (for projected_step_s)",
    )
    p.add_argument(
        "--nic-gbps",
        type=float,
        default=100.0,
        help="NIC bandwidth (Gb/s) between trainer hosts and samplers, for the projected resync "
        "time (default 100)",
    )
    p.add_argument("overrides", nargs="*", help="config overrides key.sub=value")
    return p


def plan_from_args(args) -> dict:
    """The plan of ``args``; bad input raises a one-line user error before anything compiles."""
    from dlc_jax.plan.report import build_plan
    from dlc_jax.plan.topology import parse_topology
    from dlc_jax.trainer.config import load_config

    cfg = load_config(args.config, list(args.overrides))
    topo_text = args.topology or cfg.plan.topology
    if not topo_text:
        raise PlanInputError("--topology: none given and the config has no plan.topology")
    if args.slices < 0:
        raise PlanInputError(f"--slices must be >= 1, got {args.slices}")
    slices = args.slices or (cfg.plan.slices if not args.topology else 1)
    efficiency = cfg.plan.efficiency if args.efficiency is None else args.efficiency
    if not 0 < efficiency <= 1:
        raise PlanInputError(f"--efficiency must be in (0, 1], got {efficiency}")
    try:
        topo = parse_topology(topo_text, slices)
    except ValueError as e:
        raise PlanInputError(f"--topology {e}" if args.topology else f"plan.topology {e}") from e
    return build_plan(cfg, topo, efficiency=efficiency, nic_gbps=args.nic_gbps)


def cli(argv: list[str]) -> int:
    """Exit 0 when it fits, 1 when not; user errors are raised (`dlc_jax.cli` prints them)."""
    args = _parser().parse_args(argv)
    # libtpu logs to stderr from C++; keep stderr for the one-line verdict
    os.environ.setdefault("TPU_STDERR_LOG_LEVEL", "3")
    os.environ.setdefault("TPU_MIN_LOG_LEVEL", "3")
    result = plan_from_args(args)
    from dlc_jax.plan.markdown import plan_markdown
    from dlc_jax.plan.report import table

    print(table(result), flush=True)
    if "warning" in result.get("batch_replication", {}):
        print(f"dlc-jax plan: warning: {result['batch_replication']['warning']}", file=sys.stderr)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1, sort_keys=True))
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(plan_markdown(result))
    if not result["fits"]:
        print(f"dlc-jax plan: {result['advice']}", file=sys.stderr, flush=True)
        return 1
    return 0
