"""Score-centering coefficients from the sampler's head [B,T,K] (all detached). The tail outside the
head is modelled as a rescaled copy of p (q_v = rho p_v), masses floored at ``tail_floor``; since
sum_v p_v s_v = 0 the tail term reduces to ``-coef_tail * p_H`` on the head, which ``resid``
contains. A head covering the whole vocabulary floors the tail masses: the tail coefficient is then
arbitrary but multiplies 0, so the gradient stays exact. Formulas and the DLC active set:
docs/CORRECTIONS.md sections 3 and 5."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from dlc_jax.rl.loss_config import LossConfig
from dlc_jax.rl.loss_inputs import Prepared

sg = jax.lax.stop_gradient


def weight_fn(mode: str, cfg: LossConfig) -> Callable[[jax.Array], jax.Array]:
    """f(r) for score centering: none -> 1, tis -> min(r, tis_cap), mask -> r 1[lo <= r <= hi]."""
    if mode == "none":
        return lambda r: jnp.ones_like(r)
    if mode == "tis":
        return lambda r: jnp.minimum(r, cfg.tis_cap)
    if mode == "mask":
        return lambda r: jnp.where((r >= cfg.mis_low) & (r <= cfg.mis_high), r, 0.0)
    raise ValueError(f"centering weight mode must be none|tis|mask, got {mode!r}")


def _head_probs(p: Prepared, x: jax.Array) -> jax.Array:
    assert p.hv is not None  # set by prepare() whenever a head is given
    return jnp.where(p.hv > 0, jnp.exp(sg(x)), 0.0)


def centering_residual(
    cfg: LossConfig, p: Prepared, mode: str
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """-> (w_tok [B,T], resid [B,T,K], info). resid_v = q_v f(p_v/q_v) - rho f(1/rho) p_v."""
    assert p.lp_head is not None and p.lq_head is not None and p.hv is not None
    f = weight_fn(mode, cfg)
    bound = cfg.log_ratio_clip
    p_h, q_h = _head_probs(p, p.lp_head), _head_probs(p, p.lq_head)
    p_mass, q_mass = jnp.sum(p_h, -1), jnp.sum(q_h, -1)
    rho = jnp.maximum(1.0 - q_mass, cfg.tail_floor) / jnp.maximum(1.0 - p_mass, cfg.tail_floor)
    alpha = rho * f(1.0 / rho)
    r_tok = jnp.exp(jnp.clip(sg(p.lp) - p.lp_q, -bound, bound))
    w_tok = f(r_tok)
    r_h = jnp.exp(jnp.clip(sg(p.lp_head) - p.lq_head, -bound, bound))
    resid = jnp.where(p.hv > 0, q_h * f(r_h) - alpha[..., None] * p_h, 0.0)
    info = {
        "p_mass": p_mass,
        "q_mass": q_mass,
        "rho": rho,
        "capped": r_tok > cfg.tis_cap,
        "dropped": (r_tok < cfg.mis_low) | (r_tok > cfg.mis_high),
    }
    return sg(w_tok), sg(resid), info


def lag_active(cfg: LossConfig, log_r: jax.Array, pos: jax.Array) -> jax.Array:
    """Where the PPO surrogate of the lag ratio r = exp(log_r) passes gradient (bool), as in
    ``losses._ppo_terms``: A >= 0 (``pos``) needs r <= 1+eps_high; A < 0 needs r >= 1-eps_low and,
    with a dual clip c, r <= c; and |log_r| <= log_ratio_clip."""
    lo, hi = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    r = jnp.exp(jnp.clip(log_r, -cfg.log_ratio_clip, cfg.log_ratio_clip))
    neg_ok = r >= lo
    if cfg.dual_clip is not None:
        neg_ok = neg_ok & (r <= cfg.dual_clip)
    return jnp.where(pos, r <= hi, neg_ok) & (jnp.abs(log_r) <= cfg.log_ratio_clip)


def dlc_residual(cfg: LossConfig, p: Prepared) -> tuple[jax.Array, dict[str, jax.Array]]:
    """DLC centering residual [B,T,K] (docs/CORRECTIONS.md, DLC): resid = coefH - coefT p_H with
    coefH = (q_H - p_s,H) r_H act_H (r_H = p_H / p_s,H), coefT = ((q_t - s_t)/p_t) r_t act_t on the
    tail masses, act = ``lag_active``. The centered gradient's mean under q is PPO-clip-vs-theta_s's
    mean under p_s: the discrepancy is removed, the clipped lag is left to the clip."""
    assert p.lp_head is not None and p.lq_head is not None and p.lps_head is not None
    assert p.hv is not None
    bound = cfg.log_ratio_clip
    p_h, q_h, s_h = (_head_probs(p, x) for x in (p.lp_head, p.lq_head, p.lps_head))
    p_t, q_t, s_t = (jnp.maximum(1.0 - jnp.sum(x, -1), cfg.tail_floor) for x in (p_h, q_h, s_h))
    pos = p.adv >= 0
    ell_h = sg(p.lp_head) - p.lps_head
    act_h = lag_active(cfg, ell_h, pos[..., None])
    w_h = jnp.exp(jnp.clip(ell_h, -bound, bound)) * act_h  # the clipped lag weight r act
    ell_t = jnp.log(p_t) - jnp.log(s_t)
    act_t = lag_active(cfg, ell_t, pos)
    w_t = jnp.exp(jnp.clip(ell_t, -bound, bound)) * act_t
    # E_q[r act s] - E_{p_s}[r act s]: only the discrepancy q vs p_s is centered
    coef_h = (q_h - s_h) * w_h
    coef_t = (q_t - s_t) / p_t * w_t
    resid = jnp.where(p.hv > 0, coef_h - coef_t[..., None] * p_h, 0.0)
    n_head = jnp.maximum(jnp.sum(p.hv, -1), 1.0)
    info = {
        "p_mass": jnp.sum(p_h, -1),
        "q_mass": jnp.sum(q_h, -1),
        "head_clip": jnp.sum(jnp.where(p.hv > 0, ~act_h, False), -1) / n_head,
    }
    return sg(resid), info
