"""Qwen3-MoE in NNX: parity with transformers, HF round trip, routing replay, KV cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_helpers import hf_logits, padded_batch
from moe_helpers import MOE_MIXED, MOE_UNIFORM, make_random_moe_dir

from dlc_jax.model import PRESETS, load_hf, save_hf
from dlc_jax.model.config import Qwen3MoeConfig
from dlc_jax.model.qwen3_moe import Qwen3MoeForCausalLM
from dlc_jax.model.registry import family_for_hf, family_of


@pytest.fixture(scope="module", params=["uniform", "mixed"])
def moe_dir(request, tmp_path_factory):
    cfg = MOE_UNIFORM if request.param == "uniform" else MOE_MIXED
    return make_random_moe_dir(tmp_path_factory.mktemp(request.param), **cfg)


@pytest.fixture(scope="module")
def uniform_dir(tmp_path_factory):
    return make_random_moe_dir(tmp_path_factory.mktemp("u"), seed=1, **MOE_UNIFORM)


@pytest.mark.parametrize("impl", ["ragged", "dense"])
def test_logits_match_transformers(moe_dir, impl):
    model = load_hf(moe_dir, moe_impl=impl)
    assert isinstance(model, Qwen3MoeForCausalLM)
    vocab = model.config.vocab_size
    ids, mask = padded_batch(vocab)
    ours = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    ref = hf_logits(moe_dir, ids, mask)
    m = mask.astype(bool)
    np.testing.assert_allclose(ours[m], ref[m], atol=1e-5, rtol=1e-5)


def test_scanned_layout(uniform_dir):
    model = load_hf(uniform_dir, scan_layers=True)
    assert model.scanned
    k = model.model.layers.mlp.experts.gate_proj.kernel.get_value()
    assert k.shape == (2, 8, 64, 24)  # [L, E, D, I]
    ids, mask = padded_batch(MOE_UNIFORM["vocab_size"])
    ref = hf_logits(uniform_dir, ids, mask)
    ours = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    np.testing.assert_allclose(ours[mask.astype(bool)], ref[mask.astype(bool)], atol=1e-5)


@pytest.mark.parametrize("scan", [False, True])
def test_hf_round_trip_bit_identical(uniform_dir, tmp_path, scan):
    from safetensors.numpy import load_file

    model = load_hf(uniform_dir, scan_layers=scan)
    out = save_hf(model, tmp_path / "out")
    a = load_file(str(uniform_dir / "model.safetensors"))
    b = load_file(str(out / "model.safetensors"))
    assert set(a) == set(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name
    again = load_hf(out)
    assert again.config == model.config.replace(scan_layers=None)


def test_mixed_round_trip_and_config(moe_dir, tmp_path):
    model = load_hf(moe_dir)
    out = save_hf(model, tmp_path / "out")
    ids, mask = padded_batch(model.config.vocab_size, seed=3)
    ref = hf_logits(out, ids, mask)  # transformers loads what we wrote
    ours = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    np.testing.assert_allclose(ours[mask.astype(bool)], ref[mask.astype(bool)], atol=1e-5)


def _batch(vocab):
    ids, mask = padded_batch(vocab)
    return jnp.asarray(ids), jnp.asarray(mask)


@pytest.mark.parametrize("scan", [False, True])
def test_replay_own_indices_is_bitwise_identical(uniform_dir, scan):
    model = load_hf(uniform_dir, scan_layers=scan)
    ids, mask = _batch(MOE_UNIFORM["vocab_size"])
    logits, routing = model(ids, mask, return_routing=True)
    assert routing.experts.shape == (4, 11, 2, 2) and routing.experts.dtype == jnp.int32
    replayed = model(ids, mask, routed_experts=routing.experts)
    assert np.array_equal(np.asarray(logits), np.asarray(replayed))


def test_replay_keeps_router_gradient(uniform_dir):
    model = load_hf(uniform_dir, scan_layers=False)
    ids, mask = _batch(MOE_UNIFORM["vocab_size"])
    _, routing = model(ids, mask, return_routing=True)
    # replay other experts than the router's own choice (a sampler that routed differently)
    other = (routing.experts + 1) % MOE_UNIFORM["num_experts"]
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p, replay):
        m = nnx.merge(graphdef, p)
        return jnp.mean(m(ids, mask, routed_experts=replay) ** 2)

    for replay in (routing.experts, other):
        g = jax.grad(loss)(params, replay)
        for i in range(2):
            router = np.asarray(g["model"]["layers"][i]["mlp"]["gate"]["weight"].get_value())
            assert np.all(np.isfinite(router)) and np.abs(router).max() > 0
    assert not np.allclose(loss(params, routing.experts), loss(params, other))


def test_kv_cache_matches_full_forward_and_routing(uniform_dir):
    model = load_hf(uniform_dir, scan_layers=True)
    vocab = MOE_UNIFORM["vocab_size"]
    rng = np.random.RandomState(0)
    ids = jnp.asarray(rng.randint(0, vocab, (2, 9)))
    full, routing = model(ids, return_routing=True)
    cache = model.init_cache(2, 16)
    pos = jnp.broadcast_to(jnp.arange(9), (2, 9))
    pre, cache, r_pre = model.forward_with_cache(ids[:, :6], pos[:, :6], cache, return_routing=True)
    outs, routes = [pre], [r_pre]
    for t in range(6, 9):
        lg, cache, r = model.forward_with_cache(
            ids[:, t : t + 1], pos[:, t : t + 1], cache, return_routing=True
        )
        outs.append(lg)
        routes.append(r)
    np.testing.assert_allclose(np.concatenate(outs, 1), full, atol=1e-5)
    assert np.array_equal(np.concatenate(routes, 1), routing.experts)


def test_registry_and_counts(uniform_dir):
    import json

    d = json.loads((uniform_dir / "config.json").read_text())
    fam = family_for_hf(d)
    assert fam.model_type == "qwen3_moe" and fam.routed_experts
    c = PRESETS["Qwen3-30B-A3B"]
    assert isinstance(c, Qwen3MoeConfig) and family_of(c) is fam
    total = fam.matmul_params(c, active=False)
    active = fam.matmul_params(c, active=True)
    embed = c.vocab_size * c.hidden_size
    # Qwen3-30B-A3B: 30.5B parameters, 3.3B active (with embeddings; norms are a rounding error)
    assert 30.2e9 < total["decoder"] + total["vocab"] + embed < 30.8e9
    assert 3.1e9 < active["decoder"] + active["vocab"] + embed < 3.5e9
    with pytest.raises(ValueError, match="scan_layers"):
        Qwen3MoeConfig(num_hidden_layers=2, mlp_only_layers=(0,), scan_layers=True)
