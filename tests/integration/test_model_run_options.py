"""The ``model`` section's run options (attention_impl, scan_layers, remat / remat_policy) reach the
model the trainer builds (``trainer.loop.load_train_model``) and the one the plan builds."""

import jax
import numpy as np
import pytest
from model_helpers import jit_forward, padded_batch

from dlc_jax.trainer.config import load_config

VOCAB = 97


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random 3-layer Qwen3 in HF format (made by our own save_hf: no torch needed)."""
    from flax import nnx

    from dlc_jax.model import Qwen3Config, Qwen3ForCausalLM, save_hf

    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=False,
    )
    return save_hf(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(3)), tmp_path_factory.mktemp("m") / "hf")


def _trainer_model(model_dir, *overrides):
    from dlc_jax.trainer.loop import load_train_model

    cfg = load_config(None, [f"model.path={model_dir}", *overrides])
    return load_train_model(cfg, cfg.model.path, None)


def test_trainer_model_honours_the_run_options(model_dir):
    looped = _trainer_model(model_dir, "model.scan_layers=false")
    assert not looped.scanned and len(looped.model.layers) == 3
    assert looped.remat_policy == "none" and looped.config.attention_impl == "auto"
    scanned = _trainer_model(
        model_dir,
        "model.scan_layers=true",
        "model.remat_policy=save_dots",
        "model.attention_impl=xla",
    )
    assert scanned.scanned and scanned.remat_policy == "save_dots"
    assert scanned.config.attention_impl == "xla"
    q = scanned.model.layers.self_attn.q_proj.kernel
    assert q.shape[0] == 3  # one stacked layer with a leading [L] axis
    ids, mask = padded_batch(VOCAB, seed=1)
    real = mask.astype(bool)
    out_looped, out_scanned = jit_forward(looped, ids, mask), jit_forward(scanned, ids, mask)
    assert np.abs(out_looped - out_scanned)[real].max() <= 1e-5
    assert np.abs(out_looped).max() > 1e-3  # not a trivially zero model
    # the defaults: 3 layers < SCAN_MIN_LAYERS are looped; remat=true alone is the full policy
    auto = _trainer_model(model_dir, "model.remat=true")
    assert not auto.scanned and auto.remat_policy == "full"


def test_plan_builds_the_model_with_the_policy():
    """The plan's abstract model (and so the policy its report states) follows model.remat_policy;
    nothing is compiled."""
    from dlc_jax.plan.abstract_state import abstract_run, plan_mesh
    from dlc_jax.plan.report import _remat_policy

    cfg = load_config(
        None,
        ["model.remat_policy=save_dots", "model.scan_layers=true", "train.batch_prompts=2"],
    )
    mesh, _ = plan_mesh(cfg.mesh, jax.devices()[:2], 1)
    run = abstract_run(cfg, mesh)
    assert _remat_policy(run.model) == "save_dots" and run.qcfg.remat_policy == "save_dots"
    assert run.model.scanned and run.qcfg.attention_impl == "auto"


def test_export_reads_a_scanned_run_in_its_layout(model_dir, tmp_path):
    """A run with model.scan_layers=true on a model the default would loop (3 layers) exports:
    the exporter builds the model in the checkpoint's layout, named by its stored config."""
    from dlc_jax.model import iter_hf_tensors
    from dlc_jax.sampler.wire import safetensors_io as st
    from dlc_jax.trainer.checkpoint import Checkpointer, save_train_state
    from dlc_jax.trainer.config import to_dict
    from dlc_jax.trainer.export_cli import export_checkpoint
    from dlc_jax.trainer.loop import load_train_model
    from dlc_jax.trainer.state import TrainState, make_optimizer

    cfg = load_config(None, [f"model.path={model_dir}", "model.scan_layers=true"])
    model = load_train_model(cfg, model_dir, None)
    assert model.scanned
    ck = Checkpointer(tmp_path / "ckpt", keep=1)
    state = TrainState.create(model, make_optimizer(cfg.optim, 10))
    state.step = 1
    save_train_state(ck, state, {"config": to_dict(cfg)}, force=True)
    ck.close()
    step, out = export_checkpoint(tmp_path / "ckpt", tmp_path / "hf")
    written = dict(st.iter_tensors(str(out)))
    expected = dict(iter_hf_tensors(model))
    assert step == 1 and set(written) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(np.asarray(written[name]), np.asarray(value), err_msg=name)
