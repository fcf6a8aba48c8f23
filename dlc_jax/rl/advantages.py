"""GRPO-style group advantages and their broadcast to tokens."""

from __future__ import annotations

import jax
import jax.numpy as jnp

ADVANTAGE_MODES = ("grpo", "mean", "drgrpo")


def group_advantages(
    rewards: jax.Array, mode: str = "grpo", *, eps: float = 1e-6, std_ddof: int = 1
) -> jax.Array:
    """rewards [P, G] (P prompts x G responses) -> advantages [P, G] f32. grpo: (R - mean_g R) /
    (std_g R + eps), std with ``std_ddof`` (1 = unbiased, as verl's torch.std; a group of size 1
    gets 0). mean: R - mean_g R (score-centering papers' "group-centered rewards"). drgrpo: the
    same, Dr.GRPO's advantage (its constant length normalizer is the loss's ``num_tokens``)."""
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"advantage mode must be one of {ADVANTAGE_MODES}, got {mode!r}")
    r = jnp.asarray(rewards, jnp.float32)
    if r.ndim != 2:
        raise ValueError(f"rewards must be [P, G], got shape {r.shape}")
    centered = r - jnp.mean(r, axis=-1, keepdims=True)
    if mode != "grpo":
        return centered
    g = r.shape[-1]
    if g - std_ddof <= 0:
        return jnp.zeros_like(r)
    sd = jnp.sqrt(jnp.sum(centered * centered, axis=-1, keepdims=True) / (g - std_ddof))
    return centered / (sd + eps)


def broadcast_to_tokens(adv: jax.Array, mask: jax.Array) -> jax.Array:
    """adv [B] (per sequence) or [B,T] -> [B,T] f32, zero on invalid tokens."""
    adv = jnp.asarray(adv, jnp.float32)
    if adv.ndim == 1:
        if adv.shape[0] != mask.shape[0]:
            raise ValueError(f"adv [B]={adv.shape} does not match mask [B,T]={mask.shape}")
        adv = jnp.broadcast_to(adv[:, None], mask.shape)
    elif adv.shape != mask.shape:
        raise ValueError(f"adv must be [B] or [B,T]={mask.shape}, got {adv.shape}")
    return jnp.where(mask > 0, adv, 0.0)
