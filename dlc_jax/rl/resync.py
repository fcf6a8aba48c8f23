"""DLC's resync rule: push theta_t to the sampler when the lag ratio's ESS falls below a
threshold."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dlc_jax.rl.effective_sample_size import ess, gaussian_ess


class ResyncDecision(NamedTuple):
    """resync: bool scalar; ess: token ESS of exp(lp - lp_s) (unclipped);
    ess_gaussian: exp(-var)."""

    resync: jax.Array
    ess: jax.Array
    ess_gaussian: jax.Array


def resync_decision(
    lp: jax.Array, lp_s: jax.Array, mask: jax.Array, threshold: float = 0.5
) -> ResyncDecision:
    """lp, lp_s, mask [B,T]. resync = ESS(exp(lp - lp_s) over valid tokens) < threshold.
    With no valid token ESS = 1 and no resync is requested."""
    ell = jax.lax.stop_gradient(lp - lp_s)
    e = ess(ell, mask)
    return ResyncDecision(
        resync=e < jnp.float32(threshold), ess=e, ess_gaussian=gaussian_ess(ell, mask)
    )
