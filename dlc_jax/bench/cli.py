"""`dlc-jax bench NAME [--size SIZE] [--out DIR] [module options]`: runs the module `BENCHMARKS`
[NAME], which provides ``SIZES`` (named configs, the first the default), ``from_args(size, args)``
(a KeyError names an unknown size), ``run(cfg)`` (a `common` result) and optionally
``add_args(parser)``; prints the result as markdown and writes ``<out>/<name>.{json,md}``.
"""

from __future__ import annotations

import importlib
import sys

from dlc_jax.cli_args import ArgumentParser, UsageError
from dlc_jax.errors import UserError

BENCHMARKS: dict[str, str] = {
    "sampler": "dlc_jax.bench.sampler_bench",
    "trainer": "dlc_jax.bench.trainer_bench",
    "dlc": "dlc_jax.bench.dlc_bench",
    "logprobs": "dlc_jax.bench.logprobs_bench",
    "weight_sync": "dlc_jax.bench.weight_sync_bench",
    "lora": "dlc_jax.bench.lora_bench",
    "plan": "dlc_jax.bench.plan_bench",
    "plan-peers": "dlc_jax.bench.plan_peers",
    "moe": "dlc_jax.bench.moe_bench",
    "soak": "dlc_jax.bench.soak",
    "all": "dlc_jax.bench.all_bench",
}


def cli(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        usage = "usage: dlc-jax bench NAME [--size SIZE] [--out DIR] [options]"
        print(f"{usage}\n\nbenchmarks: " + ", ".join(BENCHMARKS))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        raise UsageError(f"unknown benchmark {name!r}; choose from {sorted(BENCHMARKS)}")
    try:
        mod = importlib.import_module(BENCHMARKS[name])
    except ModuleNotFoundError as e:
        raise UserError(f"benchmark {name!r} is registered but its module is missing ({e})") from e
    sizes = list(getattr(mod, "SIZES", {}) or {"default": None})
    ap = ArgumentParser(prog=f"dlc-jax bench {name}")
    ap.add_argument("--size", default=sizes[0], choices=sizes)
    ap.add_argument(
        "--out", default="bench_results", help="directory for <name>.json and <name>.md"
    )
    if hasattr(mod, "add_args"):
        mod.add_args(ap)
    args = ap.parse_args(rest)
    cfg = mod.from_args(args.size, args)
    result = mod.run(cfg)
    from .common import write_result

    print(write_result(result, args.out))
    print(f"wrote {args.out}/{result['name']}.json and .md")
    return 0


if __name__ == "__main__":
    from dlc_jax.cli import run_command

    sys.exit(run_command("bench", sys.argv[1:]))
