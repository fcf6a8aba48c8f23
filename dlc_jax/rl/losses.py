"""Correction losses: ``@register_loss(name)`` binds a function ``(LossConfig, Prepared) ->
(per_token [B,T], metrics)`` to ``loss_config.LOSS_SPECS[name]`` (a name without a spec, or a spec
without a function, is an error at import); ``compute_loss`` runs one. Every loss reports
``clip_frac`` (valid tokens whose ratio or weight was clipped/capped), ``masked_frac`` (valid tokens
removed by a mask) and ``weight_ess`` (normalized ESS of its importance weights; 1.0 where it has
none). Formulas and sources: docs/CORRECTIONS.md."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from dlc_jax.rl import masked
from dlc_jax.rl.centering import centering_residual, dlc_residual
from dlc_jax.rl.effective_sample_size import ess_from_log_weights, sequence_log_ratio
from dlc_jax.rl.loss_config import LOSS_SPECS, LossConfig, LossSpec
from dlc_jax.rl.loss_inputs import LossInputs, Prepared, check_shapes, prepare, require

sg = jax.lax.stop_gradient
LossFn = Callable[[LossConfig, Prepared], tuple[jax.Array, dict]]


@dataclasses.dataclass(frozen=True)
class RegisteredLoss:
    """A loss function with the spec (required inputs, options) it was registered under."""

    spec: LossSpec
    fn: LossFn


_REGISTRY: dict[str, RegisteredLoss] = {}
LOSSES: dict[str, LossFn] = {}  # name -> function, filled by ``register_loss``


def register_loss(name: str) -> Callable[[LossFn], LossFn]:
    """Decorator: register ``fn`` as loss ``name`` with its ``LOSS_SPECS[name]`` requirements."""
    if name not in LOSS_SPECS:
        raise ValueError(f"loss {name!r} has no LossSpec in dlc_jax.rl.loss_config.LOSS_SPECS")

    def deco(fn: LossFn) -> LossFn:
        if name in _REGISTRY:
            raise ValueError(f"loss {name!r} is registered twice")
        _REGISTRY[name] = RegisteredLoss(LOSS_SPECS[name], fn)
        LOSSES[name] = fn
        return fn

    return deco


def clampexp(x: jax.Array, bound: float) -> jax.Array:
    return jnp.exp(jnp.clip(x, -bound, bound))


def weights_ess(w: jax.Array, valid: jax.Array) -> jax.Array:
    """Normalized ESS of non-negative weights w over valid entries (1.0 if none / all zero)."""
    m = masked.as_mask(valid)
    w = jnp.where(m > 0, w, 0.0)
    s1, s2, n = jnp.sum(w), jnp.sum(w * w), jnp.sum(m)
    return jnp.where((n > 0) & (s2 > 0), s1 * s1 / jnp.maximum(n * s2, 1e-30), 1.0)


def _metrics(clip=0.0, masked_frac=0.0, ess=1.0, **extra) -> dict:
    base = {"clip_frac": clip, "masked_frac": masked_frac, "weight_ess": ess}
    return {k: jnp.float32(v) for k, v in {**base, **extra}.items()}


def _ppo_terms(cfg: LossConfig, r: jax.Array, adv: jax.Array):
    """PPO clipped surrogate per token: returns (per_token, clipped_flag, dual_flag)."""
    lo, hi = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    per = -jnp.minimum(r * adv, jnp.clip(r, lo, hi) * adv)
    rd = sg(r)
    clip_flag = jnp.where(adv >= 0, rd > hi, rd < lo)
    dual_flag = jnp.zeros_like(clip_flag)
    if cfg.dual_clip is not None:
        bound = -cfg.dual_clip * adv  # positive when adv < 0
        dual_flag = (adv < 0) & (sg(per) > bound)
        per = jnp.where(adv < 0, jnp.minimum(per, bound), per)
    return per, clip_flag, dual_flag


@register_loss("naive")
def naive(cfg: LossConfig, p: Prepared):
    """3.1 on-policy REINFORCE: -A * lp."""
    return -p.adv * p.lp, _metrics()


@register_loss("tis")
def tis(cfg: LossConfig, p: Prepared):
    """3.2 token TIS vs the sampler: w = min(exp(lp - lp_q), C) detached; -w A lp."""
    raw = clampexp(sg(p.lp) - p.lp_q, cfg.log_ratio_clip)
    w = jnp.minimum(raw, cfg.tis_cap)
    return -w * p.adv * p.lp, _metrics(clip=p.frac(raw > cfg.tis_cap), ess=weights_ess(w, p.m))


@register_loss("tis_seq")
def tis_seq(cfg: LossConfig, p: Prepared):
    """Sequence TIS: w_i = min(exp(sum_t (lp - lp_q)), C_seq) broadcast to the sequence's tokens."""
    s, has = sequence_log_ratio(sg(p.lp) - p.lp_q, p.m)
    raw = clampexp(s, cfg.log_ratio_clip)
    w = jnp.minimum(raw, cfg.seq_tis_cap)
    return -w[:, None] * p.adv * p.lp, _metrics(
        clip=p.frac(raw > cfg.seq_tis_cap), ess=weights_ess(w, has)
    )


