"""Losses, metrics, ESS/resync and token log-probs on a batch sharded over 8 fake CPU devices
equal the single-device values (global reductions, not per-shard ones)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dlc_jax.rl import (
    LOSSES,
    LossConfig,
    LossInputs,
    compute_loss,
    resync_decision,
    step_metrics,
    token_logprobs,
)

NB, T, K = 16, 6, 4


@pytest.fixture(scope="module")
def mesh():
    devs = jax.devices()
    if len(devs) < 8:
        pytest.fail(f"need 8 fake CPU devices (XLA_FLAGS from conftest), got {len(devs)}")
    return Mesh(np.array(devs[:8]), ("data",))


def batch(seed=0):
    rng = np.random.default_rng(seed)
    lp = rng.normal(-1.5, 0.6, size=(NB, T))
    f = lambda s: jnp.asarray(s, jnp.float32)
    head = rng.normal(-3.0, 0.5, size=(NB, T, K))
    mask = (rng.random((NB, T)) > 0.25).astype(np.float32)
    mask[:, 0] = 1
    return dict(
        lp=f(lp),
        lp_q=f(lp + rng.normal(0, 0.3, lp.shape)),
        lp_s=f(lp + rng.normal(0, 0.2, lp.shape)),
        lp_old=f(lp + rng.normal(0, 0.1, lp.shape)),
        mask=f(mask),
        adv=f(rng.normal(size=NB)),
        lp_head=f(head),
        lq_head=f(head + rng.normal(0, 0.3, head.shape)),
        lps_head=f(head + rng.normal(0, 0.1, head.shape)),
    )


def shard(d, mesh):
    out = {}
    for k, v in d.items():
        spec = P("data", *([None] * (v.ndim - 1)))
        out[k] = jax.device_put(v, NamedSharding(mesh, spec))
    return out


CFG_OVERRIDES = {"mis_geo": dict(geo_low=0.8, geo_high=1.25), "m2po": dict(m2_threshold=0.02)}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_losses_sharded_equal_single_device(mesh, name):
    cfg = LossConfig(name=name, **CFG_OVERRIDES.get(name, {}))
    d = batch()

    def f(d):
        inp = LossInputs(**d)
        return jax.value_and_grad(
            lambda lp, lh: compute_loss(cfg, dataclasses.replace(inp, lp=lp, lp_head=lh)),
            argnums=(0, 1),
            has_aux=True,
        )(inp.lp, inp.lp_head)

    fn = jax.jit(f)
    (l1, m1), g1 = fn(d)
    ds = shard(d, mesh)
    assert len(ds["lp"].sharding.device_set) == 8
    (l8, m8), g8 = fn(ds)
    np.testing.assert_allclose(l8, l1, rtol=1e-5, atol=1e-7)
    for a, b in zip(g8, g1):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8)
    assert set(m8) == set(m1)
    for k in m1:
        np.testing.assert_allclose(m8[k], m1[k], rtol=1e-5, atol=1e-7, err_msg=k)


def test_metrics_and_resync_sharded(mesh):
    d = batch(1)
    ent = jnp.abs(d["lp"])
    f = jax.jit(
        lambda d, e: (
            step_metrics(
                d["lp"],
                d["lp_s"],
                d["lp_q"],
                d["mask"],
                lq_head=d["lq_head"],
                lp_head=d["lp_head"],
                entropy=e,
            ),
            resync_decision(d["lp"], d["lp_s"], d["mask"]),
        )
    )
    m1, r1 = f(d, ent)
    m8, r8 = f(shard(d, mesh), jax.device_put(ent, NamedSharding(mesh, P("data", None))))
    for k in m1:
        np.testing.assert_allclose(m8[k], m1[k], rtol=1e-5, atol=1e-7, err_msg=k)
    for a, b in zip(r8, r1):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_token_logprobs_sharded(mesh):
    rng = np.random.default_rng(2)
    h = jnp.asarray(rng.normal(size=(8, 5, 16)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(50, 16)), jnp.float32)
    tgt = jnp.asarray(rng.integers(0, 50, (8, 5)), jnp.int32)
    head = jnp.asarray(rng.integers(0, 50, (8, 5, 3)), jnp.int32)
    f = jax.jit(lambda h, w, t, hd: token_logprobs(h, w, t, head_ids=hd, top_p=0.9, chunk_size=8))
    o1 = f(h, w, tgt, head)
    sh = lambda x: jax.device_put(x, NamedSharding(mesh, P("data", *([None] * (x.ndim - 1)))))
    o8 = f(sh(h), w, sh(tgt), sh(head))
    for a, b in zip(o8, o1):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
