"""The W&B output of `MetricsLogger`, offline: the run's records are written by wandb's service
process."""

import time

import pytest

from dlc_jax.trainer.metrics_log import MetricsLogger


def test_wandb_offline_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    m = MetricsLogger(
        tmp_path,
        tensorboard=False,
        progress=False,
        config={"optim": {"lr": 0.5}},
        wandb={"project": "t", "run_name": "r1"},
    )
    m.log(1, {"reward_mean": 0.5, "ess_lag": 0.9})
    m.log_samples(1, [{"prompt": "p", "response": "r", "reward": 0.5}])
    m.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    # the run's records (config, metrics) are written by wandb's service process: wait for them
    deadline, record = time.time() + 60, b""
    while time.time() < deadline and not (b"ess/lag" in record and b"optim.lr" in record):
        time.sleep(0.5)
        record = next(runs[0].glob("*.wandb")).read_bytes()
    assert b"optim.lr" in record and b"reward/mean" in record and b"ess/lag" in record
    assert list((runs[0] / "files" / "media" / "table").glob("samples_1_*.table.json"))