@register_loss("mis")
def mis(cfg: LossConfig, p: Prepared):
    """3.3 token MIS (IcePop): k = exp(lp - lp_q), keep lo <= k <= hi; -M k A lp (no renorm)."""
    k = clampexp(sg(p.lp) - p.lp_q, cfg.log_ratio_clip)
    keep = (k >= cfg.mis_low) & (k <= cfg.mis_high)
    w = jnp.where(keep, k, 0.0)
    return -w * p.adv * p.lp, _metrics(masked_frac=p.frac(~keep), ess=weights_ess(w, p.m))


@register_loss("mis_seq")
def mis_seq(cfg: LossConfig, p: Prepared):
    """Sequence MIS: K_i = exp(sum_t (lp - lp_q)); keep sequences with lo <= K_i <= hi, weighted
    by K_i."""
    s, has = sequence_log_ratio(sg(p.lp) - p.lp_q, p.m)
    k = clampexp(s, cfg.log_ratio_clip)
    keep = (k >= cfg.mis_low) & (k <= cfg.mis_high)
    w = jnp.where(keep, k, 0.0)
    return -w[:, None] * p.adv * p.lp, _metrics(masked_frac=p.frac(~keep), ess=weights_ess(w, has))


@register_loss("mis_geo")
def mis_geo(cfg: LossConfig, p: Prepared):
    """Geometric sequence mask: keep sequences with geo_low <= exp(mean_t (lp - lp_q)) <= geo_high.
    Mask only (the geometric mean is not an importance weight): -M_i A lp."""
    s, _ = sequence_log_ratio(sg(p.lp) - p.lp_q, p.m)
    n = jnp.sum(p.m, axis=-1)
    g = clampexp(s / jnp.maximum(n, 1.0), cfg.log_ratio_clip)
    keep = (g >= cfg.geo_low) & (g <= cfg.geo_high)
    return -keep[:, None].astype(jnp.float32) * p.adv * p.lp, _metrics(masked_frac=p.frac(~keep))


def _score_centering(cfg: LossConfig, p: Prepared, mode: str):
    """3.4: -A (sg(f(p/q)) lp - sum_H sg(resid) lp_H), resid = q_H f(p_H/q_H) - rho f(1/rho) p_H."""
    assert p.lp_head is not None  # LossSpec.requires
    w_tok, resid, info = centering_residual(cfg, p, mode)
    per = -p.adv * (w_tok * p.lp - jnp.sum(resid * p.lp_head, axis=-1))
    extra = {
        "head_mass_q": masked.mean(info["q_mass"], p.m),
        "head_mass_p": masked.mean(info["p_mass"], p.m),
        "tail_ratio_mean": masked.mean(info["rho"], p.m),
    }
    clip = p.frac(info["capped"]) if mode == "tis" else 0.0
    msk = p.frac(info["dropped"]) if mode == "mask" else 0.0
    return per, _metrics(clip=clip, masked_frac=msk, ess=weights_ess(w_tok, p.m), **extra)


