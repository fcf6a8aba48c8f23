"""The trainer soak's harness: damaging checkpoints, running `python -m dlc_jax.cli` and timing or
killing it, tallying the outcomes per scenario, and inspecting what a run left on disk (checkpoint
steps, metrics rows, non-finite arrays, staged pushes, sampler processes)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def tiny_model(work: Path) -> Path:
    """The tiny model the trainer-side soaks train (``<work>/tiny``)."""
    from dlc_jax.model.tiny import make_tiny

    return make_tiny(work / "tiny", hidden_size=64, intermediate_size=128, head_dim=16)


# ---- checkpoint damage (also used by tests) ----------------------------------------------------
def data_files(step_dir: Path) -> list[Path]:
    """The array data files of an orbax step directory, largest first."""
    files = [p for p in (Path(step_dir) / "state").rglob("*") if p.is_file()]
    files = [p for p in files if p.parent.name == "d" and p.stat().st_size > 0]
    return sorted(files, key=lambda p: -p.stat().st_size)


def flip_file(path: Path, n: int = 300, seed: int | str = 0) -> Path:
    """Flip ``n`` bytes (XOR 0xFF) of ``path`` at random offsets (same size); returns the file."""
    data = bytearray(path.read_bytes())
    for i in random.Random(seed).sample(range(len(data)), min(n, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def truncate_file(path: Path) -> Path:
    """Cut ``path`` to half its size; returns it."""
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    return path


def flip_bytes(step_dir: Path, n: int = 300, seed: int = 0) -> Path:
    """`flip_file` of the largest array data file of a step."""
    return flip_file(data_files(step_dir)[0], n, seed)


def truncate(step_dir: Path) -> Path:
    """`truncate_file` of the largest array data file of a step."""
    return truncate_file(data_files(step_dir)[0])


# ---- runs ------------------------------------------------------------------------------------
@dataclasses.dataclass
class Outcome:
    rc: int | None
    out: str
    err: str
    killed: bool = False
    seconds: float = 0.0

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.out + self.err

    @property
    def error_lines(self) -> list[str]:
        """The lines `dlc-jax` printed as its error (``dlc-jax CMD: ...`` on stderr)."""
        return [ln for ln in self.err.splitlines() if ln.startswith("dlc-jax ")]

    def one_line_error(self) -> bool:
        return self.rc not in (0, None) and len(self.error_lines) == 1 and not self.traceback


def _env() -> dict:
    env = dict(os.environ)
    env.update(XLA_FLAGS="", JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("DLC_JAX_DEBUG", None)
    return env


def run_dlc(
    args: list[str],
    timeout: float,
    *,
    kill_after_rows: int | None = None,
    metrics: Path | None = None,
    kill_delay_s: float = 0.0,
    env: dict | None = None,
) -> Outcome:
    """Run ``python -m dlc_jax.cli ARGS`` (``env``: on top of the soak's own); with
    ``kill_after_rows``, SIGKILL it ``kill_delay_s`` after ``metrics`` has that many rows."""
    t0 = time.time()
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        p = subprocess.Popen(
            [sys.executable, "-m", "dlc_jax.cli", *args],
            stdout=fo,
            stderr=fe,
            env={**_env(), **(env or {})},
            stdin=subprocess.DEVNULL,
        )
        killed = False
        try:
            if kill_after_rows is not None and metrics is not None:
                deadline = time.time() + timeout
                while time.time() < deadline and p.poll() is None:
                    rows = len(metrics.read_text().splitlines()) if metrics.exists() else 0
                    if rows >= kill_after_rows:
                        time.sleep(kill_delay_s)
                        if p.poll() is None:
                            p.send_signal(signal.SIGKILL)
                            killed = True
                        break
                    time.sleep(0.05)
            rc = p.wait(timeout=max(1.0, timeout - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        fo.seek(0)
        fe.seek(0)
        return Outcome(rc, fo.read(), fe.read(), killed, time.time() - t0)


class CountRows:
    """Rows of counts by name (column ``KEY``, then ``ZERO``'s) and example lines for the notes."""

    KEY = "scenario"
    ZERO: dict = {
        **dict.fromkeys(("cases", "ok", "crashes", "silent_bad_resumes", "multi_line_errors"), 0),
        "seconds": 0.0,
    }

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}
        self.examples: list[str] = []

    def row(self, name: str) -> dict:
        return self.rows.setdefault(name, {self.KEY: name, **self.ZERO})


class Tally(CountRows):
    """The trainer soak's rows: one per scenario of `dlc-jax` runs."""

    def __init__(self) -> None:
        super().__init__()
        self.refused_pushes = 0

    def record(
        self,
        scenario: str,
        o: Outcome,
        ok: bool,
        *,
        crash: bool = False,
        silent: bool = False,
        multi_line: bool = False,
        note: str = "",
    ) -> None:
        r = self.row(scenario)
        self.refused_pushes += (o.out + o.err).count("rejected weight push")
        r["cases"] += 1
        r["ok"] += int(ok)
        r["crashes"] += int(crash or o.traceback)
        r["silent_bad_resumes"] += int(silent)
        r["multi_line_errors"] += int(multi_line)
        r["seconds"] = round(r["seconds"] + o.seconds, 1)
        if not ok or o.traceback:
            tail = (o.err.strip().splitlines() or o.out.strip().splitlines() or [""])[-1]
            self.examples.append(f"{scenario}: rc={o.rc} {note} {tail[:200]}")
        elif o.error_lines:
            self.examples.append(f"{scenario}: {o.error_lines[0][:240]}")

    def refusal(self, scenario: str, o: Outcome, ok: bool, **kw) -> None:
        """`record` of a case that must end in one error line (a longer one is ``multi_line``)."""
        self.record(
            scenario, o, ok, multi_line=o.rc not in (0, None) and not o.one_line_error(), **kw
        )


def metric_rows(log_dir: Path) -> list[dict]:
    p = log_dir / "metrics.jsonl"
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line cut by a kill
            out.append(json.loads(line))
    return out


def checkpoint_steps(ckpt: Path) -> list[int]:
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.exists() else []


def resumed_at(o: Outcome) -> int | None:
    m = re.search(r"resumed from \S+ at step (\d+)", o.out + o.err)
    return int(m.group(1)) if m else None


def nonfinite_checkpoints(ckpt: Path) -> int:
    """How many step directories of ``ckpt`` hold non-finite arrays."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    bad = 0
    for s in checkpoint_steps(ckpt):
        tree = ocp.StandardCheckpointer().restore((ckpt / str(s) / "state").absolute())
        leaves = (np.asarray(x) for x in jax.tree.leaves(tree))
        bad += any(a.dtype.kind == "f" and not np.all(np.isfinite(a)) for a in leaves)
    return bad


def staged_leftovers() -> set[str]:
    """Staged weight pushes whose sampler process is gone (``dlc_push_p<pid>_*``)."""
    out = set()
    for root in {Path("/dev/shm"), Path(tempfile.gettempdir())}:
        for p in root.glob("dlc_push_p*_*") if root.exists() else []:
            m = re.match(r"dlc_push_p(\d+)_", p.name)
            if m and not Path(f"/proc/{m.group(1)}").exists():
                out.add(str(p))
    return out


def kill_all(pids) -> None:
    """SIGKILL each process of ``pids`` that is still there."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def sampler_orphans(model: Path) -> list[int]:
    """Sampler processes still serving ``model`` (they must die with their trainer)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "dlc_jax" in cmd and "serve" in cmd and str(model) in cmd:
            pids.append(int(d.name))
    return pids
