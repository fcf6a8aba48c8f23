"""Exact next-token KL on reference prefixes: against a direct full-softmax computation."""

import jax.numpy as jnp
import numpy as np
import pytest

from dlc_jax.experiments.kl import KLSums, kl_on_positions, kl_sums


def _direct_kl(h_a, h_b, w_a, w_b, mask, temperature):
    """Float64 numpy reference: full softmax over the whole vocabulary, no chunking."""

    def logsoftmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    la = logsoftmax((h_a.astype(np.float64) @ w_a.astype(np.float64).T) / temperature)
    lb = logsoftmax((h_b.astype(np.float64) @ w_b.astype(np.float64).T) / temperature)
    fwd = (np.exp(la) * (la - lb)).sum(-1)
    rev = (np.exp(lb) * (lb - la)).sum(-1)
    m = mask.astype(np.float64)
    return (fwd * m).sum(), (rev * m).sum(), m.sum()


def _case(seed=0, B=3, T=7, D=16, V=50, scale=0.7):
    rng = np.random.default_rng(seed)
    h_a = rng.normal(size=(B, T, D)).astype(np.float32)
    h_b = (h_a + 0.3 * rng.normal(size=(B, T, D))).astype(np.float32)
    w_a = (scale * rng.normal(size=(V, D))).astype(np.float32)
    w_b = (w_a + 0.2 * rng.normal(size=(V, D))).astype(np.float32)
    mask = (rng.random((B, T)) < 0.7).astype(np.float32)
    mask[0, 0] = 1.0
    return h_a, h_b, w_a, w_b, mask


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_direct_full_softmax(temperature):
    h_a, h_b, w_a, w_b, mask = _case()
    f, r, c = kl_sums(h_a, h_b, w_a, w_b, mask, temperature=temperature, chunk_size=4)
    rf, rr, rc = _direct_kl(h_a, h_b, w_a, w_b, mask, temperature)
    assert float(c) == rc
    assert rf > 1e-2 and rr > 1e-2  # a non-trivial case
    np.testing.assert_allclose(float(f) / rc, rf / rc, rtol=0, atol=1e-6)
    np.testing.assert_allclose(float(r) / rc, rr / rc, rtol=0, atol=1e-6)
    assert abs(rf - rr) > 1e-4  # KL is asymmetric: the two directions are really different numbers


def test_temperature_changes_the_kl():
    h_a, h_b, w_a, w_b, mask = _case()
    f1, _, _ = kl_sums(h_a, h_b, w_a, w_b, mask, temperature=1.0)
    f2, _, _ = kl_sums(h_a, h_b, w_a, w_b, mask, temperature=0.5)
    assert abs(float(f1) - float(f2)) > 1e-3


def test_kl_of_a_policy_with_itself_is_zero():
    h_a, _, w_a, _, mask = _case(seed=1)
    f, r, c = kl_sums(h_a, h_a, w_a, w_a, mask, chunk_size=5)
    assert abs(float(f)) < 1e-6 and abs(float(r)) < 1e-6 and float(c) > 0


def test_non_negative_per_position():
    for seed in range(5):
        h_a, h_b, w_a, w_b, _ = _case(seed=seed, scale=3.0)
        B, T = h_a.shape[:2]
        for b in range(B):
            for t in range(T):
                m = np.zeros((B, T), np.float32)
                m[b, t] = 1.0
                f, r, _ = kl_sums(h_a, h_b, w_a, w_b, m, chunk_size=8)
                assert float(f) >= -1e-6 and float(r) >= -1e-6


@pytest.mark.parametrize("chunk_size", [1, 3, 8, 21, 1000])
def test_chunk_size_invariance(chunk_size):
    h_a, h_b, w_a, w_b, mask = _case(seed=2)
    f0, r0, _ = kl_sums(h_a, h_b, w_a, w_b, mask, chunk_size=7)
    f, r, _ = kl_sums(h_a, h_b, w_a, w_b, mask, chunk_size=chunk_size)
    np.testing.assert_allclose(float(f), float(f0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(float(r), float(r0), rtol=1e-6, atol=1e-7)


def test_masked_positions_do_not_count():
    h_a, h_b, w_a, w_b, mask = _case(seed=3)
    h_b2 = h_b.copy()
    h_b2[mask == 0] += 100.0  # garbage at masked positions must not change anything
    f, r, c = kl_sums(h_a, h_b, w_a, w_b, mask)
    f2, r2, c2 = kl_sums(h_a, h_b2, w_a, w_b, mask)
    assert float(c) == float(c2) == mask.sum()
    np.testing.assert_allclose([float(f2), float(r2)], [float(f), float(r)], rtol=1e-6)


def test_bf16_hidden_is_upcast_and_close():
    h_a, h_b, w_a, w_b, mask = _case(seed=4)
    f32, _, _ = kl_sums(h_a, h_b, w_a, w_b, mask)
    fbf, _, _ = kl_sums(
        jnp.asarray(h_a, jnp.bfloat16), jnp.asarray(h_b, jnp.bfloat16), w_a, w_b, mask
    )
    np.testing.assert_allclose(float(fbf), float(f32), rtol=5e-2)


def test_sums_accumulate_across_batches_and_means():
    h_a, h_b, w_a, w_b, mask = _case(seed=5)
    whole = kl_on_positions(h_a, h_b, w_a, w_b, mask)
    parts = kl_on_positions(h_a[:1], h_b[:1], w_a, w_b, mask[:1]) + kl_on_positions(
        h_a[1:], h_b[1:], w_a, w_b, mask[1:]
    )
    a, b = whole.means(), parts.means()
    for k in ("forward", "reverse", "symmetric", "count"):
        np.testing.assert_allclose(a[k], b[k], rtol=1e-6)
    assert a["symmetric"] == pytest.approx(0.5 * (a["forward"] + a["reverse"]))
    with pytest.raises(ValueError, match="no valid prefix"):
        KLSums(0.0, 0.0, 0.0).means()


def test_shape_errors_name_the_argument():
    h_a, h_b, w_a, w_b, mask = _case()
    with pytest.raises(ValueError, match="mask"):
        kl_sums(h_a, h_b, w_a, w_b, mask[:, :3])
    with pytest.raises(ValueError, match="hidden_b"):
        kl_sums(h_a, h_b[:, :3], w_a, w_b, mask)
    with pytest.raises(ValueError, match="unembed"):
        kl_sums(h_a, h_b, w_a, w_b[:, :3], mask)
