"""All-to-all MoE dispatch (dlc_jax/model/moe_a2a.py) on fake CPU devices: the emulated
ragged_all_to_all has the primitive's documented semantics, the dispatch (send sizes, offsets,
permutation, return exchange, un-permutation) gives the dense reference's outputs and gradients,
and the byte count."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from dlc_jax.model.moe_a2a import all_to_all_experts, dispatch_bytes, emulated_ragged_all_to_all

P_ = PartitionSpec


def test_emulation_matches_the_documented_example():
    # jax.lax.ragged_all_to_all's docstring example, axis of size 2
    mesh = Mesh(np.asarray(jax.devices()[:2]), ("x",))
    operand = jnp.array([[1, 2, 2], [3, 4, 0]], jnp.int32)
    output = jnp.zeros((2, 4), jnp.int32)
    in_off = jnp.array([[0, 1], [0, 1]], jnp.int32)
    send = jnp.array([[1, 2], [1, 1]], jnp.int32)
    out_off = jnp.array([[0, 0], [1, 2]], jnp.int32)
    recv = jnp.array([[1, 1], [2, 1]], jnp.int32)

    def body(*a):
        a = [v[0] for v in a]
        r = emulated_ragged_all_to_all(*a, axis_name="x", size=2)
        return r[None]

    got = jax.shard_map(body, mesh=mesh, in_specs=(P_("x"),) * 6, out_specs=P_("x"))(
        operand, output, in_off, send, out_off, recv
    )
    np.testing.assert_array_equal(np.asarray(got), [[1, 3, 0, 0], [2, 2, 4, 0]])


E, K, D, W, P = 8, 3, 16, 12, 4


def _dense_local(x, experts, weights, wg, wu, wd, first):
    """Rows [m, D] through this device's experts [El, ...] (global ids first..first+El-1)."""
    el = wg.shape[0]
    ids = first + jnp.arange(el)
    combine = jnp.sum((experts[:, :, None] == ids[None, None, :]) * weights[..., None], axis=1)
    h = jax.nn.silu(jnp.einsum("md,edi->mei", x, wg)) * jnp.einsum("md,edi->mei", x, wu)
    return jnp.einsum("mei,eid,me->md", h, wd, combine)


def _params(seed):
    rng = np.random.RandomState(seed)
    wg, wu = (rng.randn(E, D, W).astype(np.float32) * 0.3 for _ in range(2))
    wd = rng.randn(E, W, D).astype(np.float32) * 0.3
    return wg, wu, wd


def _routing(n_tokens, seed, choices):
    rng = np.random.RandomState(seed)
    x = rng.randn(n_tokens, D).astype(np.float32)
    experts = np.stack([rng.choice(choices, K, replace=False) for _ in range(n_tokens)])
    w = rng.rand(n_tokens, K).astype(np.float32)
    ct = rng.randn(n_tokens, D).astype(np.float32)
    return x, experts.astype(np.int32), w, ct


@pytest.mark.parametrize("choices", [list(range(E)), [7, 0, 1]])
def test_all_to_all_dispatch_matches_dense_outputs_and_grads(choices):
    mesh = Mesh(np.asarray(jax.devices()[:P]), ("expert",))
    wg, wu, wd = _params(0)
    x, experts, w, ct = _routing(P * 6, 1, np.asarray(choices))

    def a2a(x, w, wg, wu, wd):
        def body(x, e, w, wg, wu, wd):
            local = functools.partial(_dense_local, wg=wg, wu=wu, wd=wd)
            return all_to_all_experts(
                x,
                e,
                w,
                lambda rx, re, rw, first: local(rx, re, rw, first=first),
                axis_name="expert",
                size=P,
                num_experts=E,
                emulate=True,
            )

        spec = P_("expert")
        return jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 6, out_specs=spec)(
            x, experts, w, wg, wu, wd
        )

    def ref(x, w, wg, wu, wd):
        return _dense_local(x, experts, w, wg, wu, wd, 0)

    def vg(f):
        loss = lambda *a: jnp.sum(f(*a) * ct)  # noqa: E731
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))(x, w, wg, wu, wd)

    (lg, gg), (lr, gr) = vg(a2a), vg(ref)
    np.testing.assert_allclose(jax.jit(a2a)(x, w, wg, wu, wd), ref(x, w, wg, wu, wd), atol=1e-5)
    np.testing.assert_allclose(lg, lr, rtol=1e-5)
    for a, b in zip(gg, gr):
        assert np.abs(b).max() > 0
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_dispatch_bytes():
    # 2 devices x 2 tokens, 4 experts (2 per device), top 2; device 0: token 0 -> experts {0, 1}
    # (local only), token 1 -> {1, 2} (needs device 1); device 1: both tokens -> {2, 3} (local)
    experts = np.array([[[0, 1], [1, 2]], [[2, 3], [3, 2]]])
    got = dispatch_bytes(experts, devices=2, num_experts=4, hidden=8, act_bytes=2)
    row = 8 * 2 + 2 * (4 + 2) + 8 * 2  # out: activations + ids + weights; back: activations
    assert got["allgather"] == 1 * 2 * row  # every token to the one peer
    assert got["all_to_all"] == 0.5 * row  # one remote row over two devices
    # uniform routing, Qwen3-30B-A3B-like (128 experts, top 8) over 16 devices: about 0.4
    rng = np.random.RandomState(0)
    e = np.stack([np.stack([rng.choice(128, 8, replace=False) for _ in range(64)])] * 16)
    r = dispatch_bytes(e, devices=16, num_experts=128, hidden=2048)["ratio"]
    assert 0.3 < r < 0.5, r
