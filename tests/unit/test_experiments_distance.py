"""Prefix KL between two real (tiny) Qwen3 models vs a direct full-logits computation."""

import jax
import numpy as np
import pytest
from flax import nnx

from dlc_jax.experiments.distance import PolicyOnPrefixes, evaluate_policy, prefix_kl
from dlc_jax.experiments.prefixes import assemble


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from dlc_jax.model import load_hf, make_tiny

    d = make_tiny(tmp_path_factory.mktemp("tiny"))
    a = load_hf(str(d))
    b = load_hf(str(d))
    graphdef, state = nnx.split(b)
    leaves, treedef = jax.tree.flatten(state)
    rng = np.random.default_rng(0)
    leaves = [
        x + 0.05 * rng.normal(size=x.shape).astype(np.float32) if x.dtype == np.float32 else x
        for x in leaves
    ]
    b = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
    return a, b


def _prefixes(vocab):
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, vocab, size=n) for n in (3, 5, 2, 4, 6)]
    responses = [rng.integers(3, vocab, size=n) for n in (4, 1, 6, 3, 2)]
    return assemble(prompts, responses, pad_id=0)


def _direct(model_a, model_b, ps, temperature):
    la = np.asarray(model_a(ps.tokens, attention_mask=ps.attention_mask), np.float64) / temperature
    lb = np.asarray(model_b(ps.tokens, attention_mask=ps.attention_mask), np.float64) / temperature
    la = (
        la
        - np.log(np.exp(la - la.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - la.max(-1, keepdims=True)
    )
    lb = (
        lb
        - np.log(np.exp(lb - lb.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - lb.max(-1, keepdims=True)
    )
    m = ps.prefix_mask > 0
    fwd = (np.exp(la) * (la - lb)).sum(-1)[m].mean()
    rev = (np.exp(lb) * (lb - la)).sum(-1)[m].mean()
    return fwd, rev


def test_prefix_kl_matches_full_logits(models, tmp_path):
    a, b = models
    ps = _prefixes(a.config.vocab_size)
    ea = evaluate_policy(a, ps, batch_size=2)  # 5 sequences -> padded last batch
    eb = evaluate_policy(b, ps, batch_size=2)
    assert ea.hidden.shape == (ps.num_prefixes, a.config.hidden_size)
    kl = prefix_kl(ea, eb, temperature=0.8, chunk_size=4)
    fwd, rev = _direct(a, b, ps, 0.8)
    assert fwd > 1e-3
    np.testing.assert_allclose([kl["forward"], kl["reverse"]], [fwd, rev], rtol=1e-4, atol=1e-6)
    assert kl["count"] == ps.num_prefixes
    same = prefix_kl(ea, evaluate_policy(a, ps, batch_size=3))
    assert abs(same["forward"]) < 1e-6 and abs(same["reverse"]) < 1e-6
    ea.save(tmp_path / "a.npz")
    assert prefix_kl(PolicyOnPrefixes.load(tmp_path / "a.npz"), eb, temperature=0.8)[
        "forward"
    ] == pytest.approx(kl["forward"], rel=1e-6)


def test_prefix_kl_refuses_different_prefix_sets(models):
    a, _ = models
    ps = _prefixes(a.config.vocab_size)
    ea = evaluate_policy(a, ps)
    small = PolicyOnPrefixes(hidden=ea.hidden[:3], unembed=ea.unembed)
    with pytest.raises(ValueError, match="different prefix sets"):
        prefix_kl(ea, small)
