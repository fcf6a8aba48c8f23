"""The sampler's logit transform as vLLM applies it (``logprobs_mode="processed_logprobs"``):
``logits / temperature``, then top-k, then top-p, then ``log_softmax`` over the kept support, so the
trainer normalizes on the sampler's support. As vLLM's ``apply_top_k_top_p_pytorch``: top-k
(0 < k < V) removes entries strictly below the k-th largest (ties kept); top-p (p < 1) sorts
ascending and removes entries with ``cumsum(softmax) <= 1 - p``, always keeping the largest, on the
renormalized top-k distribution. The kept top-p set is applied as ``logits >= threshold`` (its
smallest kept logit): vLLM's positional mask except at exact ties on the boundary, which this keeps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def check_sampling_params(temperature: float, top_k: int, top_p: float) -> None:
    """Raise ValueError naming the bad parameter."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (greedy has no log-probs), got {temperature!r}")
    if not isinstance(top_k, int) or top_k < -1:
        raise ValueError(f"top_k must be an int >= -1 (0 or -1 = off), got {top_k!r}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def support_mask(logits: jax.Array, *, top_k: int = 0, top_p: float = 1.0) -> jax.Array | None:
    """Boolean kept-support mask [N, V] for temperature-scaled f32 logits [N, V] (no gradient);
    None when neither top-k nor top-p is active."""
    vocab = logits.shape[-1]
    use_k = 0 < top_k < vocab
    use_p = top_p < 1.0
    if not (use_k or use_p):
        return None
    z = jax.lax.stop_gradient(logits)
    if use_k and not use_p:
        kth = jax.lax.top_k(z, top_k)[0][..., -1:]  # [N, 1] k-th largest value
        return z >= kth
    zs = jnp.sort(z, axis=-1)  # ascending [N, V]
    if use_k:
        kth = zs[..., vocab - top_k : vocab - top_k + 1]
        zs = jnp.where(zs < kth, -jnp.inf, zs)
    cum = jnp.cumsum(jax.nn.softmax(zs, axis=-1), axis=-1)
    removed = cum <= 1.0 - top_p
    removed = removed.at[..., -1].set(False)  # always keep the largest
    # Kept entries form a suffix of the ascending sort: the first kept index is the count removed.
    first_kept = jnp.sum(removed, axis=-1, keepdims=True)
    threshold = jnp.take_along_axis(zs, first_kept, axis=-1)  # [N, 1]
    return z >= threshold


def processed_logits(
    logits: jax.Array, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> tuple[jax.Array, jax.Array | None]:
    """Temperature-scaled logits [N, V] and the kept-support mask (None = all kept). Entries
    outside the support are not set to -inf: callers mask them so no gradient multiplies by inf."""
    z = logits.astype(jnp.float32) / jnp.float32(temperature)
    return z, support_mask(z, top_k=top_k, top_p=top_p)
