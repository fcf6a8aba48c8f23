"""theta_t at a checkpoint step, restored from the trainer's real orbax layout into a model."""

import jax
import numpy as np
import pytest
from flax import nnx

from dlc_jax.experiments.checkpoints import find_params, load_checkpoint_model, restore_raw_state
from dlc_jax.trainer.checkpoint import Checkpointer, CheckpointError
from dlc_jax.trainer.config import load_config


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from dlc_jax.model import load_hf, make_tiny

    d = make_tiny(tmp_path_factory.mktemp("tiny"))
    return str(d), load_hf(str(d))


def test_checkpoint_params_round_trip_into_a_model(tiny, tmp_path):
    model_dir, model = tiny
    _, params = nnx.split(model, nnx.Param)
    trained = jax.tree.map(
        lambda x: x + 0.01 * (1 + jax.numpy.arange(x.size).reshape(x.shape) % 7), params
    )
    ck = Checkpointer(tmp_path / "ckpt", keep=5, every=2)
    # the trainer loop's state tree: params, optimizer state, theta_s snapshots by version
    for step, p in ((2, params), (4, trained)):
        ck.save(
            step, {"params": p, "opt_state": {"mu": params}, "snapshots": {"0": params}}, {"k": 1}
        )
    ck.close()
    cfg = load_config(
        None,
        [f"model.path={model_dir}", f"checkpoint.dir={tmp_path / 'ckpt'}", "sampler.backend=jax"],
    )
    m4 = load_checkpoint_model(cfg, 4)
    ids = np.array([[5, 6, 7, 8]])
    want = nnx.merge(
        *nnx.split(model, nnx.Param, ...)[:1], trained, nnx.split(model, nnx.Param, ...)[2]
    )
    np.testing.assert_allclose(np.asarray(m4(ids)), np.asarray(want(ids)), rtol=1e-6, atol=1e-6)
    m2 = load_checkpoint_model(cfg, 2)
    np.testing.assert_allclose(np.asarray(m2(ids)), np.asarray(model(ids)), rtol=1e-6, atol=1e-6)
    assert np.abs(np.asarray(m4(ids)) - np.asarray(model(ids))).max() > 1e-3
    with pytest.raises(CheckpointError, match="no checkpoint for step 6"):
        restore_raw_state(tmp_path / "ckpt", 6)


def test_missing_params_subtree_is_named():
    with pytest.raises(KeyError, match="no 'params' subtree"):
        find_params({"opt_state": {"mu": 1}})
    assert find_params({"a": {"params": 3}}) == 3
