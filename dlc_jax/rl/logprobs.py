"""Token log-probs from hidden states without a [B, T, V] float32 array: ``token_logprobs`` maps
over rematerialized chunks of ``chunk_size`` positions (f32 logits ``hidden @ unembed.T``, the
sampler's transform of ``sampling.py``, the log-probs of the sampled token and of a head of
candidate ids, the entropy); with ``vocab_chunk`` (temperature only) each chunk scans vocabulary
blocks with an online log-sum-exp. The single-device path and ``rl.vocab_parallel``'s fallback.

Entropy is ``log S - sum(e * (z - m)) / S`` (``e = exp(z - m)``, m the max logit): the form
``lse - sum(p * z)`` loses about ulp(lse) in f32 to cancellation. A token removed by top-k/top-p
(or an id outside [0, V)) gets the finite ``out_of_support`` log-prob (default -1e4) with zero
gradient, so ratios exp(lp - lq) underflow to 0 and the loss never sees inf * 0 = NaN."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dlc_jax.rl.sampling import check_sampling_params, processed_logits

OUT_OF_SUPPORT_LOGPROB = -1.0e4


class TokenLogprobs(NamedTuple):
    """lp [B,T] f32; lp_head [B,T,K] f32 or None; entropy [B,T] f32 (zeros if not computed)."""

    lp: jax.Array
    lp_head: jax.Array | None
    entropy: jax.Array


def _chunk_full_vocab(h, ids, *, w, temperature, top_k, top_p, compute_entropy, floor):
    """h [C,D], w [V,D], ids [C,1+K] -> (logprobs [C,1+K], entropy [C])."""
    logits = jnp.dot(h, w.T, preferred_element_type=jnp.float32)
    z, keep = processed_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    zm = z if keep is None else jnp.where(keep, z, -jnp.inf)
    # relative to the max m (kept: finite): the shift cancels exactly, so no gradient through it
    m = jax.lax.stop_gradient(jnp.max(zm, axis=-1))
    e = jnp.exp(zm - m[:, None])
    s = jnp.sum(e, axis=-1)
    lse = m + jnp.log(s)
    vocab = z.shape[-1]
    idc = jnp.clip(ids, 0, vocab - 1)
    ok = (ids >= 0) & (ids < vocab)  # out of range or removed by top-k/top-p: the floor
    if keep is not None:
        ok = ok & jnp.take_along_axis(keep, idc, axis=-1)
    out = jnp.where(ok, jnp.take_along_axis(z, idc, axis=-1) - lse[:, None], jnp.float32(floor))
    if compute_entropy:
        # log S - E[z - m]: not lse - E[z], two large f32 numbers that cancel (module doc)
        dz = z - m[:, None]
        pz = e * dz if keep is None else jnp.where(keep, e * dz, 0.0)
        ent = jnp.log(s) - jnp.sum(pz, axis=-1) / s
    else:
        ent = jnp.zeros(h.shape[:1], jnp.float32)
    return out, ent


def _chunk_vocab_scan(h, ids, *, w_blocks, temperature, vocab, compute_entropy, floor):
    """Online log-sum-exp over vocab blocks. w_blocks [nb, Vb, D] (zero-padded past ``vocab``)."""
    nb, vb, _ = w_blocks.shape
    c, k1 = ids.shape
    in_range = (ids >= 0) & (ids < vocab)

    def body(carry, xs):
        m, s, t, g = carry
        blk, w = xs
        z = jnp.dot(h, w.T, preferred_element_type=jnp.float32) / jnp.float32(temperature)
        real = (blk * vb + jnp.arange(vb))[None, :] < vocab  # padded vocab columns are excluded
        z = jnp.where(real, z, 0.0)  # finite everywhere: no inf * 0 in the backward pass
        m_new = jnp.maximum(m, jnp.max(jnp.where(real, z, -jnp.inf), axis=-1))
        m_new = jax.lax.stop_gradient(m_new)  # the shift cancels exactly in lse; no grad needed
        scale = jnp.exp(m - m_new)
        zs = jnp.where(real, z - m_new[:, None], 0.0)
        e = jnp.where(real, jnp.exp(zs), 0.0)
        if compute_entropy:
            # t = sum e * (z - m), kept relative to the running max: moving the max from m to
            # m_new shifts each earlier term by (m - m_new) (no -inf * 0 before the first block)
            dm = jnp.where(s > 0, m - m_new, 0.0)  # m, m_new carry no gradient: finite here
            t = (t + dm * s) * scale + jnp.sum(e * zs, axis=-1)
        s = s * scale + jnp.sum(e, axis=-1)
        local = ids - blk * vb
        inside = (local >= 0) & (local < vb)
        zi = jnp.take_along_axis(z, jnp.clip(local, 0, vb - 1), axis=-1)
        g = g + jnp.where(inside, zi, 0.0)
        return (m_new, s, t, g), None

    zero = jnp.zeros((c,), jnp.float32)
    init = (jnp.full((c,), -jnp.inf, jnp.float32), zero, zero, jnp.zeros((c, k1), jnp.float32))
    (m, s, t, g), _ = jax.lax.scan(body, init, (jnp.arange(nb), w_blocks))
    lse = m + jnp.log(s)
    out = jnp.where(in_range, g - lse[:, None], jnp.float32(floor))
    ent = (jnp.log(s) - t / s) if compute_entropy else zero
    return out, ent


def target_ids(
    hidden, unembed, targets, head_ids, temperature, top_k, top_p, chunk_size, vocab_chunk
) -> jax.Array:
    """Validate ``token_logprobs``'s arguments; the ids to gather [B,T,1+K] int32."""
    if hidden.ndim != 3:
        raise ValueError(f"hidden must be [B,T,D], got shape {hidden.shape}")
    b, t, d = hidden.shape
    if unembed.ndim != 2 or unembed.shape[1] != d:
        raise ValueError(
            f"unembed must be [V,{d}] to match hidden [B,T,D]={hidden.shape}, got {unembed.shape}"
        )
    if targets.shape != (b, t):
        raise ValueError(f"targets must be [B,T]={(b, t)}, got {targets.shape}")
    if head_ids is not None and (head_ids.ndim != 3 or head_ids.shape[:2] != (b, t)):
        raise ValueError(f"head_ids must be [B,T,K] with B,T={(b, t)}, got {head_ids.shape}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    check_sampling_params(temperature, top_k, top_p)
    if vocab_chunk is not None and truncates(unembed.shape[0], top_k, top_p):
        raise ValueError(
            "vocab_chunk requires top_k off and top_p == 1 (top-k/top-p need a sort "
            "over the full vocabulary); set vocab_chunk=None"
        )
    if vocab_chunk is not None and vocab_chunk < 1:
        raise ValueError(f"vocab_chunk must be >= 1, got {vocab_chunk}")
    ids = targets[..., None].astype(jnp.int32)
    return ids if head_ids is None else jnp.concatenate([ids, head_ids.astype(jnp.int32)], axis=-1)


def truncates(vocab: int, top_k: int, top_p: float) -> bool:
    """Whether top-k / top-p remove tokens (which needs a sort over the whole vocabulary)."""
    return (0 < top_k < vocab) or top_p < 1.0


def map_chunks(chunk, h: jax.Array, ids: jax.Array, c: int, dtype=None):
    """``chunk`` over h [N,D] and ids [N,1+K] in rematerialized chunks of c rows."""
    n, d = h.shape
    n_chunks = -(-n // c)
    pad = n_chunks * c - n
    if pad:
        h = jnp.pad(h, ((0, pad), (0, 0)))
        ids = jnp.pad(ids, ((0, pad), (0, 0)))
    h = h if dtype is None else h.astype(dtype)
    xs = (h.reshape(n_chunks, c, d), ids.reshape(n_chunks, c, -1))
    out, ent = jax.lax.map(jax.checkpoint(lambda x: chunk(*x)), xs)
    return out.reshape(n_chunks * c, -1)[:n], ent.reshape(n_chunks * c)[:n]


def token_logprobs(
    hidden: jax.Array,
    unembed: jax.Array,
    targets: jax.Array,
    *,
    head_ids: jax.Array | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    chunk_size: int = 256,
    vocab_chunk: int | None = None,
    compute_entropy: bool = True,
    out_of_support: float = OUT_OF_SUPPORT_LOGPROB,
) -> TokenLogprobs:
    """Log-probs of ``targets`` (and ``head_ids``) under the sampler-transformed trainer policy,
    differentiable w.r.t. hidden [B,T,D] (logits accumulated in f32) and unembed [V,D]; targets
    [B,T] int, head_ids [B,T,K] int or None. ``top_k`` <= 0 or >= V and ``top_p`` = 1 mean off.
    ``chunk_size``: positions per chunk; ``vocab_chunk``: vocab block of the online log-sum-exp
    (without top-k/top-p only)."""
    ids = target_ids(
        hidden, unembed, targets, head_ids, temperature, top_k, top_p, chunk_size, vocab_chunk
    )
    b, t, d = hidden.shape
    vocab, n = unembed.shape[0], b * t
    kw = {"temperature": temperature, "compute_entropy": compute_entropy, "floor": out_of_support}
    if vocab_chunk is None:
        chunk = functools.partial(_chunk_full_vocab, w=unembed, top_k=top_k, top_p=top_p, **kw)
    else:
        nb = -(-vocab // vocab_chunk)
        w = jnp.pad(unembed, ((0, nb * vocab_chunk - vocab), (0, 0))).reshape(nb, vocab_chunk, d)
        chunk = functools.partial(_chunk_vocab_scan, w_blocks=w, vocab=vocab, **kw)
    out, ent = map_chunks(chunk, hidden.reshape(n, d), ids.reshape(n, -1), min(chunk_size, n))
    out = out.reshape(b, t, -1)
    lp_head = out[..., 1:] if head_ids is not None else None
    return TokenLogprobs(lp=out[..., 0], lp_head=lp_head, entropy=ent.reshape(b, t))
