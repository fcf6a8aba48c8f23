"""The per-step metrics of DESIGN.md section 3 computable from the batch's log-probs, jittable
(clip fraction comes from the loss, version lag and resync count from the trainer)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dlc_jax.rl import masked
from dlc_jax.rl.decomposition import decompose
from dlc_jax.rl.effective_sample_size import ess, gaussian_ess, sequence_ess


def step_metrics(
    lp: jax.Array,
    lp_s: jax.Array,
    lp_q: jax.Array,
    mask: jax.Array,
    *,
    lq_head: jax.Array | None = None,
    lp_head: jax.Array | None = None,
    head_valid: jax.Array | None = None,
    entropy: jax.Array | None = None,
    rewards: jax.Array | None = None,
) -> dict[str, jax.Array]:
    """Scalars: delta/ell/total stats (see ``decompose``), kl_k1/k2/k3 (q vs p),
    ess_lag (token ESS of exp(ell)), ess_lag_seq, ess_lag_gaussian (exp(-var ell)), ess_total
    (token ESS of exp(lp - lp_q)), ess_total_gaussian, head_mass_q/head_mass_p (mean over valid
    tokens of sum_H q, sum_H p), entropy_mean, reward_mean/std. Inputs [B,T]; heads [B,T,K]."""
    lp, lp_s, lp_q = (jax.lax.stop_gradient(x) for x in (lp, lp_s, lp_q))
    m = masked.as_mask(mask)
    d = decompose(lp, lp_s, lp_q, m)
    out = {k: v for k, v in d.items() if k not in ("delta", "ell", "total")}
    out.update(
        ess_lag=ess(d["ell"], m),
        ess_lag_seq=sequence_ess(d["ell"], m),
        ess_lag_gaussian=gaussian_ess(d["ell"], m),
        ess_total=ess(d["total"], m),
        ess_total_gaussian=gaussian_ess(d["total"], m),
    )
    for name, h in (("head_mass_q", lq_head), ("head_mass_p", lp_head)):
        if h is not None:
            hv = True if head_valid is None else masked.as_mask(head_valid) > 0
            mass = jnp.sum(jnp.where(hv, jnp.exp(jax.lax.stop_gradient(h)), 0.0), -1)
            out[name] = masked.mean(mass, m)
    if entropy is not None:
        out["entropy_mean"] = masked.mean(jax.lax.stop_gradient(entropy), m)
    if rewards is not None:
        r = jnp.asarray(rewards, jnp.float32)
        out["reward_mean"], out["reward_std"] = jnp.mean(r), jnp.std(r)
    return out
