"""KL between two policies on the reference prefixes: each policy is evaluated once (final hidden
states at the prefix positions and ``model.unembedding()``), then any pair gives the exact KL both
ways (:mod:`dlc_jax.experiments.kl`)."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from dlc_jax.experiments.kl import KLSums, kl_on_positions
from dlc_jax.experiments.prefixes import PrefixSet


@dataclasses.dataclass
class PolicyOnPrefixes:
    """hidden: float32 [P, D] at the prefix positions (row-major); unembed: float32 [V, D]."""

    hidden: np.ndarray
    unembed: np.ndarray

    def save(self, path) -> None:
        np.savez(path, hidden=self.hidden, unembed=self.unembed)

    @classmethod
    def load(cls, path) -> PolicyOnPrefixes:
        with np.load(path) as z:
            return cls(hidden=z["hidden"], unembed=z["unembed"])


@functools.lru_cache(maxsize=1)
def _hidden_fn():
    """One jitted function for every evaluation (a new one per call would re-compile)."""
    from flax import nnx

    @nnx.jit
    def hidden(model, ids, mask):
        return model.hidden_states(ids, attention_mask=mask)

    return hidden


def evaluate_policy(model, prefixes: PrefixSet, *, batch_size: int = 16) -> PolicyOnPrefixes:
    """Run ``model`` over the prefix set in fixed-size batches and keep the prefix positions."""
    import jax.numpy as jnp

    hidden_fn = _hidden_fn()
    tokens, attn, pmask = prefixes.tokens, prefixes.attention_mask, prefixes.prefix_mask
    n = tokens.shape[0]
    bs = max(1, min(batch_size, n))
    rows = []
    for start in range(0, n, bs):
        ids, am = tokens[start : start + bs], attn[start : start + bs]
        real = ids.shape[0]
        if real < bs:  # pad the last batch so the jitted function keeps one shape
            ids = np.concatenate(
                [ids, np.full((bs - real, ids.shape[1]), prefixes.pad_id, ids.dtype)]
            )
            am = np.concatenate([am, np.zeros((bs - real, am.shape[1]), am.dtype)])
            am[real:, 0] = 1  # never feed an all-masked row (softmax over nothing)
        h = np.asarray(hidden_fn(model, jnp.asarray(ids), jnp.asarray(am)), np.float32)[:real]
        rows.append(h[pmask[start : start + real] > 0])
    unembed = np.asarray(model.unembedding(), np.float32)
    return PolicyOnPrefixes(hidden=np.concatenate(rows, 0), unembed=unembed)


def prefix_kl(
    a: PolicyOnPrefixes,
    b: PolicyOnPrefixes,
    *,
    temperature: float = 1.0,
    chunk_size: int = 256,
    block: int = 4096,
) -> dict[str, float]:
    """KL_P(a || b) ("forward"), KL_P(b || a) ("reverse"), their mean and the prefix count."""
    if a.hidden.shape != b.hidden.shape:
        raise ValueError(
            f"policies evaluated on different prefix sets: hidden {a.hidden.shape} vs "
            f"{b.hidden.shape}"
        )
    kw = dict(temperature=temperature, chunk_size=chunk_size)
    total = KLSums(0.0, 0.0, 0.0)
    block = max(chunk_size, (block // chunk_size) * chunk_size)
    for s in range(0, a.hidden.shape[0], block):  # host-side blocks bound the jitted shapes
        ha, hb = a.hidden[s : s + block], b.hidden[s : s + block]
        total += kl_on_positions(ha, hb, a.unembed, b.unembed, np.ones(len(ha), np.float32), **kw)
    return total.means()
