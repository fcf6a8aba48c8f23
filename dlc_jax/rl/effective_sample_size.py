"""Normalized effective sample size of importance ratios given as log-ratios:
ESS = (sum w)^2 / (n * sum w^2) in (0, 1], w = exp(log_ratio - max), over the whole (global)
array; 1.0 with no valid entry (no evidence of degeneracy)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dlc_jax.rl import masked


def ess_from_log_weights(log_w: jax.Array, valid: jax.Array) -> jax.Array:
    """Normalized ESS of exp(log_w) over entries where valid > 0 (any shape). Scalar f32."""
    m = masked.as_mask(valid)
    lw = jnp.where(m > 0, log_w.astype(jnp.float32), -jnp.inf)
    mx = jax.lax.stop_gradient(jnp.max(lw))
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    w = jnp.where(m > 0, jnp.exp(lw - mx), 0.0)
    n = jnp.sum(m)
    s1, s2 = jnp.sum(w), jnp.sum(w * w)
    return jnp.where(n > 0, s1 * s1 / jnp.maximum(n * s2, 1e-30), 1.0)


ess = ess_from_log_weights  # token-level: ESS of exp(log_ratio) over valid tokens of [B,T]


def sequence_log_ratio(log_ratio: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-sequence summed log-ratio [B] and a [B] validity flag (sequence has a valid token)."""
    m = masked.as_mask(mask)
    valid = (jnp.sum(m, axis=-1) > 0).astype(jnp.float32)
    return jnp.sum(masked.safe(log_ratio, m), axis=-1), valid


def sequence_ess(log_ratio: jax.Array, mask: jax.Array) -> jax.Array:
    """Sequence-level normalized ESS (VCPO): w_i = exp(sum_t m log_ratio), log_ratio [B,T]."""
    return ess_from_log_weights(*sequence_log_ratio(log_ratio, mask))


def gaussian_ess(log_ratio: jax.Array, mask: jax.Array) -> jax.Array:
    """Log-normal prediction exp(-var(log r)) (population variance over valid tokens)."""
    return jnp.exp(-masked.var(log_ratio, mask))
