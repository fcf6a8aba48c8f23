"""moe_impl='megablox': the Pallas grouped matmul (interpret mode on CPU) under shard_map, with
and without expert-parallel dispatch over fake CPU devices (all-gather, and all-to-all through the
emulated ragged_all_to_all: moe_a2a.py), equals ragged_dot's outputs and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from dlc_jax.model.config import Qwen3MoeConfig
from dlc_jax.model.moe_dispatch import resolve_moe_impl
from dlc_jax.model.qwen3_moe import Experts
from dlc_jax.model.sharding import ActivationSharding, MeshConfig, make_mesh, shard_model

E, K, D, WIDTH = 8, 2, 32, 24


def _experts(mesh, impl, dispatch="allgather"):
    cfg = Qwen3MoeConfig(
        hidden_size=D,
        moe_intermediate_size=WIDTH,
        num_experts=E,
        num_experts_per_tok=K,
        moe_impl=impl,
        moe_dispatch=dispatch,
    )
    m = Experts(
        cfg,
        rngs=nnx.Rngs(0),
        param_dtype=jnp.float32,
        compute_dtype=jnp.float32,
        act_sharding=ActivationSharding(),
    )
    return m if mesh is None else shard_model(m, mesh)


def _inputs(b, t, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.randn(b, t, D).astype(np.float32)
    # distinct top-k experts per token; expert 5 gets no token (an empty group)
    choices = np.array([e for e in range(E) if e != 5])
    experts = np.stack([rng.choice(choices, K, replace=False) for _ in range(b * t)])
    w = rng.rand(b * t, K).astype(np.float32)
    ct = rng.randn(b, t, D).astype(np.float32)
    return x, experts.reshape(b, t, K).astype(np.int32), w.reshape(b, t, K), ct


def _value_and_grads(module, x, experts, w, ct):
    graphdef, params = nnx.split(module, nnx.Param)

    @jax.jit
    def run(p, x, w):
        def loss(p, x, w):
            y = nnx.merge(graphdef, p)(x, experts, w)
            return jnp.sum(y * ct), y

        return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(p, x, w)

    (_, y), (gp, gx, gw) = run(params, x, w)
    flat = {"/".join(map(str, k)): np.asarray(v) for k, v in nnx.to_flat_state(gp)}
    return np.asarray(y), np.asarray(gx), np.asarray(gw), flat


def _check(mesh, b, t, dispatch="allgather"):
    x, experts, w, ct = _inputs(b, t)
    ref = _value_and_grads(_experts(None, "ragged"), x, experts, w, ct)
    mod = _experts(mesh, "megablox", dispatch)
    if mesh is not None:
        tok = NamedSharding(mesh, PartitionSpec(None))
        x, w = jax.device_put(x, tok), jax.device_put(w, tok)
    got = _value_and_grads(mod, x, experts, w, ct)
    for a, r in zip(got[:3], ref[:3]):
        np.testing.assert_allclose(a, r, atol=2e-5, rtol=2e-5)
    assert set(got[3]) == set(ref[3]) and len(ref[3]) == 3
    for name in ref[3]:
        assert np.abs(ref[3][name]).max() > 0
        np.testing.assert_allclose(got[3][name], ref[3][name], atol=2e-5, rtol=2e-5, err_msg=name)


def test_megablox_matches_ragged_single_device():
    _check(None, 3, 7)  # 42 pairs: padded to the row tile


@pytest.mark.parametrize(
    "mesh_cfg, b",
    [
        (MeshConfig(fsdp=2, expert=4), 8),  # tokens split over expert: all-gather / psum_scatter
        (MeshConfig(fsdp=2, expert=2, tensor=2), 4),  # + the expert width over tensor (psum)
        (MeshConfig(fsdp=2, expert=4), 2),  # batch too small for the expert axis: psum
    ],
)
def test_megablox_expert_parallel_matches_ragged(mesh_cfg, b):
    mesh = make_mesh(mesh_cfg, jax.devices()[:8])
    _check(mesh, b, 5)


def test_megablox_all_to_all_dispatch_matches_ragged():
    # tokens split over expert (emulated ragged all-to-all), the expert width over tensor (psum
    # before the return exchange); the dispatch's edge cases (skewed routing, empty sends) are in
    # tests/integration/test_moe_a2a.py with a cheaper local expert function
    mesh = make_mesh(MeshConfig(fsdp=2, expert=2, tensor=2), jax.devices()[:8])
    _check(mesh, 4, 5, dispatch="all_to_all")


def test_auto_picks_megablox_on_tpu_only():
    mesh = make_mesh(MeshConfig(fsdp=2), jax.devices()[:2])
    assert resolve_moe_impl("auto", mesh) == "ragged"
    assert resolve_moe_impl("dense", mesh) == "dense"
    with pytest.raises(ValueError, match="moe_impl"):
        Qwen3MoeConfig(moe_impl="gmm")
