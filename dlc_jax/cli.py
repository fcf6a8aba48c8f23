"""`dlc-jax` command line: a thin dispatcher to one lazily imported module per subcommand, each
exposing `cli(argv: list[str]) -> int`. Logging is configured here only (`setup_logging`). User
errors (`dlc_jax.errors.is_user_error`) print as one line, ``dlc-jax COMMAND: error: ...``, exit
status 2; Ctrl-C exits 130; ``--debug`` (or ``DLC_JAX_DEBUG=1``) shows the traceback instead."""

from __future__ import annotations

import importlib
import logging
import os
import sys

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _TqdmHandler(logging.Handler):
    """Writes each record as one line via `tqdm.write` (above a progress bar, if one is shown)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stdout)
            sys.stdout.flush()
        except Exception:
            self.handleError(record)


def setup_logging(level: int = logging.INFO) -> None:
    """Configure logging (idempotent): `dlc_jax.*` at ``level``, others at WARNING, on stdout."""
    root = logging.getLogger()
    if not any(isinstance(h, _TqdmHandler) for h in root.handlers):
        handler = _TqdmHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt="%H:%M:%S"))
        root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("dlc_jax").setLevel(level)


COMMANDS: dict[str, tuple[str, str]] = {
    "make-tiny": (
        "dlc_jax.model.tiny",
        "write a tiny random Qwen3 HF directory + offline tokenizer",
    ),
    "sampler": (
        "dlc_jax.sampler.service.cli",
        "sampler service: `dlc-jax sampler serve --backend vllm|jax ...`",
    ),
    "train": (
        "dlc_jax.trainer.cli",
        "run RL training: `dlc-jax train --config configs/X.yaml [k=v ...]`",
    ),
    "export": (
        "dlc_jax.trainer.export_cli",
        "convert an orbax training checkpoint to an HF directory",
    ),
    "experiment": ("dlc_jax.experiments.cli", "KL-to-on-policy experiments and report"),
    "bench": ("dlc_jax.bench.cli", "benchmarks against peers (writes JSON + markdown)"),
    "plan": ("dlc_jax.plan.cli", "will a config fit a TPU slice: AOT-compile it for the topology"),
}


def _usage() -> str:
    lines = [
        "usage: dlc-jax [--debug] COMMAND [args...]",
        "",
        "  --debug      show tracebacks of user errors (also DLC_JAX_DEBUG=1)",
        "",
        "commands:",
    ]
    lines += [f"  {name:<12} {doc}" for name, (_, doc) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("DLC_JAX_DEBUG", "") not in ("", "0")
    while argv and argv[0] == "--debug":
        debug, argv = True, argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from dlc_jax import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(
            f"dlc-jax: error: unknown command {name!r} (commands: {', '.join(COMMANDS)}; "
            "see dlc-jax --help)",
            file=sys.stderr,
        )
        return 2
    setup_logging()
    return run_command(name, rest, debug=debug)


def run_command(name: str, argv: list[str], *, debug: bool = False) -> int:
    """Run subcommand ``name``: user errors exit 2, Ctrl-C 130, in one line (``debug``: raised)."""
    from dlc_jax.errors import is_user_error, user_message

    try:
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.cli(argv) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"dlc-jax {name}: interrupted", file=sys.stderr, flush=True)
        return 130
    except Exception as e:
        if debug or not is_user_error(e):
            raise
        print(f"dlc-jax {name}: error: {user_message(e)}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
