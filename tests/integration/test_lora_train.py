"""A LoRA RL run against a real JAX-backend sampler on loopback: merged pushes keep the sampler at
theta_s (delta stays at the fp32 floor), checkpoints hold the adapters only with the base's
fingerprint, and `dlc-jax export` writes the merged model and the PEFT adapter."""

import json
import logging

import numpy as np
import pytest

from dlc_jax.trainer.config import default_config_path, load_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from dlc_jax.model.tiny import make_tiny

    return make_tiny(
        tmp_path_factory.mktemp("tiny") / "m", hidden_size=64, intermediate_size=128, head_dim=16
    )


def test_lora_run_merged_pushes_adapter_checkpoints_and_export(tiny_dir, tmp_path, caplog):
    from dlc_jax.lora import adapter_parameter_count, merged_model
    from dlc_jax.model import load_hf
    from dlc_jax.trainer.build import build_trainer
    from dlc_jax.trainer.export_cli import export_checkpoint

    overrides = [
        f"model.path={tiny_dir}",
        "sft.enabled=false",
        "sampler.backend=jax",
        "sampler.n=4",
        "sampler.max_tokens=4",
        "sampler.head_k=4",
        "train.batch_prompts=4",
        "train.steps=4",
        "resync.policy=every_k",
        "resync.k=2",
        "log.progress=false",
        "log.tensorboard=false",
        f"log.dir={tmp_path}/logs",
        f"checkpoint.dir={tmp_path}/ckpt",
        "checkpoint.every=0",
        "optim.lr=3e-2",
        "reward.correct=0",
        "reward.format_bonus=1",
        "reward.strict_format=(?s).*e.*",
        "lora.rank=4",
        "lora.push=merged",  # (the default, auto, pushes adapters to this sampler)
    ]
    with caplog.at_level(logging.INFO, logger="dlc_jax.trainer.loop"):
        t = build_trainer(load_config(default_config_path(), overrides))
    assert "lora.push: merged pushes (lora.push=merged)" in caplog.messages
    s = t.run()
    assert s["finished"] and s["resync_count"] == 2
    rows = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    # after each merged push the sampler serves theta_s: only engine numerics between them
    assert all(abs(r["delta_mean"]) < 1e-3 and r["delta_abs_mean"] < 1e-3 for r in rows), rows
    assert any(r["ell_abs_mean"] > 1e-4 for r in rows)  # the adapters did move the policy

    from dlc_jax.trainer.checkpoint import Checkpointer

    ck = tmp_path / "ckpt"
    reader = Checkpointer(ck)
    meta = reader.restore_meta(None)
    reader.close()
    assert meta["step"] == 4
    assert len(meta["lora_base_fingerprint"]) == 16
    params = [k for k in meta["checksums"] if k.startswith("['params']")]
    assert params and all("'lora'" in k for k in params)
    n_ckpt = adapter_parameter_count(t.state.model())

    trained = merged_model(t.state.model())
    ids = np.arange(12, dtype=np.int32).reshape(2, 6)
    _, out = export_checkpoint(ck, tmp_path / "merged")
    exported = load_hf(str(out))
    np.testing.assert_allclose(np.asarray(exported(ids)), np.asarray(trained(ids)), atol=1e-5)
    _, out = export_checkpoint(ck, tmp_path / "adapter", lora="adapter")
    from safetensors.numpy import load_file

    tensors = load_file(str(out / "adapter_model.safetensors"))
    assert sum(x.size for x in tensors.values()) == n_ckpt

    # resume: the adapters come back onto the same base, the sampler gets the merged theta_s
    t2 = build_trainer(load_config(default_config_path(), [*overrides, "train.steps=5"]))
    assert t2.resumed and t2.state.step == 4
    np.testing.assert_array_equal(
        np.asarray(t2.state.model()(ids)), np.asarray(t.state.model()(ids))
    )
    s2 = t2.run()
    assert s2["finished"]
    rows = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 5 and abs(rows[-1]["delta_mean"]) < 1e-3
