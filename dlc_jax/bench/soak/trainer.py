"""Soak the trainer's failure paths (docs/FAILURES.md) on real `python -m dlc_jax.cli train`
processes: SIGKILLs and damaged checkpoints on one run directory followed by resumes, refusals and
user errors. Counted: crashes, silent resumes from a corrupt or different run, bad weights, files
left behind, user errors that are not one line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import re
import sys
import tempfile
import time
from pathlib import Path

from .. import common
from .trainer_harness import (
    Tally,
    checkpoint_steps,
    flip_bytes,
    kill_all,
    metric_rows,
    nonfinite_checkpoints,
    resumed_at,
    run_dlc,
    sampler_orphans,
    staged_leftovers,
    tiny_model,
    truncate,
)


@dataclasses.dataclass
class SoakConfig:
    kills: int = 2  # SIGKILLs of the trainer at random points, each followed by a resume
    flips: int = 1  # bit flips of the newest checkpoint, each followed by a resume (+ a kill)
    truncations: int = 1  # truncations of the newest checkpoint, each followed by a resume
    steps: int = 12  # train.steps of the soaked run
    flip_bytes: int = 300
    run_timeout_s: float = 900.0
    seed: int = 0


# the soaked runs' settings (the tiny model, the JAX sampler spawned on loopback)
_TRAIN = (
    "sft.enabled=false sampler.backend=jax sampler.n=2 sampler.max_tokens=4 sampler.head_k=2 "
    "sampler.max_model_len=64 train.batch_prompts=2 async.prefetch=0 resync.policy=every_k "
    "resync.k=2 optim.lr=3e-3 log.progress=false log.tensorboard=false checkpoint.every=1 "
    "checkpoint.keep=2"
).split()


def _train_args(model: Path, run: Path, steps: int, *extra: str) -> list[str]:
    run_keys = [f"train.steps={steps}", f"log.dir={run}/logs", f"checkpoint.dir={run}/ckpt"]
    return ["train", f"model.path={model}", *_TRAIN, *run_keys, *extra]


def kill_and_damage_cycles(
    cfg: SoakConfig, model: Path, run: Path, t: Tally, rng: random.Random, timeout: float
) -> None:
    """Kill / damage / resume cycles on one run directory, then let it finish."""
    args = _train_args(model, run, cfg.steps)
    metrics = run / "logs" / "metrics.jsonl"
    damage = ["flip"] * cfg.flips + ["truncate"] * cfg.truncations
    rng.shuffle(damage)
    plan = ["kill"] * cfg.kills + damage  # kills first: damage needs an older step to fall to

    def killed_run(rows: int):
        """A run SIGKILLed at a random moment after the metrics have ``rows`` rows."""
        delay = rng.uniform(0.0, 1.5)
        return run_dlc(args, timeout, kill_after_rows=rows, metrics=metrics, kill_delay_s=delay)

    for what in plan:
        rows_now = len(metric_rows(run / "logs"))
        if rows_now >= cfg.steps - 1:
            break
        o = killed_run(rows_now + rng.randint(1, 2))
        note = "(not killed)" if not o.killed else ""
        t.record("SIGKILL at a random point", o, ok=o.killed and not o.traceback, note=note)
        if what == "kill":
            continue
        steps = checkpoint_steps(run / "ckpt")
        if len(steps) < 2:
            continue  # nothing older to fall back to: damage the next cycle instead
        newest = steps[-1]
        if what == "flip":
            flip_bytes(run / "ckpt" / str(newest), cfg.flip_bytes, seed=rng.randint(0, 10**6))
            scenario = "bit flip in newest checkpoint"
        else:
            truncate(run / "ckpt" / str(newest))
            scenario = "truncated newest checkpoint"
        o = killed_run(len(metric_rows(run / "logs")) + 1)
        at = resumed_at(o)
        named = re.search(rf"ckpt/{newest}\b.*corrupt|corrupt.*\b{newest}\b", o.out + o.err)
        silent = at is None or at >= newest or not named
        note = f"(resumed at {at}, damaged {newest})"
        t.record(scenario, o, ok=not silent and not o.traceback, silent=silent, note=note)
        t.record("SIGKILL at a random point", o, ok=o.killed and not o.traceback)
    o = run_dlc(args, timeout)  # finish the run
    t.record("resume to the end", o, ok=o.rc == 0 and not o.traceback, crash=o.rc != 0)


def refusal_cases(model: Path, run: Path, t: Tally, timeout: float) -> None:
    steps = 2
    ckpt_before = checkpoint_steps(run / "ckpt")
    for key in ("loss.name=ppo_clip", "resync.policy=never", "optim.lr=1e-2"):
        o = run_dlc(_train_args(model, run, 99, key), timeout)
        name = key.split("=")[0]
        silent = (
            o.rc == 0 or resumed_at(o) is not None or checkpoint_steps(run / "ckpt") != ckpt_before
        )
        ok = o.one_line_error() and name in "".join(o.error_lines) and not silent
        t.refusal("resume with a different config", o, ok, silent=silent)
    o = run_dlc(_train_args(model, run, steps, "checkpoint.resume=false"), timeout)
    silent = o.rc == 0
    t.refusal("resume=false on a used run dir", o, ok=o.one_line_error(), silent=silent)
    args = _train_args(model, run, steps, "checkpoint.resume=false", "checkpoint.overwrite=true")
    o = run_dlc(args, timeout)
    rows = [r["step"] for r in metric_rows(run / "logs")]
    fresh = (
        o.rc == 0 and rows == list(range(1, steps + 1)) and checkpoint_steps(run / "ckpt") == [1, 2]
    )
    t.record("resume=false overwrite=true", o, ok=fresh, silent=not fresh)
    # every checkpoint damaged: refuse in one line, nothing silently restarted
    for s in checkpoint_steps(run / "ckpt"):
        flip_bytes(run / "ckpt" / str(s), 300, seed=s)
    o = run_dlc(_train_args(model, run, steps + 2), timeout)
    silent = o.rc == 0 or resumed_at(o) is not None
    t.refusal("every checkpoint corrupt", o, ok=o.one_line_error() and not silent, silent=silent)


def user_error_cases(model: Path, work: Path, t: Tally, timeout: float) -> None:
    bad_yaml = work / "bad.yaml"
    bad_yaml.write_text("train: {steps: 3\nloss: [\n")
    run = work / "ue"
    export = ["export", "--checkpoint", str(work / "no_ckpt"), "--out", str(work / "exp")]
    serve = ["sampler", "serve", "--backend", "jax", "--model", str(work / "no_such_model")]
    cases = {
        "missing model path": _train_args(work / "no_such_model", run, 2),
        "YAML syntax error": ["train", "--config", str(bad_yaml)],
        "missing config file": ["train", "--config", str(work / "nope.yaml")],
        "unknown config key": _train_args(model, run, 2, "optim.lrr=1"),
        "bad config value": _train_args(model, run, 2, "sampler.n=0"),
        "unreachable sampler.address": _train_args(
            model, run, 2, "sampler.address=127.0.0.1:9", "sampler.connect_timeout_s=3"
        ),
        "export of a missing checkpoint": [*export, "--model", str(model)],
        "sampler serve of a missing model": [*serve, "--port", "0"],
        "make-tiny into a file": ["make-tiny", str(bad_yaml)],
    }
    for name, args in cases.items():
        o = run_dlc(args, timeout)
        t.record(f"user error: {name}", o, ok=o.one_line_error(), multi_line=not o.one_line_error())


def run(out_dir, cfg: SoakConfig | None = None) -> dict:
    """Run the trainer soak; write ``<out_dir>/trainer_soak.{json,md}``; return the result."""
    cfg = cfg or SoakConfig()
    title = "Trainer soak (kills, damaged checkpoints, refusals, user errors; loopback)"
    cols = ["scenario", "cases", "ok", "crashes", "silent_bad_resumes", "multi_line_errors"]
    res = common.new_result("trainer_soak", title, [*cols, "seconds"], cfg)
    rng = random.Random(cfg.seed)
    t = Tally()
    staged_before = staged_leftovers()
    with tempfile.TemporaryDirectory(prefix="dlc_trainer_soak_") as tmp:
        work = Path(tmp)
        model = tiny_model(work)
        run_dir = work / "run"
        kill_and_damage_cycles(cfg, model, run_dir, t, rng, cfg.run_timeout_s)
        bad_weights = nonfinite_checkpoints(run_dir / "ckpt")
        refusal_cases(model, run_dir, t, cfg.run_timeout_s)
        user_error_cases(model, work, t, cfg.run_timeout_s)
        tmp_left = [str(p) for p in work.rglob("*orbax-checkpoint-tmp*")]
        time.sleep(1.0)
        orphans = sampler_orphans(model)
        kill_all(orphans)  # do not leave them running after the soak
    staged_left = sorted(staged_leftovers() - staged_before)
    res["rows"] = rows = list(t.rows.values())
    refusals = (
        "resume with a different config",
        "resume=false on a used run dir",
        "every checkpoint corrupt",
    )
    s = res["summary"] = common.case_totals(rows, "crashes", "silent_bad_resumes")
    s.update(
        bad_weights=bad_weights + t.refused_pushes,
        files_left_behind=len(tmp_left) + len(staged_left) + len(orphans),
        user_errors=sum(
            r["cases"]
            for r in rows
            if r["scenario"].startswith("user error") or r["scenario"] in refusals
        ),
        multi_line_user_errors=common.totals(rows, "multi_line_errors")["multi_line_errors"],
        kills=t.row("SIGKILL at a random point")["cases"],
        checkpoint_damage=t.row("bit flip in newest checkpoint")["cases"]
        + t.row("truncated newest checkpoint")["cases"],
    )
    res["metrics"] = {
        "orbax_tmp_left": tmp_left,
        "staged_left": staged_left,
        "sampler_orphans": orphans,
    }
    res["targets"] = common.zero_targets(
        s,
        {
            "crashes": "crashes",
            "silent resumes from a corrupt or different run": "silent_bad_resumes",
            "bad weights": "bad_weights",
            "files left behind": "files_left_behind",
            "user errors not one line": "multi_line_user_errors",
            "failed cases": "failed_cases",
        },
    )
    return common.finish_soak(res, out_dir, t.examples[:40])


if __name__ == "__main__":  # python -m dlc_jax.bench.soak.trainer OUT_DIR
    logging.basicConfig(level=logging.WARNING)
    r = run(sys.argv[1] if len(sys.argv) > 1 else "soak_out")
    print(json.dumps(r["summary"], indent=2))
