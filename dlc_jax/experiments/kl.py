"""Exact full-vocabulary next-token KL between two policies on fixed prefixes, each given by its
final hidden states and unembedding (f32 logits ``hidden @ unembed.T / temperature``), scanned in
chunks so the largest intermediates are ``[chunk_size, V]`` per policy."""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class KLSums:
    """Masked sums over prefix positions h, added across batches: forward = sum_h m_h KL(a || b),
    reverse = sum_h m_h KL(b || a), count = sum_h m_h."""

    forward: float
    reverse: float
    count: float

    def __add__(self, other: KLSums) -> KLSums:
        return KLSums(
            self.forward + other.forward, self.reverse + other.reverse, self.count + other.count
        )

    def means(self) -> dict[str, float]:
        """``{"forward", "reverse", "symmetric", "count"}``; raises without valid prefixes."""
        if self.count <= 0:
            raise ValueError(
                "KL over reference prefixes: no valid prefix positions (mask is all zero)"
            )
        fwd, rev = self.forward / self.count, self.reverse / self.count
        return {
            "forward": float(fwd),
            "reverse": float(rev),
            "symmetric": float(0.5 * (fwd + rev)),
            "count": float(self.count),
        }


def _chunk_kl(h_a, h_b, w_a, w_b, m, inv_temp):
    """KL both ways for one chunk. h_*: [C, D]; w_*: [V, D]; m: [C] -> (fwd_sum, rev_sum)."""
    logits_a = jnp.einsum("cd,vd->cv", h_a.astype(jnp.float32), w_a.astype(jnp.float32)) * inv_temp
    logits_b = jnp.einsum("cd,vd->cv", h_b.astype(jnp.float32), w_b.astype(jnp.float32)) * inv_temp
    logp_a = jax.nn.log_softmax(logits_a, axis=-1)
    logp_b = jax.nn.log_softmax(logits_b, axis=-1)
    diff = logp_a - logp_b  # [C, V]
    fwd = jnp.sum(jnp.exp(logp_a) * diff, axis=-1)  # KL(a||b) per position
    rev = jnp.sum(jnp.exp(logp_b) * (-diff), axis=-1)  # KL(b||a)
    return jnp.sum(m * fwd), jnp.sum(m * rev)


@partial(jax.jit, static_argnames=("chunk_size",))
def kl_sums(hidden_a, hidden_b, unembed_a, unembed_b, mask, *, temperature=1.0, chunk_size=256):
    """Masked sums of the next-token KL between policies a and b: hidden_* [..., D] at the same
    positions (same shape), unembed_* [V, D], mask [...] (1 where a prefix counts) ->
    (forward_sum, reverse_sum, count) f32 scalars, forward = sum m * KL(a||b)."""
    if hidden_a.shape != hidden_b.shape:
        raise ValueError(
            f"hidden_a {hidden_a.shape} and hidden_b {hidden_b.shape} must have the same shape"
        )
    if unembed_a.shape != unembed_b.shape or unembed_a.shape[-1] != hidden_a.shape[-1]:
        raise ValueError(
            f"unembed_a {unembed_a.shape} / unembed_b {unembed_b.shape} must both be [V, "
            f"{hidden_a.shape[-1]}]"
        )
    if mask.shape != hidden_a.shape[:-1]:
        raise ValueError(
            f"mask {mask.shape} must match the hidden states' leading shape {hidden_a.shape[:-1]}"
        )
    d = hidden_a.shape[-1]
    h_a, h_b = hidden_a.reshape(-1, d), hidden_b.reshape(-1, d)
    m = mask.reshape(-1).astype(jnp.float32)
    n = h_a.shape[0]
    c = max(1, min(int(chunk_size), n))
    pad = (-n) % c
    if pad:
        h_a, h_b = (jnp.pad(h, ((0, pad), (0, 0))) for h in (h_a, h_b))
        m = jnp.pad(m, (0, pad))
    n_chunks = (n + pad) // c
    xs = (h_a.reshape(n_chunks, c, d), h_b.reshape(n_chunks, c, d), m.reshape(n_chunks, c))
    inv_temp = 1.0 / jnp.asarray(temperature, jnp.float32)

    def body(carry, x):
        ha, hb, mm = x
        f, r = _chunk_kl(ha, hb, unembed_a, unembed_b, mm, inv_temp)
        return (carry[0] + f, carry[1] + r), None

    zero = jnp.zeros((), jnp.float32)
    (fwd, rev), _ = jax.lax.scan(body, (zero, zero), xs)
    return fwd, rev, jnp.sum(m)


def kl_on_positions(*args, **kwargs) -> KLSums:
    """:func:`kl_sums` (same arguments) as a host-side :class:`KLSums`."""
    return KLSums(*map(float, kl_sums(*args, **kwargs)))
