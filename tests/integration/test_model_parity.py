"""NNX Qwen3 vs transformers (fp32), padding, positions, segments, remat, KV cache, config errors;
scanned (stacked) layers and the splash kernel against the same references."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_helpers import (
    CONFIG_TIED,
    CONFIG_UNTIED,
    hf_logits,
    jit_forward,
    make_random_hf_dir,
    padded_batch,
)

from dlc_jax.model import PRESETS, Qwen3Config, UnsupportedModelError, load_hf


@pytest.fixture(scope="module", params=["tied", "untied"])
def hf_dir(request, tmp_path_factory):
    cfg = CONFIG_TIED if request.param == "tied" else CONFIG_UNTIED
    return make_random_hf_dir(tmp_path_factory.mktemp(request.param), seed=1, **cfg)


@pytest.fixture(scope="module")
def untied_dir(tmp_path_factory):
    return make_random_hf_dir(tmp_path_factory.mktemp("untied_b"), seed=2, **CONFIG_UNTIED)


@pytest.mark.parametrize("scan", [False, True], ids=["loop", "scan"])
def test_logits_match_transformers_padded(hf_dir, scan):
    model = load_hf(hf_dir, scan_layers=scan)
    assert model.scanned == scan
    cfg = model.config
    assert cfg.num_groups > 1
    ids, mask = padded_batch(cfg.vocab_size)
    ours = jit_forward(model, ids, mask)
    ref = hf_logits(hf_dir, ids, mask)
    valid = mask.astype(bool)
    err = np.abs(ours - ref)[valid].max()
    assert err <= 1e-4, err
    assert np.abs(ref[valid]).max() > 1.0  # non-trivial logits
    # tied: unembedding is the embedding table; untied: lm_head
    assert model.unembedding().shape == (cfg.vocab_size, cfg.hidden_size)
    assert (model.lm_head is None) == cfg.tie_word_embeddings
    h = model.hidden_states(ids, mask)
    assert h.shape == (4, 11, cfg.hidden_size)
    np.testing.assert_allclose(np.asarray(h @ model.unembedding().T), ours, atol=1e-5)


def test_explicit_positions_match_transformers(untied_dir):
    model = load_hf(untied_dir)
    ids = np.random.RandomState(3).randint(0, 257, (2, 7))
    pos = np.array([[5, 6, 7, 8, 9, 10, 11], [0, 1, 2, 50, 51, 52, 53]])
    err = np.abs(
        jit_forward(model, ids, positions=pos) - hf_logits(untied_dir, ids, positions=pos)
    ).max()
    assert err <= 1e-4, err
    # RoPE is relative: a uniform shift (row 0) changes nothing; a gap (row 1) changes the logits
    diff = np.abs(jit_forward(model, ids, positions=pos) - jit_forward(model, ids)).max(axis=(1, 2))
    assert diff[0] < 1e-4 and diff[1] > 1e-3, diff


def test_left_padding_equals_unpadded(untied_dir):
    model = load_hf(untied_dir)
    ids = np.random.RandomState(4).randint(0, 257, (1, 6))
    padded = np.concatenate([np.zeros((1, 3), int), ids], 1)
    mask = np.concatenate([np.zeros((1, 3), int), np.ones((1, 6), int)], 1)
    a = jit_forward(model, ids)[0]
    b = jit_forward(model, padded, mask)[0, 3:]
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("scan", [False, True], ids=["loop", "scan"])
def test_segment_ids_packed_equals_separate(untied_dir, scan):
    model = load_hf(untied_dir, scan_layers=scan)
    rng = np.random.RandomState(5)
    s1, s2 = rng.randint(0, 257, 5), rng.randint(0, 257, 4)
    packed = np.concatenate([s1, s2, [0, 0]])[None]
    seg = np.array([[1] * 5 + [2] * 4 + [0, 0]])
    mask = (seg > 0).astype(int)
    out = jit_forward(model, packed, mask, segment_ids=seg)[0]
    np.testing.assert_allclose(out[:5], jit_forward(model, s1[None])[0], atol=1e-5)
    np.testing.assert_allclose(out[5:9], jit_forward(model, s2[None])[0], atol=1e-5)
    # without segment ids the second sequence sees the first: different logits
    joined = jit_forward(model, packed, mask)[0]
    assert np.abs(joined[5:9] - out[5:9]).max() > 1e-3


def test_remat_same_logits_and_grads(untied_dir):
    ids, mask = padded_batch(257, seed=6)

    def loss_and_grads(remat):
        model = load_hf(untied_dir, remat=remat)

        @nnx.jit
        def step(m):
            def loss(m):
                return jnp.sum(jax.nn.log_softmax(m(ids, mask), -1)[..., 0] * mask)

            return nnx.value_and_grad(loss)(m)

        return step(model)

    l0, g0 = loss_and_grads(False)
    l1, g1 = loss_and_grads(True)
    np.testing.assert_allclose(l0, l1, rtol=1e-6)
    flat0, flat1 = jax.tree.leaves(g0), jax.tree.leaves(g1)
    assert len(flat0) == len(flat1) > 10
    for a, b in zip(flat0, flat1):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def _per_layer(model_or_grads, scanned, n_layers):
    """{path string: array} of every parameter, stacked layer params split into layer i entries."""
    out = {}
    for path, v in nnx.to_flat_state(nnx.state(model_or_grads, nnx.Param)):
        a = np.asarray(v.get_value())
        if scanned and path[:2] == ("model", "layers"):
            for i in range(n_layers):
                out[".".join(map(str, ("model", "layers", i, *path[2:])))] = a[i]
        else:
            out[".".join(map(str, path))] = a
    return out


def test_scanned_equals_unscanned_with_remat_policies(untied_dir):
    ids, mask = padded_batch(257, seed=6)
    seg = np.where(np.arange(11) < 6, 1, 2)[None].repeat(4, 0)

    def run(scan, remat):
        model = load_hf(untied_dir, scan_layers=scan, remat=remat)

        @nnx.jit
        def step(m):
            def loss(m):
                return jnp.sum(jax.nn.log_softmax(m(ids, mask, segment_ids=seg), -1)[..., 0] * mask)

            return nnx.value_and_grad(loss)(m)

        loss, grads = step(model)
        return (
            float(loss),
            _per_layer(grads, scan, model.config.num_hidden_layers),
            jit_forward(model, ids, mask),
        )

    l0, g0, out0 = run(False, None)
    for remat in ("full", "save_dots_and_attn_out"):
        l1, g1, out1 = run(True, remat)
        assert np.abs(out1 - out0)[mask.astype(bool)].max() <= 1e-5
        np.testing.assert_allclose(l1, l0, rtol=1e-6)
        assert set(g1) == set(g0) and len(g0) > 10
        for k in g0:
            np.testing.assert_allclose(g1[k], g0[k], rtol=1e-5, atol=1e-5, err_msg=f"{remat} {k}")


def test_splash_in_scanned_model_matches_transformers(untied_dir):
    # the Pallas splash kernel (interpret mode on CPU) inside the scanned model, padded batch
    model = load_hf(untied_dir, scan_layers=True, attention_impl="splash")
    ids, mask = padded_batch(257, seed=10)
    err = np.abs(jit_forward(model, ids, mask) - hf_logits(untied_dir, ids, mask))[
        mask.astype(bool)
    ].max()
    assert err <= 1e-4, err


def test_grad_matches_finite_difference(untied_dir):
    model = load_hf(untied_dir)
    ids, mask = padded_batch(257, seed=7)

    def loss(m):
        return jnp.sum(jax.nn.log_softmax(m(ids, mask), -1)[..., 3] * mask)

    g = nnx.jit(nnx.grad(loss))(model).model.norm.weight.get_value()
    jloss = nnx.jit(loss)
    w0 = model.model.norm.weight.get_value()
    eps = 1e-2
    vals = []
    for sign in (1, -1):
        model.model.norm.weight.set_value(w0.at[5].add(sign * eps))
        vals.append(float(jloss(model)))
    model.model.norm.weight.set_value(w0)
    fd = (vals[0] - vals[1]) / (2 * eps)
    assert abs(float(g[5])) > 1e-2
    np.testing.assert_allclose(float(g[5]), fd, rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("scan", [False, True], ids=["loop", "scan"])
def test_kv_cache_greedy_decode_matches_recompute(untied_dir, scan):
    model = load_hf(untied_dir, scan_layers=scan)
    ids, mask = padded_batch(257, seed=8)
    ids, mask = ids[:3], mask[:3]
    # left-pad every row (row 1 was right padded): move its pads to the front
    ids[1] = np.concatenate([ids[1, -4:] * 0, ids[1, :-4]])
    mask[1] = np.concatenate([np.zeros(4, int), np.ones(7, int)])
    b, t0 = ids.shape
    steps = 6
    fwd = nnx.jit(lambda m, i, p, c, a: m.forward_with_cache(i, p, c, a))
    cache = model.init_cache(b, t0 + steps, jnp.float32)
    # per-layer arrays (loop) or one stacked array per k/v (scan): never restacked per call
    k_shape = (b, t0 + steps, model.config.num_key_value_heads, model.config.head_dim)
    if scan:
        assert cache["k"].shape == (model.config.num_hidden_layers, *k_shape)
    else:
        assert [a.shape for a in cache["k"]] == [k_shape] * model.config.num_hidden_layers
    pos = np.maximum(mask.cumsum(-1) - 1, 0)
    logits, cache = fwd(model, ids, pos, cache, mask)
    np.testing.assert_allclose(
        np.asarray(logits)[mask.astype(bool)],
        jit_forward(model, ids, mask)[mask.astype(bool)],
        atol=1e-5,
    )
    seq, seq_mask = ids.copy(), mask.copy()
    nxt = np.asarray(logits[:, -1]).argmax(-1)
    last = pos[:, -1]
    step_logits = []
    for _ in range(steps):
        seq = np.concatenate([seq, nxt[:, None]], 1)
        seq_mask = np.concatenate([seq_mask, np.ones((b, 1), int)], 1)
        last = last + 1
        lg, cache = fwd(model, nxt[:, None], last[:, None], cache, np.ones((b, 1), int))
        step_logits.append(np.asarray(lg[:, 0]))
        nxt = step_logits[-1].argmax(-1)
    # one full recomputation over the final sequences: causal, so position t0-1+i gives step i's
    # logits
    full = jit_forward(model, seq, seq_mask)[:, t0:]
    np.testing.assert_allclose(np.stack(step_logits, 1), full, atol=1e-4)
    assert (
        seq[:, t0 + 1 :] == full[:, :-1].argmax(-1)
    ).all()  # greedy choices == argmax of recompute
    assert int(cache["index"]) == t0 + steps


def test_config_roundtrip_presets_and_errors(untied_dir, tmp_path):
    d = json.loads((untied_dir / "config.json").read_text())
    cfg = Qwen3Config.from_hf_dict(d)
    assert Qwen3Config.from_hf_dict(cfg.to_hf_dict()) == cfg
    assert (cfg.hidden_size, cfg.num_key_value_heads, cfg.head_dim, cfg.rope_theta) == (
        64,
        2,
        16,
        1e6,
    )
    p = PRESETS["Qwen3-0.6B"]
    assert (
        p.hidden_size,
        p.num_hidden_layers,
        p.num_attention_heads,
        p.num_key_value_heads,
        p.head_dim,
        p.intermediate_size,
        p.vocab_size,
        p.tie_word_embeddings,
    ) == (1024, 28, 16, 8, 128, 3072, 151936, True)
    assert (
        PRESETS["Qwen3-8B"].tie_word_embeddings is False
        and PRESETS["Qwen3-4B"].num_hidden_layers == 36
    )
    # run options: presets scan, a 2-layer config does not by default; they never reach config.json
    assert all(c.use_scan for c in PRESETS.values()) and not cfg.use_scan
    assert Qwen3Config.from_hf_dict(d, scan_layers=True, remat_policy="save_dots").use_scan
    assert "scan_layers" not in p.to_hf_dict() and "attention_impl" not in p.to_hf_dict()
    with pytest.raises(ValueError, match="remat_policy must be one of"):
        cfg.replace(remat_policy="bogus")
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        cfg.replace(attention_impl="flash")
    bad = dict(d, architectures=["LlamaForCausalLM"], model_type="llama")
    with pytest.raises(UnsupportedModelError, match="LlamaForCausalLM"):
        Qwen3Config.from_hf_dict(bad)
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(UnsupportedModelError, match="LlamaForCausalLM"):
        load_hf(tmp_path)
    with pytest.raises(UnsupportedModelError, match="rope"):
        Qwen3Config.from_hf_dict(dict(d, rope_scaling={"rope_type": "yarn", "factor": 4.0}))