@register_loss("score_centering")
def score_centering(cfg: LossConfig, p: Prepared):
    return _score_centering(cfg, p, cfg.centering_weight)


@register_loss("score_centering_tis")
def score_centering_tis(cfg: LossConfig, p: Prepared):
    return _score_centering(cfg, p, "tis")


@register_loss("score_centering_mask")
def score_centering_mask(cfg: LossConfig, p: Prepared):
    return _score_centering(cfg, p, "mask")


@register_loss("ppo_clip")
def ppo_clip(cfg: LossConfig, p: Prepared):
    """3.5 PPO-clip vs lp_old (asymmetric eps, optional dual clip)."""
    r = clampexp(p.lp - p.lp_old, cfg.log_ratio_clip)
    per, clip, dual = _ppo_terms(cfg, r, p.adv)
    return per, _metrics(
        clip=p.frac(clip),
        ess=ess_from_log_weights(sg(p.lp) - p.lp_old, p.m),
        dual_clip_frac=p.frac(dual),
    )


@register_loss("decoupled_ppo")
def decoupled_ppo(cfg: LossConfig, p: Prepared):
    """3.6 behaviour weight w = exp(lp_old - lp_q) (clamp at / mask above behave_cap) times PPO-clip
    of r = exp(lp - lp_old)."""
    raw = clampexp(p.lp_old - p.lp_q, cfg.log_ratio_clip)
    over = raw > cfg.behave_cap
    if cfg.behave_mode == "clamp":
        w, capped, dropped = jnp.minimum(raw, cfg.behave_cap), over, jnp.zeros_like(over)
    else:
        w, capped, dropped = jnp.where(over, 0.0, raw), jnp.zeros_like(over), over
    r = clampexp(p.lp - p.lp_old, cfg.log_ratio_clip)
    per, clip, dual = _ppo_terms(cfg, r, p.adv)
    return w * per, _metrics(
        clip=p.frac(clip),
        masked_frac=p.frac(dropped),
        ess=weights_ess(w, p.m),
        behave_cap_frac=p.frac(capped),
        dual_clip_frac=p.frac(dual),
    )


def m2po_mask(d2: jax.Array, m: jax.Array, tau: float) -> jax.Array:
    """Global M2PO mask [B,T]: drop the tokens with the largest d2 until the mean of the rest is
    < tau; never drop every valid token. Ties are broken by position (stable sort)."""
    flat = jnp.where(m > 0, d2, -jnp.inf).reshape(-1)
    size = flat.shape[0]
    order = jnp.argsort(-flat, stable=True)  # descending; invalid (-inf) last
    srt = jnp.where(jnp.isfinite(flat[order]), flat[order], 0.0)
    n = jnp.sum(m)
    j = jnp.arange(size, dtype=jnp.float32)
    prefix = jnp.cumsum(srt) - srt  # sum of the j largest
    rest_mean = (jnp.sum(srt) - prefix) / jnp.maximum(n - j, 1.0)
    ok = (rest_mean < tau) & (j < n)
    n_drop = jnp.where(jnp.any(ok), jnp.argmax(ok), jnp.maximum(n - 1, 0)).astype(jnp.int32)
    rank = jnp.zeros(size, jnp.int32).at[order].set(jnp.arange(size, dtype=jnp.int32))
    return (rank >= n_drop).reshape(m.shape) & (m > 0)


@register_loss("m2po")
def m2po(cfg: LossConfig, p: Prepared):
    """3.7 M2PO: mask tokens with the largest (lp_q - lp_old)^2 until the rest's mean < tau;
    per = -M r A with r = exp(lp - lp_old), no clip (paper form)."""
    d2 = jnp.square(p.lp_q - p.lp_old)
    keep = m2po_mask(d2, p.m, cfg.m2_threshold)
    r = clampexp(p.lp - p.lp_old, cfg.log_ratio_clip)
    return -keep.astype(jnp.float32) * r * p.adv, _metrics(
        masked_frac=p.frac(~keep),
        m2_before=masked.mean(d2, p.m),
        m2_after=masked.mean(d2, p.m * keep),
    )


