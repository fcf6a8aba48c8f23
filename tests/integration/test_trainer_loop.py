"""Integration: the RL loop against a real JAX-backend sampler on loopback (gRPC subprocess).

policy never -> lag ESS falls; ess -> recovers after each resync; onpolicy -> lag exactly zero and
no
snapshot forward; sampler killed mid-run -> reconnect without losing or double-counting a batch.
"""

import json
import logging
import socket
import threading
import time

import pytest

from dlc_jax.trainer.config import default_config_path, load_config

pytestmark = pytest.mark.slow


def _cfg(tiny_dir, tmp_path, *extra):
    return load_config(
        default_config_path(),
        [
            f"model.path={tiny_dir}",
            "sft.enabled=false",
            "sampler.backend=jax",
            "sampler.n=4",
            "sampler.max_tokens=4",
            "sampler.head_k=4",
            "train.batch_prompts=4",
            "log.progress=false",
            "log.tensorboard=false",
            f"log.dir={tmp_path}/logs",
            f"checkpoint.dir={tmp_path}/ckpt",
            "checkpoint.every=0",
            "optim.lr=3e-3",
            "sampler.temperature=1.0",
            # the untrained tiny model never answers correctly; a format reward (response contains
            # an "e") gives every group reward variance, so the policy moves and the lag grows
            "reward.correct=0",
            "reward.format_bonus=1",
            "reward.strict_format=(?s).*e.*",
            *extra,
        ],
    )


def _rows(tmp_path):
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _run(cfg):
    from dlc_jax.trainer.build import build_trainer

    t = build_trainer(cfg)
    return t, t.run()


def test_onpolicy_lag_exactly_zero_no_snapshot_forward(tiny_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="dlc_jax")
    t, s = _run(_cfg(tiny_dir, tmp_path, "resync.policy=onpolicy", "train.steps=3"))
    rows = _rows(tmp_path)
    assert s["finished"] and [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["ell_mean"] == 0.0 and r["ell_std"] == 0.0 and r["ess_lag"] == 1.0 for r in rows)
    assert all(r["version_lag"] == 0.0 for r in rows)
    assert s["snapshot_forwards"] == 0 and s["resync_count"] == 3
    # the decomposition still sees the sampler/trainer numerical discrepancy (tiny, not zero by
    # construction)
    assert all(abs(r["delta_mean"]) < 1e-3 for r in rows)
    # the spawned loopback sampler offers its socket data plane: every resync push used it
    pushes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("push: version")]
    assert len(pushes) == 3 and all(" via socket " in m for m in pushes), pushes


def test_never_ess_falls_and_ess_policy_recovers(tiny_dir, tmp_path):
    never = tmp_path / "never"
    inproc = "sampler.backend=inprocess"  # the policies, not the process boundary, are tested here
    _, s = _run(
        _cfg(tiny_dir, never, inproc, "resync.policy=never", "train.steps=5", "async.prefetch=0")
    )
    ess = [r["ess_lag"] for r in _rows(never)]
    lag = [r["version_lag"] for r in _rows(never)]
    assert lag == [0.0, 1.0, 2.0, 3.0, 4.0] and s["resync_count"] == 0
    assert ess[0] == 1.0 and ess[-1] < ess[1] < 1.0, (
        ess
    )  # the lag ratio degenerates as theta_t moves away
    essd = tmp_path / "ess"
    _, s = _run(
        _cfg(
            tiny_dir,
            essd,
            inproc,
            "resync.policy=ess",
            "resync.threshold=0.985",
            "train.steps=6",
            "async.prefetch=0",
        )
    )
    rows = _rows(essd)
    assert s["resync_ess"] >= 1
    for i, r in enumerate(rows[:-1]):
        if r["resync"]:
            assert r["ess_lag"] < 0.985  # triggered by the ESS
            assert (
                rows[i + 1]["version_lag"] == 0.0 and rows[i + 1]["ess_lag"] == 1.0
            )  # recovered: fresh sampler


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sampler_killed_mid_run_reconnects(tiny_dir, tmp_path, caplog):
    from dlc_jax.sampler.service.process import SamplerProcess
    from dlc_jax.trainer.build import build_trainer

    port = _free_port()
    args = ["--max-model-len", "64", "--max-head-k", "4"]
    proc = SamplerProcess("jax", str(tiny_dir), port=port, extra_args=args).start()
    cfg = _cfg(
        tiny_dir,
        tmp_path,
        f"sampler.address=127.0.0.1:{port}",
        # enough steps that the run cannot finish between two polls (a warm step takes ~0.03 s)
        "train.steps=40",
        "resync.policy=every_k",
        "resync.k=1",
        "sampler.reconnect_timeout_s=120",
        # the client gives up on the dead sampler after one quick retry, so the trainer's own
        # reconnect (the subject) takes over
        "sampler.retries=1",
        "sampler.retry_backoff_s=0.1",
    )
    caplog.set_level(logging.INFO, logger="dlc_jax")
    trainer = build_trainer(cfg)
    out = {}
    th = threading.Thread(target=lambda: out.update(trainer.run()))
    th.start()
    path = tmp_path / "logs" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (
        path.exists() and len(path.read_text().splitlines()) >= 2
    ):
        time.sleep(0.02)
    proc.kill()
    # longer than the client's own UNAVAILABLE retries (one, 0.1 s): the trainer must reconnect
    time.sleep(3.0)
    proc2 = SamplerProcess("jax", str(tiny_dir), port=port, extra_args=args).start()
    try:
        th.join(400)
        assert not th.is_alive()
        rows = _rows(tmp_path)
        assert out["finished"] and [r["step"] for r in rows] == list(
            range(1, 41)
        )  # no batch lost or repeated
        assert out["reconnects"] >= 1
        assert proc2.client().info()["version"] == 40  # the new sampler got the trainer's weights
        # a sampler started without a data port: pushes fall back to gRPC
        pushes = [
            r.getMessage() for r in caplog.records if r.getMessage().startswith("push: version")
        ]
        assert pushes and all(" via grpc " in m for m in pushes), pushes
    finally:
        proc2.stop()
