"""Soak the trainer's failure paths as a careless user and a hostile disk would, on real
`python -m dlc_jax.cli train` processes (a tiny model, the JAX sampler on loopback; ~10 minutes on
2 busy CPU cores): SIGKILLs at random points then resumes, bit flips and truncations of the newest
checkpoint, every checkpoint corrupt, a resume with a different config, `checkpoint.resume=false`
on a used run directory (and with `checkpoint.overwrite=true`), and user errors (docs/FAILURES.md
says what each must do). Counted: crashes, silent resumes from a corrupt or different run, bad
weights, files left behind, user errors that are not one line. The scenarios are in
`trainer_cases`, the runs, tallies and disk checks in `trainer_harness`; `run(out_dir)` writes
``trainer_soak.{json,md}`` and returns the result dict.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

from .. import common
from .trainer_cases import SoakConfig, kill_and_damage_cycles, refusal_cases, user_error_cases
from .trainer_harness import (
    Tally,
    nonfinite_checkpoints,
    sampler_orphans,
    staged_leftovers,
    tiny_model,
)


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
        cfg,
    )
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
        for pid in orphans:  # do not leave them running after the soak
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    staged_left = sorted(staged_leftovers() - staged_before)
    rows = list(t.rows.values())
    res["rows"] = rows
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
