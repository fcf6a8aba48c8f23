"""SIGKILL mid-training and resume: with the in-process JAX sampler (seeded, in the killed process)
the resumed run ends with the same params, optimizer state and metrics as an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from xla_env import xla_flags

from dlc_jax.trainer.checkpoint import Checkpointer

pytestmark = pytest.mark.slow


# room after the kill point (3 steps and a finished checkpoint) for the run to still be going
STEPS = 8


def _cmd(tiny_dir, d):
    return [
        sys.executable,
        "-m",
        "dlc_jax.cli",
        "train",
        f"model.path={tiny_dir}",
        "sft.enabled=false",
        "sampler.backend=inprocess",
        "sampler.n=4",
        "sampler.max_tokens=4",
        "sampler.head_k=4",
        "train.batch_prompts=4",
        f"train.steps={STEPS}",
        "async.prefetch=0",
        "resync.policy=every_k",
        "resync.k=2",
        "optim.lr=3e-3",
        "log.progress=false",
        "log.tensorboard=false",
        f"log.dir={d}/logs",
        f"checkpoint.dir={d}/ckpt",
        "checkpoint.every=1",
        "checkpoint.keep=2",
    ]


def _env():
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags()  # single device, as a user's CPU run
    return env


def _rows(d):
    return {
        r["step"]: r
        for r in map(json.loads, (d / "logs" / "metrics.jsonl").read_text().splitlines())
    }


def test_sigkill_and_resume_equals_uninterrupted(tiny_dir, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    subprocess.run(_cmd(tiny_dir, a), check=True, env=_env(), capture_output=True, timeout=900)
    p = subprocess.Popen(
        _cmd(tiny_dir, b), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    metrics, ckpt = b / "logs" / "metrics.jsonl", b / "ckpt"

    def saved() -> bool:  # a finished checkpoint (orbax renames its temporary directory)
        return ckpt.is_dir() and any(d.name.isdigit() for d in ckpt.iterdir())

    deadline = time.time() + 600
    while time.time() < deadline and p.poll() is None:
        # past the third step and with a checkpoint on disk: checkpoints are written in the
        # background, so on a loaded machine the third step can come before the first save
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3 and saved():
            break
        time.sleep(0.05)
    assert p.poll() is None, "run finished before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait()
    killed_at = Checkpointer(b / "ckpt").latest_step()
    assert killed_at is not None and killed_at < STEPS
    r = subprocess.run(_cmd(tiny_dir, b), env=_env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert f"at step {killed_at}" in r.stdout
    ra, rb = _rows(a), _rows(b)
    assert sorted(rb) == list(range(1, STEPS + 1))
    # the resumed steps saw the same data, samples and weights
    for s in range(killed_at + 1, STEPS + 1):
        for k in ("reward_mean", "weight_version", "synced_version", "version_lag", "num_tokens"):
            assert ra[s][k] == rb[s][k], (s, k, ra[s][k], rb[s][k])
        np.testing.assert_allclose(rb[s]["loss/loss"], ra[s]["loss/loss"], rtol=1e-4, atol=1e-6)
    ca, cb = Checkpointer(a / "ckpt"), Checkpointer(b / "ckpt")
    ma, mb = ca.restore_meta(STEPS), cb.restore_meta(STEPS)
    assert ma["data_state"] == mb["data_state"] and ma["synced_version"] == mb["synced_version"]
    # restore both final states on the structure the checkpoint itself records
    import orbax.checkpoint as ocp

    sa = ocp.StandardCheckpointer().restore((a / "ckpt" / str(STEPS) / "state").absolute())
    sb = ocp.StandardCheckpointer().restore((b / "ckpt" / str(STEPS) / "state").absolute())
    la, lb = jax.tree.leaves(sa), jax.tree.leaves(sb)
    assert len(la) == len(lb) > 10
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)