@register_loss("vcpo")
def vcpo(cfg: LossConfig, p: Prepared):
    """3.8 VCPO: sequence TIS (cap seq_tis_cap) and ``lr_scale`` = min(1, ESS_seq/base)^(1/2|1)
    from the unclipped sequence weights, for the optimizer to apply. The minimum-variance (OPOB)
    baseline is not implemented: it needs per-trajectory gradient norms (micro-batch 1)."""
    s, has = sequence_log_ratio(sg(p.lp) - p.lp_q, p.m)
    e = ess_from_log_weights(jnp.clip(s, -cfg.log_ratio_clip, cfg.log_ratio_clip), has)
    scale = jnp.minimum(1.0, e / cfg.vcpo_base_ess)
    lr_scale = jnp.sqrt(scale) if cfg.vcpo_rule == "sqrt" else scale
    raw = clampexp(s, cfg.log_ratio_clip)
    w = jnp.minimum(raw, cfg.seq_tis_cap)
    return -w[:, None] * p.adv * p.lp, _metrics(
        clip=p.frac(raw > cfg.seq_tis_cap), ess=e, lr_scale=lr_scale, ess_seq=e
    )


@register_loss("dlc")
def dlc(cfg: LossConfig, p: Prepared):
    """3.9 DLC: PPO-clip of r = exp(lp - lp_s) against theta_s plus the centering term
    A * sum_H sg(q_H r_H act_H - coefT p_H) lp_H. Without a head the centering term is absent
    and ``dlc_centering_active`` = 0."""
    assert p.lp_s is not None  # LossSpec("dlc").requires
    ell = p.lp - p.lp_s
    r = clampexp(ell, cfg.log_ratio_clip)
    pg, clip, dual = _ppo_terms(cfg, r, p.adv)
    extra = {"dlc_centering_active": float(p.lp_head is not None), "dual_clip_frac": p.frac(dual)}
    per = pg
    if p.lp_head is not None:
        resid, info = dlc_residual(cfg, p)
        per = pg + p.adv * jnp.sum(resid * p.lp_head, axis=-1)
        extra.update(
            head_mass_q=masked.mean(info["q_mass"], p.m),
            head_mass_p=masked.mean(info["p_mass"], p.m),
            head_clip_frac=masked.mean(info["head_clip"], p.m),
        )
    return per, _metrics(clip=p.frac(clip), ess=ess_from_log_weights(sg(ell), p.m), **extra)


_unregistered = sorted(set(LOSS_SPECS) - set(_REGISTRY))
if _unregistered:
    raise ImportError(f"losses with a LossSpec but no registered function: {_unregistered}")


def compute_loss(cfg: LossConfig, inputs: LossInputs) -> tuple[jax.Array, dict]:
    """Scalar loss ``sum(m * per_token) / num_tokens`` of ``cfg.name`` (static) and its metrics plus
    ``loss``, ``num_tokens`` (the denominator as given), ``valid_tokens`` (tokens that entered the
    loss) and ``nonfinite_tokens`` (valid tokens dropped for NaN/inf inputs). ValueError at trace
    time for an unknown name, a missing required field, mismatched shapes, or part of the spec's
    all-or-none ``together`` group (DLC's head)."""
    entry = _REGISTRY.get(cfg.name)
    if entry is None:
        raise ValueError(
            f"LossConfig.name {cfg.name!r} is not a loss; choose from {sorted(LOSSES)}"
        )
    check_shapes(inputs)
    require(cfg.name, inputs, entry.spec.requires)
    together = entry.spec.together
    if any(getattr(inputs, f) is not None for f in together):
        require(f"{cfg.name} (with a head)", inputs, together)
    p = prepare(inputs)
    per, metrics = entry.fn(cfg, p)
    loss = p.agg(per)
    metrics = dict(metrics)
    metrics.update(
        loss=loss, num_tokens=p.num_tokens, nonfinite_tokens=p.dropped, valid_tokens=jnp.sum(p.m)
    )
    return loss, metrics
