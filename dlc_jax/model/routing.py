"""MoE routing replay: the `moe` config section, the step's `routed_experts` array built from the
sampler's rollouts, and routing-mismatch metrics. With `moe.router_replay: sampler` the train step
and the theta_s forward use the sampler's experts, with gate weights from the trainer's router."""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax.numpy as jnp
import numpy as np

ROUTER_REPLAY = ("off", "sampler")


@dataclasses.dataclass
class MoeSection:
    """`moe.*` (a dense model ignores them). router_replay: off | sampler (replay the sampler's
    routed experts). load_balance_loss: weight of the load-balancing loss (0 = off)."""

    router_replay: Literal["off", "sampler"] = "off"
    load_balance_loss: float = 0.0

    def __post_init__(self):
        if self.router_replay not in ROUTER_REPLAY:
            raise ValueError(f"moe.router_replay must be one of {ROUTER_REPLAY}")
        if self.load_balance_loss < 0:
            raise ValueError("moe.load_balance_loss must be >= 0")


def routed_batch(rollouts: list, seq_index: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """[B, L, layers, K] int32: the sampler's routed experts of each batch position's token
    (`seq_index` / `positions` as in `PackedBatch`); positions without routing get 0."""
    shapes = [r.routed_experts.shape[1:] for r in rollouts if r.routed_experts is not None]
    if not shapes:
        raise ValueError(
            "moe.router_replay=sampler: the sampler returned no routed experts (a dense model, or "
            "a sampler without routed-expert support)"
        )
    out = np.zeros((*seq_index.shape, *shapes[0]), np.int32)
    for i, r in enumerate(rollouts):
        if r.routed_experts is None:
            continue
        rows, cols = np.nonzero(seq_index == i)
        pos = positions[rows, cols]
        keep = pos < len(r.routed_experts)
        out[rows[keep], cols[keep]] = r.routed_experts[pos[keep]]
    return out


def routing_mismatch(own, sampler, mask, sparse) -> dict:
    """Set agreement of the trainer's top-k `own` with `sampler`'s ([B, L, layers, K]) over `mask`
    [B, L] > 0 and sparse layers (`sparse` [layers] bool): 'moe/routing_agreement' (mean share of
    a token's experts both chose), '..._l{i}' per layer, 'moe/tokens_flipped' (any differs)."""
    own = jnp.sort(jnp.asarray(own), axis=-1)
    smp = jnp.sort(jnp.asarray(sampler).astype(own.dtype), axis=-1)
    same = jnp.mean((own[..., :, None] == smp[..., None, :]).any(-1), axis=-1)  # [B, L, layers]
    m = (jnp.asarray(mask) > 0).astype(jnp.float32)
    sp = jnp.asarray(sparse, bool)
    n = jnp.maximum(jnp.sum(m), 1.0)
    per_layer = jnp.sum(same * m[..., None], axis=(0, 1)) / n
    flipped = jnp.any((same < 1.0) & sp, axis=-1)
    agreement = jnp.sum(jnp.where(sp, per_layer, 0.0)) / jnp.maximum(jnp.sum(sp), 1)
    out = {"moe/routing_agreement": agreement, "moe/tokens_flipped": jnp.sum(flipped * m) / n}
    for i in np.flatnonzero(np.asarray(sparse)):
        out[f"moe/routing_agreement_l{i}"] = per_layer[i]
    return out
