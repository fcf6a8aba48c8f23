"""`model.moe_impl` and `model.moe_dispatch` reach the experts of the MoE model the trainer builds;
a dense model ignores them."""

import numpy as np
from model_helpers import jit_forward, padded_batch
from moe_helpers import MOE_UNIFORM, make_random_moe_dir

from dlc_jax.trainer.config import load_config
from dlc_jax.trainer.train_setup import load_train_model


def _model(model_dir, *overrides):
    cfg = load_config(None, [f"model.path={model_dir}", *overrides])
    return load_train_model(cfg, cfg.model.path, None)


def test_moe_impl_key_picks_the_experts_kernel(tmp_path):
    d = make_random_moe_dir(tmp_path / "moe", **MOE_UNIFORM)
    ragged = _model(d, "model.moe_impl=ragged", "model.moe_dispatch=all_to_all")
    dense = _model(d, "model.moe_impl=dense")
    assert ragged.config.moe_impl == "ragged" and dense.config.moe_impl == "dense"
    assert ragged.config.moe_dispatch == "all_to_all" and dense.config.moe_dispatch == "allgather"
    assert _model(d).config.moe_impl == "auto"  # the default: megablox on TPU, ragged elsewhere
    ids, mask = padded_batch(MOE_UNIFORM["vocab_size"], seed=2)
    real = mask.astype(bool)
    a, b = jit_forward(ragged, ids, mask), jit_forward(dense, ids, mask)
    assert np.abs(a - b)[real].max() <= 1e-5 and np.abs(a).max() > 1e-3


def test_dense_model_ignores_moe_impl(tiny_dir):
    m = _model(tiny_dir, "model.moe_impl=dense")
    assert not hasattr(m.config, "moe_impl")
