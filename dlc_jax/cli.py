"""`dlc-jax` command line: a thin dispatcher to one module per subcommand.

Each subcommand lives in its own module and exposes `cli(argv: list[str]) -> int`; modules are
imported lazily so `dlc-jax --help` and `dlc-jax X --help` stay fast and do not import JAX/vLLM
for unrelated commands.

Logging: library modules log through `logging.getLogger(__name__)` and never configure it; the
command line does, once, here (`setup_logging`): records of `dlc_jax.*` at INFO and above, other
libraries at WARNING and above, one line each on stdout, written through `tqdm.write` so they do
not tear the training progress bar.

Errors: a user error (`dlc_jax.errors.UserError`, or a well-known "bad input" exception such as a
missing file, a YAML syntax error or a config error; see `dlc_jax.errors.is_user_error`) is printed
as one line, ``dlc-jax COMMAND: error: ...``, exit status 2; Ctrl-C prints one line and exits 130.
Subcommands raise their errors rather than print them, and parse their arguments with
`dlc_jax.cli_args.ArgumentParser`, whose errors are user errors too (argparse's own are 4-5 lines).
``dlc-jax --debug COMMAND ...`` (or ``DLC_JAX_DEBUG=1``) shows the traceback instead.
"""

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
    """Configure the root logger for a `dlc-jax` command (idempotent): `dlc_jax.*` at ``level``,
    everything else at WARNING, one formatted line per record on stdout."""
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
    for name, (_, doc) in COMMANDS.items():
        lines.append(f"  {name:<12} {doc}")
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
    """Run subcommand ``name``: user errors as one line (exit 2), Ctrl-C as one line (exit 130);
    with ``debug`` both raise with their traceback."""
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
