"""Integration: the RL loop driving 2 JAX-backend sampler servers as a pool (`sampler.address=a,b`).

One sampler is SIGKILLed mid-run and never comes back: the pool takes it out of rotation, its slots
are
re-requested from the survivor, pushes go on to the survivor, and training finishes every step with
no
trainer-level reconnect. Also: a finished run re-invoked says so instead of silently doing nothing.
"""

import json
import logging
import threading
import time

import pytest

from dlc_jax.trainer.config import default_config_path, load_config

pytestmark = pytest.mark.slow

STEPS = 5


@pytest.fixture(scope="module")
def tiny_dir(make_tiny_dir):
    return make_tiny_dir(
        hidden_size=32,
        intermediate_size=64,
        head_dim=8,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
    )


def _cfg(tiny_dir, tmp_path, address, *extra):
    return load_config(
        default_config_path(),
        [
            f"model.path={tiny_dir}",
            "sft.enabled=false",
            "sampler.backend=jax",
            f"sampler.address={address}",
            "sampler.n=2",
            "sampler.max_tokens=4",
            "sampler.head_k=2",
            "sampler.reconnect_timeout_s=120",
            "train.batch_prompts=4",
            f"train.steps={STEPS}",
            "log.progress=false",
            "log.tensorboard=false",
            f"log.dir={tmp_path}/logs",
            f"checkpoint.dir={tmp_path}/ckpt",
            "checkpoint.every=0",
            "optim.lr=3e-3",
            "resync.policy=every_k",
            "resync.k=1",
            *extra,
        ],
    )


def _rows(tmp_path):
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_one_sampler_killed_training_continues(tiny_dir, tmp_path, caplog):
    from dlc_jax.sampler.service.process import SamplerProcess
    from dlc_jax.trainer.build import build_trainer

    args = ["--max-model-len", "64", "--max-head-k", "4"]
    procs = [
        SamplerProcess(
            "jax",
            str(tiny_dir),
            extra_args=args,
            log_file=str(tmp_path / f"s{i}.log"),
            startup_timeout=300,
        ).start()
        for i in range(2)
    ]
    try:
        address = ",".join(p.address for p in procs)
        caplog.set_level(logging.INFO, logger="dlc_jax")
        # pushes relayed (trainer -> sampler 0 -> sampler 1) until sampler 1 dies
        trainer = build_trainer(_cfg(tiny_dir, tmp_path, address, "sampler.push_relay=chain"))
        out = {}
        th = threading.Thread(target=lambda: out.update(trainer.run()))
        th.start()
        path = tmp_path / "logs" / "metrics.jsonl"
        deadline = time.time() + 300
        while time.time() < deadline and not (
            path.exists() and len(path.read_text().splitlines()) >= 2
        ):
            time.sleep(0.2)
        procs[1].kill()
        th.join(400)
        assert not th.is_alive()
        rows = _rows(tmp_path)
        assert out["finished"] and [r["step"] for r in rows] == list(
            range(1, STEPS + 1)
        )  # no batch lost/repeated
        assert out["reconnects"] == 0  # the pool handled it: no trainer-level reconnect
        assert rows[0]["pool/active"] == 2.0
        last = rows[-1]
        assert (
            last["pool/active"] == 1.0
            and last["pool/sampler1/active"] == 0.0
            and last["pool/removed_total"] >= 1
        )
        assert last["pool/sampler0/version"] == STEPS and last["synced_version"] == STEPS
        assert procs[0].client().info()["version"] == STEPS  # the survivor got every push
        logs = [r.getMessage() for r in caplog.records]
        assert any("out of rotation" in m for m in logs), logs
    finally:
        for p in procs:
            p.stop()

    # re-invoking the finished run (resume finds the final step) says so and trains nothing
    from dlc_jax.trainer.build import build_trainer

    caplog.clear()
    before = (tmp_path / "logs" / "metrics.jsonl").read_text()
    s = build_trainer(_cfg(tiny_dir, tmp_path, address)).run()
    logs = [r.getMessage() for r in caplog.records]
    assert s["already_complete"] and s["checkpoint_step"] == STEPS and s["seconds"] == 0.0
    assert any("already complete" in m and str(tmp_path / "ckpt") in m for m in logs), logs
    assert (tmp_path / "logs" / "metrics.jsonl").read_text() == before
    assert (
        s["reward_mean"]["last"] == _rows(tmp_path)[-1]["reward_mean"]
    )  # the saved summary is returned
