"""Discrepancy/lag split of the per-token log-ratio, and the mismatch-KL estimators:
``log p - log q = (log p_s - log q) + (log p - log p_s) = delta + ell`` (exact, per token). All
inputs [B,T] f32 with a [B,T] mask; statistics are over valid tokens of the global batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dlc_jax.rl import masked

QUANTILES = (0.05, 0.5, 0.95)


def summary(x: jax.Array, mask: jax.Array, prefix: str) -> dict[str, jax.Array]:
    """mean, std, mean |x|, p99 |x| and the QUANTILES of x, keyed ``{prefix}_...``."""
    q = masked.quantiles(x, mask, QUANTILES)
    out = {
        f"{prefix}_mean": masked.mean(x, mask),
        f"{prefix}_std": masked.std(x, mask),
        f"{prefix}_abs_mean": masked.mean(jnp.abs(x), mask),
        # the tail a mean hides (issue 32 reports delta's per scenario)
        f"{prefix}_abs_p99": masked.quantiles(jnp.abs(x), mask, (0.99,))[0],
    }
    for i, qq in enumerate(QUANTILES):
        out[f"{prefix}_q{int(round(qq * 100)):02d}"] = q[i]
    return out


def mismatch_kl(lp: jax.Array, lp_q: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    """Sample estimates of KL(q || p) from tokens drawn from q (Schulman's k1, k2, k3):
    k1 = mean(lp_q - lp), k2 = mean((lp - lp_q)^2 / 2),
    k3 = mean(exp(lp - lp_q) - 1 - (lp - lp_q))."""
    x = jnp.clip(masked.safe(lp - lp_q, mask), -20.0, 20.0)
    return {
        "kl_k1": masked.mean(-x, mask),
        "kl_k2": masked.mean(0.5 * x * x, mask),
        "kl_k3": masked.mean(jnp.expm1(x) - x, mask),
    }


def decompose(lp: jax.Array, lp_s: jax.Array, lp_q: jax.Array, mask: jax.Array) -> dict:
    """Per-token ``delta``, ``ell``, ``total`` arrays [B,T] (zero on invalid tokens) and scalar
    stats: ``delta_*``, ``ell_*``, ``total_*`` (mean, std, abs_mean, abs_p99, q05, q50, q95),
    ``kl_k1/k2/k3`` (mismatch p vs q), ``num_tokens``. Inputs are treated as data
    (stop-gradient)."""
    lp, lp_s, lp_q = (jax.lax.stop_gradient(x) for x in (lp, lp_s, lp_q))
    m = masked.as_mask(mask)
    parts = {"delta": lp_s - lp_q, "ell": lp - lp_s, "total": lp - lp_q}
    out = {name: masked.safe(x, m) for name, x in parts.items()}
    out["num_tokens"] = jnp.sum(m)
    for name in parts:
        out.update(summary(out[name], m, name))
    out.update(mismatch_kl(lp, lp_q, m))
    return out
