"""``lora.dropout``: dropout on the adapters' input in the training forward only. It changes the
gradient (deterministically for a key, differently for another step), the forward without a key
(theta_s, evaluation) is the exact policy, and ``lora.dropout = 0`` lowers to the very program of a
run without the option (no random bits drawn)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_helpers import LORA_DIMS
from step_helpers import random_step_batch

from dlc_jax.lora import LoraConfig, LoraParam, apply_lora
from dlc_jax.lora.dropout import step_key
from dlc_jax.model.config import Qwen3Config
from dlc_jax.model.qwen3 import Qwen3ForCausalLM
from dlc_jax.rl import LossConfig
from dlc_jax.trainer.config import OptimSection
from dlc_jax.trainer.state import TrainState, make_optimizer, split_trainable
from dlc_jax.trainer.step import (
    StepConfig,
    accumulate_grads,
    device_batch,
    make_train_step,
    policy_logprobs,
)

DIMS = LORA_DIMS
CFG = StepConfig(loss=LossConfig(name="naive"), micro_batches=2)


def _state(scan=False):
    m = Qwen3ForCausalLM(Qwen3Config(**DIMS, scan_layers=scan), rngs=nnx.Rngs(0))
    apply_lora(m, LoraConfig(rank=4))
    for i, (_, v) in enumerate(nnx.to_flat_state(nnx.state(m, LoraParam))):
        x = v.get_value()  # a trained adapter: B non-zero
        v.set_value(0.2 * jax.random.normal(jax.random.key(i), x.shape, x.dtype))
    tx = make_optimizer(OptimSection(lr=1e-2, decay="constant", grad_clip=1.0), 10)
    return TrainState.create(m, tx, trainable=LoraParam), tx


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("scan", [False, True])
def test_dropout_changes_the_gradient_per_key_and_only_in_training(scan):
    st, _ = _state(scan)
    batch = device_batch(random_step_batch(DIMS["vocab_size"], 8, 4, 0))
    train, frozen = split_trainable(st.params, LoraParam)
    drop = dataclasses.replace(CFG, lora_dropout=0.5)

    @jax.jit
    def grads(t, f, key):
        return accumulate_grads(t, st.graphdef, batch, drop, f, key)[:3:2]  # grads, lp

    g0, lp0 = jax.jit(lambda t, f: accumulate_grads(t, st.graphdef, batch, CFG, f)[:3:2])(
        train, frozen
    )
    ga, lpa = grads(train, frozen, jax.random.key(1))
    ga2, _ = grads(train, frozen, jax.random.key(1))
    gb, _ = grads(train, frozen, jax.random.key(2))
    for x, y in zip(_leaves(ga), _leaves(ga2)):
        np.testing.assert_array_equal(x, y)  # a key draws one set of masks
    diff = max(float(np.abs(x - y).max()) for x, y in zip(_leaves(ga), _leaves(g0)))
    other = max(float(np.abs(x - y).max()) for x, y in zip(_leaves(ga), _leaves(gb)))
    assert diff > 1e-4 and other > 1e-4, (diff, other)
    assert float(jnp.max(jnp.abs(lpa - lp0))) > 1e-4  # the training forward drops
    # without a key (the theta_s / evaluation forward) the policy is exact: no dropout
    lp_eval = jax.jit(lambda p: policy_logprobs(st.graphdef, p, batch, drop).lp)(st.params)
    np.testing.assert_allclose(np.asarray(lp_eval), np.asarray(lp0), atol=1e-6)


def test_dropout_key_follows_the_update_count_and_zero_lowers_to_todays_program():
    st, tx = _state()
    batch = device_batch(random_step_batch(DIMS["vocab_size"], 8, 4, 0))
    train = st.trainable_params()
    _, opt1 = tx.update(jax.tree.map(jnp.zeros_like, train), st.opt_state, train)
    k0, k1 = step_key(st.opt_state, 0), step_key(opt1, 0)
    assert not np.array_equal(jax.random.key_data(k0), jax.random.key_data(k1))
    np.testing.assert_array_equal(
        jax.random.key_data(k0), jax.random.key_data(step_key(st.opt_state, 0))
    )
    assert not np.array_equal(jax.random.key_data(k0), jax.random.key_data(step_key(opt1, 1)))

    def hlo(cfg):
        step = make_train_step(st.graphdef, tx, cfg, trainable=LoraParam)
        return step.lower(st.params, st.opt_state, batch).as_text()

    today = hlo(CFG)
    assert hlo(dataclasses.replace(CFG, lora_dropout=0.0, lora_seed=7)) == today
    assert "threefry" not in today.lower()
    assert "threefry" in hlo(dataclasses.replace(CFG, lora_dropout=0.1)).lower()
