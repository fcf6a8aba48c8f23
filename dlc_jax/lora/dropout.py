"""``lora.dropout``: dropout on the adapters' input in the training forward only. The key folds the
update count into ``lora.seed`` (a resumed run draws the same masks); each adapter gets its own."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from dlc_jax.lora.adapters import adapted


class LoraDropoutKey(nnx.Variable):
    """Raw PRNG key data of one adapter's dropout mask ([2] uint32, or [L, 2] stacked)."""


def step_key(opt_state, seed: int):
    """``lora.seed`` folded with the optimizer's update count (0 without one)."""
    import optax

    counts = optax.tree_utils.tree_get_all_with_path(opt_state, "count")
    count = counts[0][1] if counts else jnp.zeros((), jnp.int32)
    return jax.random.fold_in(jax.random.key(seed), count)


def enable_dropout(model, key, rate: float) -> int:
    """Adapter-input dropout in ``model``, a key per adapter; how many adapters."""
    mods = adapted(model)
    for i, (_, m) in enumerate(mods):
        k = jax.random.fold_in(key, i)
        a = m.lora.a.get_value()
        if a.ndim == m.n_in + 2:  # stacked [L, *in, r]: one key per layer
            k = jax.random.split(k, a.shape[0])
        m.lora.drop_key = LoraDropoutKey(jax.random.key_data(k))
        m.lora.dropout = float(rate)
    return len(mods)
