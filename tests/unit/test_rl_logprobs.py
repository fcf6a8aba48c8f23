"""Chunked token log-probs vs a naive full-softmax reference, gradients, and compiled memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rl_reference import reference_token_logprobs

from dlc_jax.rl.logprobs import OUT_OF_SUPPORT_LOGPROB, token_logprobs
from dlc_jax.rl.sampling import support_mask


def _data(b=2, t=7, d=16, v=97, k=5, seed=0):
    rng = np.random.default_rng(seed)
    h = jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(v, d)) * 0.7, jnp.float32)
    tgt = jnp.asarray(rng.integers(0, v, size=(b, t)), jnp.int32)
    head = jnp.asarray(rng.integers(0, v, size=(b, t, k)), jnp.int32)
    return h, w, tgt, head


@pytest.mark.parametrize(
    "temperature,top_k,top_p,chunk,vchunk",
    [
        (1.0, 0, 1.0, 4, None),
        (0.7, 0, 1.0, 5, None),
        (1.3, 0, 1.0, 3, 10),  # vocab-chunked online log-sum-exp, V=97 not a multiple of 10
        (1.0, 0, 0.8, 4, None),
        (0.6, 0, 0.9, 64, None),
        (1.0, 20, 1.0, 4, None),
        (0.8, 30, 0.7, 6, None),
    ],
)
def test_chunked_equals_naive(temperature, top_k, top_p, chunk, vchunk):
    h, w, tgt, head = _data()
    ref = reference_token_logprobs(
        h, w, tgt, head_ids=head, temperature=temperature, top_k=top_k, top_p=top_p
    )
    # make sure the sampled targets include in-support tokens: take targets from the head too
    out = jax.jit(
        lambda h, w, tgt, head: token_logprobs(
            h,
            w,
            tgt,
            head_ids=head,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            chunk_size=chunk,
            vocab_chunk=vchunk,
        )
    )(h, w, tgt, head)
    np.testing.assert_allclose(out.lp, ref.lp, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(out.lp_head, ref.lp_head, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(out.entropy, ref.entropy, atol=1e-5, rtol=1e-5)
    if top_k or top_p < 1:
        # the truncation really removed tokens (else this case tests nothing new)
        assert float(jnp.mean(ref.lp_head == OUT_OF_SUPPORT_LOGPROB)) > 0.05


def test_support_matches_hand_example():
    # logits/T with T=1: probs of [3,2,1,0] ~ [.644,.237,.087,.032]; top_p=0.85 keeps {3,2}
    z = jnp.log(jnp.array([[0.05, 0.15, 0.3, 0.5]], jnp.float32))
    np.testing.assert_array_equal(support_mask(z, top_p=0.75), [[False, False, True, True]])
    # cum ascending = [.05,.2,.5,1.]; 1-p=0.5 -> remove cum<=0.5 -> keep only 0.5 entry
    np.testing.assert_array_equal(support_mask(z, top_p=0.5), [[False, False, False, True]])
    np.testing.assert_array_equal(support_mask(z, top_k=2), [[False, False, True, True]])
    np.testing.assert_array_equal(
        support_mask(z, top_k=3, top_p=0.6), [[False, False, True, True]]
    )  # renormalized .3/.95+.5/.95


def test_hand_logprob_with_top_p():
    # V=4, D=4 identity unembedding, hidden = logits directly.
    logits = jnp.log(jnp.array([0.05, 0.15, 0.3, 0.5], jnp.float32))
    h = logits[None, None, :]
    w = jnp.eye(4, dtype=jnp.float32)
    out = token_logprobs(h, w, jnp.array([[2]]), head_ids=jnp.array([[[0, 1, 2, 3]]]), top_p=0.75)
    np.testing.assert_allclose(out.lp, [[np.log(0.3 / 0.8)]], rtol=1e-6)
    np.testing.assert_allclose(
        out.lp_head[0, 0],
        [OUT_OF_SUPPORT_LOGPROB, OUT_OF_SUPPORT_LOGPROB, np.log(0.375), np.log(0.625)],
        rtol=1e-6,
    )
    ent = -(0.375 * np.log(0.375) + 0.625 * np.log(0.625))
    np.testing.assert_allclose(out.entropy, [[ent]], rtol=1e-6)


def test_gradients_match_naive():
    h, w, tgt, head = _data(b=2, t=5, d=8, v=41, k=3, seed=1)
    for kw, extra in [
        (dict(temperature=0.9), dict(chunk_size=3)),
        (dict(temperature=0.8), dict(chunk_size=4, vocab_chunk=16)),
        (dict(temperature=1.1, top_p=0.85, top_k=25), dict(chunk_size=3)),
    ]:

        def f(fn, h, w, kw=kw, **extra):
            o = fn(h, w, tgt, head_ids=head, **kw, **extra)
            return jnp.sum(o.lp * 1.3) + jnp.sum(o.lp_head * 0.7) + jnp.sum(o.entropy * 0.2)

        g = jax.jit(jax.grad(lambda h, w, ex=extra: f(token_logprobs, h, w, **ex), argnums=(0, 1)))(
            h, w
        )
        gr = jax.jit(jax.grad(lambda h, w: f(reference_token_logprobs, h, w), argnums=(0, 1)))(h, w)
        for a, b_ in zip(g, gr):
            np.testing.assert_allclose(a, b_, atol=2e-5, rtol=1e-4)
        assert all(bool(jnp.all(jnp.isfinite(a))) for a in g)


def test_bad_shapes_raise():
    h, w, tgt, head = _data()
    with pytest.raises(ValueError, match="unembed"):
        token_logprobs(h, w[:, :3], tgt)
    with pytest.raises(ValueError, match="targets"):
        token_logprobs(h, w, tgt[:, :3])
    with pytest.raises(ValueError, match="top_p"):
        token_logprobs(h, w, tgt, top_p=0.0)
    with pytest.raises(ValueError, match="vocab_chunk"):
        token_logprobs(h, w, tgt, top_p=0.9, vocab_chunk=16)


QWEN3_VOCAB = 151_936


@pytest.mark.parametrize("top_p", [1.0, 0.95])
def test_compiled_memory_has_no_full_logits(top_p):
    """8 x 2048 tokens, V=151,936: a [B,T,V] f32 array would be 9.96 GB. Compile only."""
    b, t, d, k = 8, 2048, 256, 8
    full = b * t * QWEN3_VOCAB * 4
    sds = jax.ShapeDtypeStruct
    args = (
        sds((b, t, d), jnp.bfloat16),
        sds((QWEN3_VOCAB, d), jnp.bfloat16),
        sds((b, t), jnp.int32),
        sds((b, t, k), jnp.int32),
    )

    def fwd(h, w, tgt, head):
        o = token_logprobs(h, w, tgt, head_ids=head, top_p=top_p, chunk_size=128)
        return o.lp.sum() + o.lp_head.sum() + o.entropy.sum()

    for name, fn in [("forward", fwd), ("value_and_grad", jax.value_and_grad(fwd, argnums=(0, 1)))]:
        mem = jax.jit(fn).lower(*args).compile().memory_analysis()
        temp = mem.temp_size_in_bytes
        print(
            f"top_p={top_p} {name}: temp {temp / 2**20:.1f} MiB "
            f"vs full logits {full / 2**30:.2f} GiB"
        )
        assert temp < full / 8, (name, temp)
        # temp memory is set by the chunk, not by B*T: half the tokens, (almost) the same temp
        half = (
            (sds((b // 2, t, d), jnp.bfloat16),)
            + args[1:2]
            + (sds((b // 2, t), jnp.int32), sds((b // 2, t, k), jnp.int32))
        )
        temp_half = jax.jit(fn).lower(*half).compile().memory_analysis().temp_size_in_bytes
        assert temp - temp_half < full / 64, (name, temp, temp_half)


@pytest.mark.parametrize("top_k,top_p", [(40, 1.0), (0, 0.85), (60, 0.9)])
def test_matches_vllm_processed_logprobs(top_k, top_p):
    """Against vLLM's own sampler op (the engine's top-k/top-p code, CPU torch), not a
    re-implementation."""
    torch = pytest.importorskip("torch")
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    rng = np.random.default_rng(5)
    n, v, temperature = 24, 300, 0.7
    logits = rng.normal(size=(n, v)).astype(np.float32) * 2.0
    scaled = torch.from_numpy(logits.copy()).div_(temperature)
    k = torch.full((n,), top_k, dtype=torch.long) if top_k else None
    p = torch.full((n,), top_p, dtype=torch.float32) if top_p < 1 else None
    want = ops.apply_top_k_top_p(scaled, k, p).log_softmax(dim=-1, dtype=torch.float32).numpy()
    # hidden = logits, unembed = identity: token_logprobs sees exactly these logits
    h = jnp.asarray(logits)[None]
    ids = jnp.broadcast_to(jnp.arange(v, dtype=jnp.int32), (1, n, v))
    out = token_logprobs(
        h,
        jnp.eye(v, dtype=jnp.float32),
        ids[..., 0],
        head_ids=ids,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        chunk_size=7,
    )
    got = np.asarray(out.lp_head[0])
    kept = np.isfinite(want)
    np.testing.assert_array_equal(got > OUT_OF_SUPPORT_LOGPROB, kept)
    assert 0.02 < kept.mean() < 0.9
    np.testing.assert_allclose(got[kept], want[kept], atol=1e-5, rtol=1e-5)
