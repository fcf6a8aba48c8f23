"""Soak the trainer's failure paths as a careless user and a hostile disk would, and count what went
wrong. Loopback only, bounded (a few `dlc-jax train` runs of a tiny model with the JAX sampler
backend spawned on loopback; ~10 minutes on 2 busy CPU cores).

Scenarios, all on real `python -m dlc_jax.cli train` processes:

* SIGKILL of the trainer at random points (after a random number of steps plus a random delay, so
  some land inside a checkpoint save), each followed by a resume;
* bit flips (a few hundred bytes, same file size) and truncations of the newest checkpoint's array
  data, then a resume: the run must name the bad step in one line and resume from an older one;
* every checkpoint corrupt: the run must refuse in one line;
* a resume with a different training config (loss, resync policy): refused in one line naming the
  keys;
* ``checkpoint.resume=false`` on a used run directory: refused; with ``checkpoint.overwrite=true``
  the old run's checkpoints and metrics are gone and the new run starts at step 1;
* user errors (missing model path, YAML syntax error, unknown key, unreachable sampler address,
  missing export checkpoint, bad config value): one line each, non-zero exit.

Counted: crashes (a Python traceback or an unexpected exit status), silent resumes from a corrupt
or different run, bad weights (non-finite values in a checkpoint, a push the sampler refused),
files left behind (half-written orbax temp dirs, staged weights of dead samplers, sampler processes
outliving the trainer), user errors that are not exactly one line. `run(out_dir)` writes
``trainer_soak.{json,md}`` and returns the result dict.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import common

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SoakConfig:
    kills: int = 2  # SIGKILLs of the trainer at random points, each followed by a resume
    flips: int = 1  # bit flips of the newest checkpoint, each followed by a resume (+ a kill)
    truncations: int = 1  # truncations of the newest checkpoint, each followed by a resume
    steps: int = 12  # train.steps of the soaked run
    flip_bytes: int = 300
    run_timeout_s: float = 900.0
    seed: int = 0


# ---- checkpoint damage (also used by tests) ----------------------------------------------------
def data_files(step_dir: Path) -> list[Path]:
    """The array data files of an orbax step directory, largest first."""
    files = [p for p in (Path(step_dir) / "state").rglob("*") if p.is_file()]
    files = [p for p in files if p.parent.name == "d" and p.stat().st_size > 0]
    return sorted(files, key=lambda p: -p.stat().st_size)


def flip_bytes(step_dir: Path, n: int = 300, seed: int = 0) -> Path:
    """Flip ``n`` bytes (XOR 0xFF) at random offsets of the largest array data file (same size);
    returns the file."""
    path = data_files(step_dir)[0]
    data = bytearray(path.read_bytes())
    rng = random.Random(seed)
    for i in rng.sample(range(len(data)), min(n, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def truncate(step_dir: Path) -> Path:
    """Cut the largest array data file of a step to half its size; returns the file."""
    path = data_files(step_dir)[0]
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    return path


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


def _dlc(
    args: list[str],
    timeout: float,
    *,
    kill_after_rows: int | None = None,
    metrics: Path | None = None,
    kill_delay_s: float = 0.0,
) -> Outcome:
    """Run ``python -m dlc_jax.cli ARGS``; with ``kill_after_rows``, SIGKILL it ``kill_delay_s``
    after ``metrics`` has that many rows."""
    t0 = time.time()
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        p = subprocess.Popen(
            [sys.executable, "-m", "dlc_jax.cli", *args],
            stdout=fo,
            stderr=fe,
            env=_env(),
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


class Tally:
    def __init__(self):
        self.rows: dict[str, dict] = {}
        self.examples: list[str] = []
        self.refused_pushes = 0

    def row(self, scenario: str) -> dict:
        return self.rows.setdefault(
            scenario,
            {
                "scenario": scenario,
                "cases": 0,
                "ok": 0,
                "crashes": 0,
                "silent_bad_resumes": 0,
                "multi_line_errors": 0,
                "seconds": 0.0,
            },
        )

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


def _rows(log_dir: Path) -> list[dict]:
    p = log_dir / "metrics.jsonl"
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _steps(ckpt: Path) -> list[int]:
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.exists() else []


def _resumed_at(o: Outcome) -> int | None:
    m = re.search(r"resumed from \S+ at step (\d+)", o.out + o.err)
    return int(m.group(1)) if m else None


def _finite_checkpoints(ckpt: Path) -> int:
    """How many step directories of ``ckpt`` hold non-finite arrays."""
    import numpy as np
    import orbax.checkpoint as ocp

    bad = 0
    for s in _steps(ckpt):
        tree = ocp.StandardCheckpointer().restore((ckpt / str(s) / "state").absolute())
        import jax

        for x in jax.tree.leaves(tree):
            a = np.asarray(x)
            if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
                bad += 1
                break
    return bad


def _staged_leftovers() -> set[str]:
    """Staged weight pushes whose sampler process is gone (``dlc_push_p<pid>_*``)."""
    out = set()
    for root in {Path("/dev/shm"), Path(tempfile.gettempdir())}:
        for p in root.glob("dlc_push_p*_*") if root.exists() else []:
            m = re.match(r"dlc_push_p(\d+)_", p.name)
            if m and not Path(f"/proc/{m.group(1)}").exists():
                out.add(str(p))
    return out


def _sampler_orphans(model: Path) -> list[int]:
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


# ---- the soak --------------------------------------------------------------------------------
def _train_args(model: Path, run: Path, steps: int, *extra: str) -> list[str]:
    return [
        "train",
        f"model.path={model}",
        "sft.enabled=false",
        "sampler.backend=jax",
        "sampler.n=2",
        "sampler.max_tokens=4",
        "sampler.head_k=2",
        "sampler.max_model_len=64",
        "train.batch_prompts=2",
        f"train.steps={steps}",
        "async.prefetch=0",
        "resync.policy=every_k",
        "resync.k=2",
        "optim.lr=3e-3",
        "log.progress=false",
        "log.tensorboard=false",
        f"log.dir={run}/logs",
        f"checkpoint.dir={run}/ckpt",
        "checkpoint.every=1",
        "checkpoint.keep=2",
        *extra,
    ]


def _kills_and_corruption(
    cfg: SoakConfig, model: Path, run: Path, t: Tally, rng: random.Random, timeout: float
) -> None:
    """Kill / damage / resume cycles on one run directory, then let it finish."""
    args = _train_args(model, run, cfg.steps)
    metrics = run / "logs" / "metrics.jsonl"
    damage = ["flip"] * cfg.flips + ["truncate"] * cfg.truncations
    rng.shuffle(damage)
    plan = ["kill"] * cfg.kills + damage  # kills first: damage needs an older step to fall to
    for what in plan:
        rows_now = len(_rows(run / "logs"))
        if rows_now >= cfg.steps - 1:
            break
        target = rows_now + rng.randint(1, 2)
        o = _dlc(
            args,
            timeout,
            kill_after_rows=target,
            metrics=metrics,
            kill_delay_s=rng.uniform(0.0, 1.5),
        )
        t.record(
            "SIGKILL at a random point",
            o,
            ok=o.killed and not o.traceback,
            note="(not killed)" if not o.killed else "",
        )
        if what == "kill":
            continue
        steps = _steps(run / "ckpt")
        if len(steps) < 2:
            continue  # nothing older to fall back to: damage the next cycle instead
        newest = steps[-1]
        if what == "flip":
            flip_bytes(run / "ckpt" / str(newest), cfg.flip_bytes, seed=rng.randint(0, 10**6))
        else:
            truncate(run / "ckpt" / str(newest))
        o = _dlc(
            args,
            timeout,
            kill_after_rows=len(_rows(run / "logs")) + 1,
            metrics=metrics,
            kill_delay_s=rng.uniform(0.0, 1.5),
        )
        at = _resumed_at(o)
        named = re.search(rf"ckpt/{newest}\b.*corrupt|corrupt.*\b{newest}\b", o.out + o.err)
        silent = at is None or at >= newest or not named
        scenario = (
            "bit flip in newest checkpoint" if what == "flip" else "truncated newest checkpoint"
        )
        t.record(
            scenario,
            o,
            ok=not silent and not o.traceback,
            silent=silent,
            note=f"(resumed at {at}, damaged {newest})",
        )
        t.record("SIGKILL at a random point", o, ok=o.killed and not o.traceback)
    o = _dlc(args, timeout)  # finish the run
    t.record("resume to the end", o, ok=o.rc == 0 and not o.traceback, crash=o.rc != 0)


def _refusals(model: Path, run: Path, t: Tally, timeout: float) -> None:
    steps = 2
    ckpt_before = _steps(run / "ckpt")
    for key in ("loss.name=ppo_clip", "resync.policy=never", "optim.lr=1e-2"):
        o = _dlc(_train_args(model, run, 99, key), timeout)
        name = key.split("=")[0]
        silent = o.rc == 0 or _resumed_at(o) is not None or _steps(run / "ckpt") != ckpt_before
        ok = o.one_line_error() and name in "".join(o.error_lines) and not silent
        t.record(
            "resume with a different config",
            o,
            ok,
            silent=silent,
            multi_line=o.rc not in (0, None) and not o.one_line_error(),
        )
    o = _dlc(_train_args(model, run, steps, "checkpoint.resume=false"), timeout)
    silent = o.rc == 0
    t.record(
        "resume=false on a used run dir",
        o,
        ok=o.one_line_error(),
        silent=silent,
        multi_line=o.rc not in (0, None) and not o.one_line_error(),
    )
    o = _dlc(
        _train_args(model, run, steps, "checkpoint.resume=false", "checkpoint.overwrite=true"),
        timeout,
    )
    rows = [r["step"] for r in _rows(run / "logs")]
    fresh = o.rc == 0 and rows == list(range(1, steps + 1)) and _steps(run / "ckpt") == [1, 2]
    t.record("resume=false overwrite=true", o, ok=fresh, silent=not fresh)
    # every checkpoint damaged: refuse in one line, nothing silently restarted
    for s in _steps(run / "ckpt"):
        flip_bytes(run / "ckpt" / str(s), 300, seed=s)
    o = _dlc(_train_args(model, run, steps + 2), timeout)
    silent = o.rc == 0 or _resumed_at(o) is not None
    t.record(
        "every checkpoint corrupt",
        o,
        ok=o.one_line_error() and not silent,
        silent=silent,
        multi_line=o.rc not in (0, None) and not o.one_line_error(),
    )


def _user_errors(model: Path, work: Path, t: Tally, timeout: float) -> None:
    bad_yaml = work / "bad.yaml"
    bad_yaml.write_text("train: {steps: 3\nloss: [\n")
    run = work / "ue"
    cases = {
        "missing model path": _train_args(work / "no_such_model", run, 2),
        "YAML syntax error": ["train", "--config", str(bad_yaml)],
        "missing config file": ["train", "--config", str(work / "nope.yaml")],
        "unknown config key": _train_args(model, run, 2, "optim.lrr=1"),
        "bad config value": _train_args(model, run, 2, "sampler.n=0"),
        "unreachable sampler.address": _train_args(
            model, run, 2, "sampler.address=127.0.0.1:9", "sampler.connect_timeout_s=3"
        ),
        "export of a missing checkpoint": [
            "export",
            "--checkpoint",
            str(work / "no_ckpt"),
            "--out",
            str(work / "exp"),
            "--model",
            str(model),
        ],
        "sampler serve of a missing model": [
            "sampler",
            "serve",
            "--backend",
            "jax",
            "--model",
            str(work / "no_such_model"),
            "--port",
            "0",
        ],
        "make-tiny into a file": ["make-tiny", str(bad_yaml)],
    }
    for name, args in cases.items():
        o = _dlc(args, timeout)
        t.record(f"user error: {name}", o, ok=o.one_line_error(), multi_line=not o.one_line_error())


def run(out_dir, cfg: SoakConfig | None = None) -> dict:
    """Run the trainer soak; write ``<out_dir>/trainer_soak.{json,md}``; return the result."""
    cfg = cfg or SoakConfig()
    res = common.new_result(
        "trainer_soak",
        "Trainer soak (kills, damaged checkpoints, refusals, user errors; loopback)",
        [
            "scenario",
            "cases",
            "ok",
            "crashes",
            "silent_bad_resumes",
            "multi_line_errors",
            "seconds",
        ],
    )
    res["config"] = dataclasses.asdict(cfg)
    rng = random.Random(cfg.seed)
    t = Tally()
    staged_before = _staged_leftovers()
    with tempfile.TemporaryDirectory(prefix="dlc_trainer_soak_") as tmp:
        work = Path(tmp)
        from dlc_jax.model.tiny import make_tiny

        model = make_tiny(work / "tiny", hidden_size=64, intermediate_size=128, head_dim=16)
        run_dir = work / "run"
        _kills_and_corruption(cfg, model, run_dir, t, rng, cfg.run_timeout_s)
        bad_weights = _finite_checkpoints(run_dir / "ckpt")
        _refusals(model, run_dir, t, cfg.run_timeout_s)
        _user_errors(model, work, t, cfg.run_timeout_s)
        tmp_left = [str(p) for p in work.rglob("*orbax-checkpoint-tmp*")]
        time.sleep(1.0)
        orphans = _sampler_orphans(model)
        for pid in orphans:  # do not leave them running after the soak
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    staged_left = sorted(_staged_leftovers() - staged_before)
    refused_pushes = t.refused_pushes
    rows = list(t.rows.values())
    res["rows"] = rows
    crashes = sum(r["crashes"] for r in rows)
    silent = sum(r["silent_bad_resumes"] for r in rows)
    multi = sum(r["multi_line_errors"] for r in rows)
    files_left = len(tmp_left) + len(staged_left) + len(orphans)
    failed = sum(r["cases"] - r["ok"] for r in rows)
    user_errors = sum(
        r["cases"]
        for r in rows
        if r["scenario"].startswith("user error")
        or r["scenario"]
        in (
            "resume with a different config",
            "resume=false on a used run dir",
            "every checkpoint corrupt",
        )
    )
    res["summary"] = {
        "cases": sum(r["cases"] for r in rows),
        "failed_cases": failed,
        "crashes": crashes,
        "silent_bad_resumes": silent,
        "bad_weights": bad_weights + refused_pushes,
        "files_left_behind": files_left,
        "user_errors": user_errors,
        "multi_line_user_errors": multi,
        "kills": t.row("SIGKILL at a random point")["cases"],
        "checkpoint_damage": t.row("bit flip in newest checkpoint")["cases"]
        + t.row("truncated newest checkpoint")["cases"],
    }
    res["metrics"] = {
        "orbax_tmp_left": tmp_left,
        "staged_left": staged_left,
        "sampler_orphans": orphans,
    }
    res["targets"] = [
        common.target("crashes", crashes, 0, "<="),
        common.target("silent resumes from a corrupt or different run", silent, 0, "<="),
        common.target("bad weights", bad_weights + refused_pushes, 0, "<="),
        common.target("files left behind", files_left, 0, "<="),
        common.target("user errors not one line", multi, 0, "<="),
        common.target("failed cases", failed, 0, "<="),
    ]
    res["notes"] += t.examples[:40]
    res["notes"].append(common.load_note(res["machine"]))
    common.finish(res)
    common.write_result(res, out_dir)
    return res


if __name__ == "__main__":  # python -m dlc_jax.bench.soak_trainer OUT_DIR
    logging.basicConfig(level=logging.WARNING)
    r = run(sys.argv[1] if len(sys.argv) > 1 else "soak_out")
    print(json.dumps(r["summary"], indent=2))
