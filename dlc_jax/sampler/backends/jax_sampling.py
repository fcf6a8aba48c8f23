"""One decode step's token choice for the JAX backend, temperature / top-k / top-p traced (new
values compile nothing). Semantics equal `dlc_jax.rl.sampling.processed_logits` (vLLM's order)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def kept_mask(
    z: jax.Array, top_k: jax.Array, top_p: jax.Array, *, use_k: bool, use_p: bool
) -> jax.Array:
    """Kept-support mask [B, V] of temperature-scaled f32 logits `z` [B, V]; top_k int32 scalar
    (used when use_k, 0 < top_k < V), top_p f32 scalar (used when use_p)."""
    rows, vocab = z.shape
    zs = jnp.sort(z, axis=-1)  # ascending
    if use_k:
        kth = jnp.take_along_axis(zs, jnp.full((rows, 1), vocab - top_k), axis=-1)  # k-th largest
        if not use_p:
            return z >= kth
        zs = jnp.where(zs < kth, -jnp.inf, zs)
    cum = jnp.cumsum(jax.nn.softmax(zs, axis=-1), axis=-1)
    removed = cum <= 1.0 - top_p
    removed = removed.at[..., -1].set(False)  # always keep the largest
    first_kept = jnp.sum(removed, axis=-1, keepdims=True)
    threshold = jnp.take_along_axis(zs, first_kept, axis=-1)
    return z >= threshold


@functools.partial(jax.jit, static_argnames=("use_k", "use_p", "head"))
def sample_step(logits, keys, temperature, top_k, top_p, *, use_k: bool, use_p: bool, head: int):
    """logits [B, V] f32, keys [B] PRNG keys, temperature f32 / top_k int32 / top_p f32 scalars ->
    (tokens [B] int32, logprobs [B] f32, head ids [B, head] int32, head logprobs [B, head] f32)."""
    logits = logits.astype(jnp.float32)
    greedy = temperature <= 0
    z = logits / jnp.where(greedy, jnp.float32(1.0), temperature)
    if use_k or use_p:
        z = jnp.where(kept_mask(z, top_k, top_p, use_k=use_k, use_p=use_p), z, -jnp.inf)
    lp_rows = jnp.where(greedy, jax.nn.log_softmax(logits, axis=-1), jax.nn.log_softmax(z, axis=-1))
    drawn = jax.vmap(lambda k, row: jax.random.categorical(k, row))(keys, lp_rows)
    tok = jnp.where(greedy, jnp.argmax(logits, axis=-1), drawn)
    lp = jnp.take_along_axis(lp_rows, tok[:, None], axis=1)[:, 0]
    if head:
        hlp, hid = jax.lax.top_k(lp_rows, head)
    else:
        hlp = jnp.zeros((logits.shape[0], 0), jnp.float32)
        hid = jnp.zeros((logits.shape[0], 0), jnp.int32)
    return tok.astype(jnp.int32), lp, hid.astype(jnp.int32), hlp


def sample_args(
    temperature: float, top_k: int, top_p: float, head_k: int, *, vocab: int, max_head_k: int
):
    """Host-side split of a request's parameters into (traced arrays, static flags)."""
    use_k = 0 < top_k < vocab
    use_p = top_p < 1.0
    traced = (np.float32(temperature), np.int32(top_k if use_k else 0), np.float32(top_p))
    return traced, {
        "use_k": bool(use_k and temperature > 0),
        "use_p": bool(use_p and temperature > 0),
        "head": int(max_head_k) if head_k else 0,
    }
