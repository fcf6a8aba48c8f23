"""Damaged checkpoints read by fresh processes, repeated: `dlc-jax export` or `train` (resume) of a
checkpoint whose array data was bit-flipped, truncated, zeroed or deleted must end with exit 2 and
one ``dlc-jax ...: error:`` line every time, no traceback, nothing exported."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from .trainer_harness import Outcome, data_files, flip_file, run_dlc, truncate_file


def _flip_every_97th(p: Path) -> None:
    data = bytearray(p.read_bytes())
    for i in range(0, len(data), 97):
        data[i] ^= 0xFF
    p.write_bytes(bytes(data))


PATTERNS: dict[str, Callable[[Path], object]] = {  # each damages one array data file
    "flip_all": _flip_every_97th,
    "flip_300": lambda p: flip_file(p, 300, p.name),
    "truncate": truncate_file,
    "zero": lambda p: p.write_bytes(bytes(p.stat().st_size)),
    "delete": lambda p: p.unlink(),
}


def damaged_copy(good: Path, dst: Path, pattern: str) -> Path:
    """A copy of the checkpoint dir ``good`` at ``dst``, every array data file of every step
    damaged by ``pattern`` (a run's params are not in the largest file)."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(good, dst)
    for step in [p for p in dst.iterdir() if p.name.isdigit()]:
        for f in data_files(step):
            PATTERNS[pattern](f)
    return dst


def verdict(o: Outcome, command: str) -> str | None:
    """None for a clean refusal (exit 2, one ``dlc-jax CMD: error:`` line), else what's wrong."""
    lines = [ln for ln in o.err.splitlines() if ln.startswith(f"dlc-jax {command}: error:")]
    if o.traceback or "Event loop is closed" in o.err:  # orbax's, after the error line
        return "traceback"
    if o.rc != 2:
        return f"exit {o.rc}"
    if len(lines) != 1:
        return f"{len(lines)} error lines"
    return None


def repeat(
    good: Path, work: Path, command: Callable[[Path], list[str]], repeats: int, timeout: float
) -> list[dict]:
    """``repeats`` fresh processes ``command(damaged checkpoint dir)``, the patterns in turn -> per
    run: pattern, verdict (None = clean), whether ``work/out`` was written, stderr."""
    out = []
    name = command(work)[0]
    for i in range(repeats):
        pattern = list(PATTERNS)[i % len(PATTERNS)]
        ckpt = damaged_copy(good, work / "ckpt", pattern)
        shutil.rmtree(work / "out", ignore_errors=True)
        o = run_dlc(command(ckpt), timeout)
        out.append(
            {
                "pattern": pattern,
                "verdict": verdict(o, name),
                "written": (work / "out").exists(),
                "stderr": o.err[:3000],
            }
        )
    return out


def export_args(out: Path) -> Callable[[Path], list[str]]:
    return lambda ckpt: ["export", "--checkpoint", str(ckpt), "--out", str(out)]
