"""`dlc-jax` command line: a thin dispatcher to one module per subcommand.

Each subcommand lives in its own module and exposes `cli(argv: list[str]) -> int`; modules are
imported lazily so `dlc-jax --help` and `dlc-jax X --help` stay fast and do not import JAX/vLLM
for unrelated commands.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "make-tiny": ("dlc_jax.model.tiny", "write a tiny random Qwen3 HF directory + offline tokenizer"),
    "sampler": ("dlc_jax.sampler.cli", "sampler service: `dlc-jax sampler serve --backend vllm|jax ...`"),
    "train": ("dlc_jax.trainer.cli", "run RL training: `dlc-jax train --config configs/X.yaml [k=v ...]`"),
    "export": ("dlc_jax.trainer.export_cli", "convert an orbax training checkpoint to an HF directory"),
    "experiment": ("dlc_jax.experiments.cli", "KL-to-on-policy experiments and report"),
    "bench": ("dlc_jax.bench.cli", "benchmarks against peers (writes JSON + markdown)"),
}


def _usage() -> str:
    lines = ["usage: dlc-jax COMMAND [args...]", "", "commands:"]
    for name, (_, doc) in COMMANDS.items():
        lines.append(f"  {name:<12} {doc}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from dlc_jax import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"dlc-jax: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.cli(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
