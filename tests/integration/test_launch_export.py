"""`dlc-jax export`: an orbax training checkpoint (saved like the trainer does: params, optimizer
state, theta_s snapshots + JSON meta with the run config) becomes an HF directory whose tensors
equal theta_t exactly (fp32) and whose logits in transformers match our model's; step selection,
bf16, model dir from the checkpoint's config, clear errors."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest


@pytest.fixture(scope="module")
def tiny_dir(make_tiny_dir):
    return str(
        make_tiny_dir(
            hidden_size=32, intermediate_size=64, head_dim=8, num_hidden_layers=2, vocab_size=512
        )
    )


def _perturbed_params(tiny_dir, seed):
    from flax import nnx

    from dlc_jax.model import load_hf

    model = load_hf(tiny_dir)
    _, params = nnx.split(model, nnx.Param)
    leaves, treedef = jax.tree.flatten(params)
    rng = np.random.default_rng(seed)
    leaves = [x + 0.05 * rng.standard_normal(x.shape).astype(np.float32) for x in leaves]
    params = jax.tree.unflatten(treedef, leaves)
    nnx.update(model, params)
    return model, params


@pytest.fixture(scope="module")
def checkpoint(tiny_dir, tmp_path_factory):
    """Two steps (3 and 5) saved with the trainer's tree layout and metadata."""
    from dlc_jax.trainer.checkpoint import Checkpointer
    from dlc_jax.trainer.config import OptimSection, load_config, to_dict
    from dlc_jax.trainer.state import TrainState, make_optimizer

    d = tmp_path_factory.mktemp("export_ckpt") / "ckpt"
    cfg = load_config(None, [f"model.path={tiny_dir}", "sft.enabled=false", "sampler.backend=jax"])
    ck = Checkpointer(d, keep=3)
    models = {}
    for step, seed in ((3, 1), (5, 2)):
        model, params = _perturbed_params(tiny_dir, seed)
        st = TrainState.create(model, make_optimizer(OptimSection(), 10))
        tree = {"params": st.params, "opt_state": st.opt_state, "snapshots": {"0": st.params}}
        ck.save(
            step,
            tree,
            {
                "step": step,
                "synced_version": step,
                "snapshot_versions": [0],
                "config": to_dict(cfg),
            },
            force=True,
        )
        models[step] = model
    ck.close()
    return str(d), models


def _our_logits(model, ids):
    return np.asarray(model(jax.numpy.asarray(ids)))


def test_export_fp32_roundtrips_tensors_and_transformers_logits(checkpoint, tiny_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from dlc_jax.model import iter_hf_tensors
    from dlc_jax.sampler.wire import safetensors_io as st
    from dlc_jax.trainer.export_cli import cli

    ckpt, models = checkpoint
    out = tmp_path / "hf3"
    assert cli(["--checkpoint", ckpt, "--step", "3", "--out", str(out), "--model", tiny_dir]) == 0
    written = dict(st.iter_tensors(str(out)))
    want = dict(iter_hf_tensors(models[3]))
    assert sorted(written) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(written[k], want[k], err_msg=k)
    assert (out / "tokenizer.json").exists() and json.loads((out / "config.json").read_text())[
        "dtype"
    ] == "float32"
    hf = AutoModelForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32).eval()
    ids = np.array([[1, 7, 99, 300, 42, 5, 17, 8]], np.int64)
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids)).logits.numpy()
    ours = _our_logits(models[3], ids.astype(np.int32))
    err = float(np.max(np.abs(ref - ours)))
    assert err < 1e-4, err
    # and it is step 3, not the other step
    assert float(np.max(np.abs(_our_logits(models[5], ids.astype(np.int32)) - ref))) > 1e-2


def test_export_latest_bf16_with_model_dir_from_checkpoint_config(checkpoint, tmp_path):
    import ml_dtypes

    from dlc_jax.model import iter_hf_tensors
    from dlc_jax.sampler.wire import safetensors_io as st
    from dlc_jax.trainer.export_cli import cli

    ckpt, models = checkpoint
    out = tmp_path / "hf_bf16"
    assert (
        cli(["--checkpoint", ckpt, "--out", str(out), "--dtype", "bfloat16"]) == 0
    )  # latest = step 5
    header = json.loads(
        (out / "model.safetensors").read_bytes()[
            8 : 8 + int.from_bytes((out / "model.safetensors").read_bytes()[:8], "little")
        ]
    )
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    written = dict(st.iter_tensors(str(out)))
    for k, v in iter_hf_tensors(models[5]):
        np.testing.assert_array_equal(
            np.asarray(written[k], np.float32),
            v.astype(ml_dtypes.bfloat16).astype(np.float32),
            err_msg=k,
        )


def test_export_errors_name_the_problem(checkpoint, tmp_path, capsys):
    from functools import partial

    from dlc_jax.cli import run_command

    cli = partial(run_command, "export")  # user errors print as one line, exit 2

    ckpt, _ = checkpoint
    assert cli(["--checkpoint", ckpt, "--step", "9", "--out", str(tmp_path / "x")]) == 2
    assert "no checkpoint for step 9" in capsys.readouterr().err
    assert (
        cli(["--checkpoint", ckpt, "--out", str(tmp_path / "y"), "--model", str(tmp_path / "nope")])
        == 2
    )
    assert "config.json" in capsys.readouterr().err
    other = tmp_path / "other"
    from dlc_jax.model.tiny import make_tiny

    make_tiny(
        other, hidden_size=48, intermediate_size=64, head_dim=8, num_hidden_layers=2, vocab_size=512
    )
    assert cli(["--checkpoint", ckpt, "--out", str(tmp_path / "z"), "--model", str(other)]) == 2
    assert "not matching the model" in capsys.readouterr().err
