"""Inputs of the correction losses, with shape / requirement validation and sanitizing. Per-token
arrays are [B,T] f32, heads [B,T,K]; ``mask`` is 1 on valid (response) tokens.
``agg(x) = sum(mask * x) / num_tokens``, ``num_tokens`` counted over the *global* batch before any
loss-specific masking (default ``mask.sum()``; a constant gives Dr.GRPO-style normalization)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from dlc_jax.rl import masked
from dlc_jax.rl.advantages import broadcast_to_tokens
from dlc_jax.rl.logprobs import OUT_OF_SUPPORT_LOGPROB


@struct.dataclass
class LossInputs:
    """Pytree of loss inputs. Shapes: [B,T] unless noted; heads [B,T,K]."""

    lp: jax.Array  # log p at theta (differentiable)
    lp_q: jax.Array  # sampler log q of the sampled token
    mask: jax.Array
    adv: jax.Array  # [B] or [B,T]
    lp_s: jax.Array | None = None  # trainer at sampler weights theta_s
    lp_old: jax.Array | None = None  # proximal policy (default sg(lp))
    lp_head: jax.Array | None = None  # log p at head ids (differentiable)
    lps_head: jax.Array | None = None  # trainer at theta_s on the head
    lq_head: jax.Array | None = None  # sampler log q on the head (full-vocabulary normalized)
    head_valid: jax.Array | None = None  # 1 where the head entry is real (default all ones)
    num_tokens: jax.Array | None = None  # scalar denominator (default mask.sum())


TOKEN_FIELDS = ("lp", "lp_q", "lp_s", "lp_old", "adv")
HEAD_FIELDS = ("lp_head", "lps_head", "lq_head", "head_valid")


def check_shapes(inp: LossInputs) -> None:
    """Static shape checks (work on tracers). Raises ValueError naming the field."""
    bt = tuple(inp.mask.shape)
    if len(bt) != 2:
        raise ValueError(f"LossInputs.mask must be [B,T], got shape {bt}")
    for f in TOKEN_FIELDS[:4]:
        x = getattr(inp, f)
        if x is not None and tuple(x.shape) != bt:
            raise ValueError(
                f"LossInputs.{f} has shape {tuple(x.shape)}, expected mask's [B,T]={bt}"
            )
    if tuple(inp.adv.shape) not in (bt, bt[:1]):
        raise ValueError(
            f"LossInputs.adv has shape {tuple(inp.adv.shape)}, expected [B]={bt[:1]} or [B,T]={bt}"
        )
    k = None
    for f in HEAD_FIELDS:
        x = getattr(inp, f)
        if x is None:
            continue
        if x.ndim != 3 or tuple(x.shape[:2]) != bt:
            raise ValueError(
                f"LossInputs.{f} has shape {tuple(x.shape)}, expected [B,T,K] with [B,T]={bt}"
            )
        if k is not None and x.shape[2] != k:
            raise ValueError(
                f"LossInputs.{f} has head size K={x.shape[2]}, other head fields have {k}"
            )
        k = x.shape[2]
    if inp.num_tokens is not None and jnp.ndim(inp.num_tokens) != 0:
        raise ValueError(
            f"LossInputs.num_tokens must be a scalar, got shape {jnp.shape(inp.num_tokens)}"
        )


def require(loss: str, inp: LossInputs, fields: tuple[str, ...]) -> None:
    missing = [f for f in fields if getattr(inp, f) is None]
    if missing:
        raise ValueError(f"loss {loss!r} needs LossInputs field(s) {missing}, which are None")


def validate_inputs(inp: LossInputs) -> None:
    """Host-side check before a step: shapes, no NaN/inf on valid tokens in the [B,T] fields and no
    NaN/+inf in valid head entries (-inf = probability 0 is allowed); padding may hold anything.
    Raises ValueError naming the field and the count."""
    check_shapes(inp)
    m = np.asarray(inp.mask) > 0
    for f in TOKEN_FIELDS:
        x = getattr(inp, f)
        if x is None:
            continue
        x = np.asarray(x)
        mm = m if x.ndim == 2 else m.any(-1)
        bad = int(np.sum(~np.isfinite(x) & mm))
        if bad:
            raise ValueError(f"LossInputs.{f} has {bad} non-finite value(s) on valid tokens")
    hv = m[..., None] if inp.head_valid is None else m[..., None] & (np.asarray(inp.head_valid) > 0)
    for f in ("lp_head", "lps_head", "lq_head"):
        x = getattr(inp, f)
        if x is not None:
            x = np.asarray(x)
            bad = int(np.sum((np.isnan(x) | (x == np.inf)) & hv))
            if bad:
                raise ValueError(
                    f"LossInputs.{f} has {bad} NaN/+inf value(s) on valid head entries "
                    "(-inf = probability 0 is allowed)"
                )
    if inp.num_tokens is not None and not math.isfinite(float(inp.num_tokens)):
        raise ValueError(f"LossInputs.num_tokens is not finite: {inp.num_tokens}")


@struct.dataclass
class Prepared:
    """Sanitized arrays: invalid positions hold 0 so padding garbage cannot reach sums or grads."""

    m: jax.Array
    adv: jax.Array
    lp: jax.Array
    lp_q: jax.Array
    lp_s: jax.Array | None
    lp_old: jax.Array
    hv: jax.Array | None
    lp_head: jax.Array | None
    lps_head: jax.Array | None
    lq_head: jax.Array | None
    num_tokens: jax.Array  # the denominator as given (default: valid tokens, dropped ones too)
    denom: jax.Array
    dropped: jax.Array  # valid tokens dropped for non-finite inputs

    def agg(self, x: jax.Array) -> jax.Array:
        return jnp.sum(jnp.where(self.m > 0, x, 0.0)) / self.denom

    def frac(self, flag: jax.Array) -> jax.Array:
        """Fraction of valid tokens where flag holds (flag [B,T] bool, or [B] per sequence)."""
        if flag.ndim == 1:
            flag = jnp.broadcast_to(flag[:, None], self.m.shape)
        return masked.mean(flag.astype(jnp.float32), self.m)


def _finite_tokens(inp: LossInputs, m: jax.Array) -> jax.Array:
    """[B,T] bool: every float input of this token (and its valid head entries) is finite."""
    ok = jnp.ones(m.shape, bool)
    for f in TOKEN_FIELDS[:4]:
        x = getattr(inp, f)
        if x is not None:
            ok = ok & jnp.isfinite(x)
    adv_ok = jnp.isfinite(inp.adv)
    ok = ok & (adv_ok if inp.adv.ndim == 2 else adv_ok[:, None])
    hv = None if inp.head_valid is None else masked.as_mask(inp.head_valid) > 0
    for f in ("lp_head", "lps_head", "lq_head"):
        x = getattr(inp, f)
        if x is not None:
            fin = _head_ok(x) if hv is None else (_head_ok(x) | ~hv)
            ok = ok & jnp.all(fin, axis=-1)
    return ok


def _head_ok(x):
    """Head log-probs may be -inf (probability 0, e.g. padding); NaN and +inf are invalid."""
    return ~jnp.isnan(x) & (x < jnp.inf)


def prepare(inp: LossInputs) -> Prepared:
    """Sanitize inputs. Valid tokens with a NaN/inf input are dropped from the loss (still counted
    in the default denominator) and reported as ``dropped`` (``nonfinite_tokens``); use
    ``validate_inputs`` on the host to refuse such a batch instead."""
    m_in = masked.as_mask(inp.mask)
    m = m_in * _finite_tokens(inp, m_in)
    sg = jax.lax.stop_gradient

    def tok(x: jax.Array) -> jax.Array:
        return masked.safe(x.astype(jnp.float32), m)

    hv = None
    heads = [x for x in (inp.lp_head, inp.lq_head, inp.lps_head) if x is not None]
    if heads:
        base = jnp.ones(heads[0].shape, jnp.float32)
        hv = base if inp.head_valid is None else masked.as_mask(inp.head_valid)
        hv = hv * m[..., None]

    def head(x: jax.Array | None, detach: bool = True) -> jax.Array | None:
        # -inf entries (probability 0) become the finite OUT_OF_SUPPORT floor: exp() is still 0,
        # and no inf * 0 can appear in the centering term.
        if x is None:
            return None
        assert hv is not None  # set whenever a head field is given
        h = jnp.where(hv > 0, jnp.maximum(x.astype(jnp.float32), OUT_OF_SUPPORT_LOGPROB), 0.0)
        return sg(h) if detach else h

    lp = tok(inp.lp)
    adv = broadcast_to_tokens(jnp.where(jnp.isfinite(inp.adv), inp.adv, 0.0), m)
    n = jnp.sum(m_in) if inp.num_tokens is None else jnp.asarray(inp.num_tokens, jnp.float32)
    return Prepared(
        m=m,
        adv=sg(adv),
        lp=lp,
        lp_q=sg(tok(inp.lp_q)),
        lp_s=None if inp.lp_s is None else sg(tok(inp.lp_s)),
        lp_old=sg(lp if inp.lp_old is None else tok(inp.lp_old)),
        hv=hv,
        lp_head=head(inp.lp_head, detach=False),
        lps_head=head(inp.lps_head),
        lq_head=head(inp.lq_head),
        num_tokens=n,
        denom=jnp.maximum(n, 1.0),
        dropped=jnp.sum(m_in) - jnp.sum(m),
    )
