"""Attention kernels vs the dense reference (values and gradients) with left/right padding and
packed segments; kernel choice by the mesh's platform; splash AOT-compiles for abstract TPUs."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from dlc_jax.model import MeshConfig, make_mesh
from dlc_jax.model.attention import causal_mask, dense_attention, resolve_impl, self_attention

B, T, H, KV, HD = 8, 20, 4, 2, 16


def _inputs():
    r = np.random.default_rng(0)
    q = jnp.asarray(r.standard_normal((B, T, H, HD)), jnp.float32)
    k = jnp.asarray(r.standard_normal((B, T, KV, HD)), jnp.float32)
    v = jnp.asarray(r.standard_normal((B, T, KV, HD)), jnp.float32)
    valid = np.ones((B, T), bool)
    valid[0, :5] = False  # left padding
    valid[1, 15:] = False  # right padding
    valid[3, :19] = False  # a single real token at the end
    seg = np.zeros((B, T), np.int32)
    seg[2, 8:], seg[2, 14:] = 1, 2  # three packed sequences
    seg[4, 10:] = 7  # two packed sequences, then right padding
    valid[4, 17:] = False
    w = r.standard_normal((B, T, H, HD)).astype(np.float32) * valid[:, :, None, None]
    return q, k, v, jnp.asarray(valid), jnp.asarray(seg), jnp.asarray(w)


def _run(impl, mesh=None, with_segments=True):
    q, k, v, valid, seg, w = _inputs()
    seg = seg if with_segments else None

    def attn(q, k, v):
        return self_attention(q, k, v, valid, seg, impl=impl, mesh=mesh)

    out = jax.jit(attn)(q, k, v)
    grads = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attn(q, k, v) * w), argnums=(0, 1, 2)))(
        q, k, v
    )
    return np.asarray(out), [np.asarray(g) for g in grads], np.asarray(valid)


def test_dense_reference_is_masked_softmax():
    q, k, v, valid, seg, _ = _inputs()
    out = np.asarray(dense_attention(q, k, v, causal_mask(valid, seg)))
    # row 2, query 15 (third packed sequence starts at 14): attends to keys 14..15 of kv head 0 only
    qi, ks = np.asarray(q)[2, 15, 1], np.asarray(k)[2, 14:16, 0]
    s = ks @ qi / np.sqrt(HD)
    p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    np.testing.assert_allclose(out[2, 15, 1], p @ np.asarray(v)[2, 14:16, 0], rtol=1e-5, atol=1e-6)
    # row 3: the only real token attends to itself
    np.testing.assert_allclose(out[3, 19, 2], np.asarray(v)[3, 19, 1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "impl,mesh_cfg,with_segments",
    [
        ("xla", None, True),
        ("xla", None, False),
        ("splash", None, True),
        ("splash", MeshConfig(data=2, fsdp=2, tensor=2), True),
        ("xla", MeshConfig(fsdp=4, tensor=2), True),
    ],
    ids=["xla", "xla_noseg", "splash_interpret", "splash_shard_map_dp2_fsdp2_tp2", "xla_mesh"],
)
def test_impl_matches_dense_values_and_grads(impl, mesh_cfg, with_segments):
    mesh = make_mesh(mesh_cfg) if mesh_cfg is not None else None
    ref_out, ref_g, valid = _run("dense", None, with_segments)
    out, grads, _ = _run(impl, mesh, with_segments)
    err = np.abs(out - ref_out)[valid].max()
    assert err < 2e-6, err
    for g, r in zip(grads, ref_g):
        assert np.abs(r).max() > 0.1
        np.testing.assert_allclose(g, r, atol=5e-6, rtol=1e-5)


def test_impl_choice_follows_mesh_platform():
    cpu_mesh = make_mesh(MeshConfig(fsdp=-1))
    assert resolve_impl("auto", cpu_mesh) == "dense"
    assert resolve_impl("auto", None) == "dense"  # tests run on CPU
    assert resolve_impl("dense", cpu_mesh) == "dense"
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        resolve_impl("flash", cpu_mesh)


def _tpu_devices():
    from jax.experimental import topologies

    from dlc_jax.plan.libtpu import ensure_libtpu

    ensure_libtpu()  # libtpu is part of the dev/CI env (launch/setup_env.sh); a clear error if not
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # other processes may hold its lock

    topo = topologies.get_topology_desc(
        platform="tpu",
        topology_name="v5e:2x2",
        chip_config_name="default",
        chips_per_host_bounds=(2, 2, 1),
        num_slices=1,
    )
    return topo.devices


def test_splash_aot_compiles_for_abstract_tpu():
    devices = _tpu_devices()
    mesh = make_mesh(MeshConfig(fsdp=2, tensor=2), devices)
    assert resolve_impl("auto", mesh, jnp.bfloat16) == "splash"
    b, t, h, kv, hd = 4, 200, 4, 2, 128  # t not a multiple of 128: padded inside

    def sds(shape, dtype, spec):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))

    q = sds((b, t, h, hd), jnp.bfloat16, P("fsdp", None, "tensor"))
    k = sds((b, t, kv, hd), jnp.bfloat16, P("fsdp", None, "tensor"))
    valid = sds((b, t), jnp.bool_, P("fsdp"))
    seg = sds((b, t), jnp.int32, P("fsdp"))

    def loss(q, k, v, valid, seg):
        return jnp.sum(self_attention(q, k, v, valid, seg, mesh=mesh).astype(jnp.float32))

    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, k, valid, seg)
    assert "tpu_custom_call" in lowered.as_text()  # the Pallas kernel, not an XLA fallback
    mem = lowered.compile().memory_analysis()
    assert mem.temp_size_in_bytes < 64 * 2**20


def test_splash_block_cached_causal_mask_matches_causal_mask():
    """The block cache is an optimization only: every block, and the mask info splash builds from
    the whole mask (fwd and dkv), equal those of the library's CausalMask."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mi

    from dlc_jax.model.attention import _block_cached_causal_mask_class

    t, blk = 1024, 128
    cached, ref = _block_cached_causal_mask_class()((t, t)), sm.CausalMask((t, t))
    for q0, k0 in [(0, 0), (128, 0), (0, 128), (512, 384), (896, 896), (256, 768)]:
        idx = (slice(q0, q0 + blk), slice(k0, k0 + blk))
        np.testing.assert_array_equal(cached[idx], ref[idx])
    assert 0 < len(cached._blocks) < (t // blk) ** 2
    for is_dkv in (False, True):
        got, _ = mi._process_mask(sm.MultiHeadMask([cached] * 2), (blk, blk), is_dkv)
        want, _ = mi._process_mask(sm.MultiHeadMask([ref] * 2), (blk, blk), is_dkv)
        for a, b in zip(got, want):
            if a is None or b is None:
                assert a is b
            else:
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
