"""Sample completions of a training step for the logs (``log.samples_every``): prompt, response,
reward and a per-token summary of log p - log q = delta + ell (delta = log p_s - log q, ell = log p
- log p_s; ``dlc_jax.rl.decomposition``).
"""

from __future__ import annotations

import numpy as np


def token_summary(lp, lp_s, lp_q, mask) -> dict[str, float]:
    """delta/ell mean and largest magnitude over one response's tokens (host arrays [T])."""
    m = np.asarray(mask) > 0
    if not m.any():
        return {}
    delta = (np.asarray(lp_s) - np.asarray(lp_q))[m]
    ell = (np.asarray(lp) - np.asarray(lp_s))[m]
    return {
        "delta_mean": float(delta.mean()),
        "delta_abs_max": float(np.abs(delta).max()),
        "ell_mean": float(ell.mean()),
        "ell_abs_max": float(np.abs(ell).max()),
        "logprob_q_mean": float(np.asarray(lp_q)[m].mean()),
    }


def sample_records(
    rollouts: list,
    prompts: dict,
    texts: list[str],
    rewards: np.ndarray,
    per_token: dict | None,
    n: int,
) -> list[dict]:
    """Records of the first ``n`` rollouts (one per group first, so different prompts show).

    per_token: host arrays ``lp``, ``lp_s``, ``lp_q``, ``mask`` [rows, L] with row i = rollout i
    (None = no per-token summary, e.g. packed rows)."""
    order = sorted(range(len(rollouts)), key=lambda i: (rollouts[i].sample_index, i))[:n]
    out = []
    for i in order:
        r = rollouts[i]
        rec = {
            "slot": int(r.slot_id),
            "sample": int(r.sample_index),
            "prompt": prompts[r.slot_id].prompt,
            "answer": prompts[r.slot_id].answer,
            "response": texts[i],
            "reward": float(rewards[i]),
            "tokens": int(len(r.response_ids)),
            "versions": sorted({int(v) for v, _, _ in r.version_spans}),
        }
        if per_token is not None:
            rec.update(token_summary(*(per_token[k][i] for k in ("lp", "lp_s", "lp_q", "mask"))))
        out.append(rec)
    return out


__all__ = ["sample_records", "token_summary"]
