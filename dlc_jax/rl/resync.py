"""DLC's resync rule: push theta_t to the sampler when the lag ratio's token- or sequence-level
ESS falls below a threshold."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dlc_jax.rl.effective_sample_size import ess, gaussian_ess, sequence_ess

STATISTICS = ("token", "sequence")


class ResyncDecision(NamedTuple):
    """resync: bool scalar; ess: the chosen ESS of exp(lp - lp_s) (unclipped);
    ess_gaussian: exp(-var) of the token log-ratios."""

    resync: jax.Array
    ess: jax.Array
    ess_gaussian: jax.Array


def resync_decision(
    lp: jax.Array,
    lp_s: jax.Array,
    mask: jax.Array,
    threshold: float = 0.5,
    *,
    statistic: str = "token",
) -> ResyncDecision:
    """lp, lp_s, mask [B,T]. resync = ESS(exp(lp - lp_s)) < threshold, over valid tokens
    (``token``) or over responses weighted by exp(summed log-ratio) (``sequence``, VCPO's)."""
    if statistic not in STATISTICS:
        raise ValueError(f"resync statistic must be one of {STATISTICS}, got {statistic!r}")
    ell = jax.lax.stop_gradient(lp - lp_s)
    e = ess(ell, mask) if statistic == "token" else sequence_ess(ell, mask)
    return ResyncDecision(
        resync=e < jnp.float32(threshold), ess=e, ess_gaussian=gaussian_ess(ell, mask)
    )
