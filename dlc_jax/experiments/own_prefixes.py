"""Prefixes a run samples from its checkpointed policy theta_t, by a full-forward loop over a fixed
``[B, prompt + max_tokens]`` buffer (one jitted shape, no KV cache: for the tiny CPU models)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from dlc_jax.experiments.prefixes import PrefixSet, assemble


@functools.lru_cache(maxsize=1)
def _next_token_fn():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    @nnx.jit
    def next_token(model, ids, mask, pos, key, inv_temp):
        logits = model(ids, attention_mask=mask)  # [B, L, V]
        last = jnp.take_along_axis(logits, pos[:, None, None], axis=1)[:, 0].astype(jnp.float32)
        return jax.random.categorical(key, last * inv_temp, axis=-1)

    return next_token


def sample_responses(
    model,
    prompt_ids: Sequence[np.ndarray],
    *,
    max_tokens: int,
    temperature: float,
    seed: int,
    eos_id: int,
    pad_id: int = 0,
) -> list[np.ndarray]:
    """One response per prompt (int32, eos included when sampled) sampled from ``model``."""
    import jax
    import jax.numpy as jnp

    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    n = len(prompt_ids)
    lens = np.array([len(p) for p in prompt_ids], np.int32)
    width = int(lens.max()) + int(max_tokens)
    ids = np.full((n, width), pad_id, np.int32)
    for i, p in enumerate(prompt_ids):
        ids[i, : len(p)] = p
    cur = lens.copy()  # next write position per row
    done = np.zeros(n, bool)
    fn = _next_token_fn()
    key = jax.random.PRNGKey(int(seed))
    pos_ar = np.arange(width)[None, :]
    for _ in range(int(max_tokens)):
        key, sub = jax.random.split(key)
        mask = (pos_ar < cur[:, None]).astype(np.int32)
        arrays = (jnp.asarray(a) for a in (ids, mask, cur - 1))
        tok = np.asarray(fn(model, *arrays, sub, jnp.float32(1.0 / temperature)))
        live = ~done
        ids[live, cur[live]] = tok[live]
        cur[live] += 1
        done |= live & (tok == eos_id)
        if done.all():
            break
    return [ids[i, lens[i] : cur[i]].copy() for i in range(n)]


def own_prefix_set(
    model, prompt_ids: Sequence[np.ndarray], *, eos_id: int, pad_id: int = 0, **sampling: Any
) -> PrefixSet:
    """A :class:`PrefixSet` of ``model``'s own responses (empty ones get eos)."""
    resp = sample_responses(model, prompt_ids, eos_id=eos_id, pad_id=pad_id, **sampling)
    resp = [r if len(r) else np.array([eos_id], np.int32) for r in resp]
    return assemble(
        prompt_ids, resp, pad_id=pad_id, meta={"sampled_by": "run policy at checkpoint"}
    )
