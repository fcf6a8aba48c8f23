"""Jittable masked reductions over the whole (global) array (mask float/bool, 1 = valid); with no
valid entry, means/stds/quantiles return 0.0 rather than NaN."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def as_mask(mask: jax.Array) -> jax.Array:
    """Float32 0/1 mask."""
    return (jnp.asarray(mask) > 0).astype(jnp.float32)


def safe(x: jax.Array, mask: jax.Array) -> jax.Array:
    """x with invalid entries replaced by 0, so NaN/inf padding cannot leak into sums or grads."""
    return jnp.where(mask > 0, x, jnp.zeros_like(x))


def mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    m = as_mask(mask)
    return jnp.sum(safe(x, m)) / jnp.maximum(jnp.sum(m), 1.0)


def var(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Population variance (ddof=0) over valid entries."""
    m = as_mask(mask)
    mu = mean(x, m)
    return mean(jnp.square(safe(x, m) - mu), m)


def std(x: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sqrt(var(x, mask))


def quantiles(x: jax.Array, mask: jax.Array, qs: tuple[float, ...]) -> jax.Array:
    """Linear-interpolated quantiles (numpy's default 'linear') over valid entries -> [len(qs)]."""
    m = as_mask(mask).reshape(-1)
    v = jnp.where(m > 0, x.reshape(-1).astype(jnp.float32), jnp.inf)
    s = jnp.sort(v)  # valid values first
    n = jnp.sum(m)
    pos = jnp.asarray(qs, jnp.float32) * jnp.maximum(n - 1.0, 0.0)
    lo = jnp.floor(pos).astype(jnp.int32)
    hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0).astype(jnp.int32))
    frac = pos - lo
    a, b = s[lo], s[hi]
    out = jnp.where(frac == 0, a, a + frac * (b - a))
    return jnp.where(n > 0, out, 0.0)
