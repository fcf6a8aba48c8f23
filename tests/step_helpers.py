"""Shared helpers for the train-step and batching tests: a packed batch of random rollouts (host
arrays), and one rollout with fixed values."""

from __future__ import annotations

import numpy as np

from dlc_jax.sampler.wire.types import Rollout
from dlc_jax.trainer.batching import pack_rollouts


def random_step_batch(vocab: int, b: int = 8, k: int = 4, seed: int = 0) -> dict:
    """``b`` rollouts (2 samples per slot) with random prompts, a random top-``k`` sampler head
    whose first entry is the sampled token, random advantages, packed to 16 tokens; theta_s
    log-probs zero and every token the trainer's own (``self_mask``)."""
    rng = np.random.default_rng(seed)
    rolls = []
    for i in range(b):
        p, t = 3 + i % 3, 2 + (i * 5) % 5
        lq = np.log(rng.dirichlet(np.ones(k + 1), size=t)[:, :k]).astype(np.float32)
        head = rng.choice(vocab, size=(t, k), replace=True).astype(np.int32)
        rolls.append(
            Rollout(
                prompt_ids=rng.integers(0, vocab, p).astype(np.int32),
                response_ids=head[:, 0].copy(),
                logprobs=lq[:, 0].copy(),
                head_ids=head,
                head_logprobs=lq,
                finish_reason="length",
                version_spans=[(0, 0, t)],
                slot_id=i // 2,
                sample_index=i % 2,
            )
        )
    arr = pack_rollouts(rolls, seq_len=16, head_k=k).arrays()
    arr.update(
        adv=rng.normal(size=b).astype(np.float32),
        lp_s=np.zeros_like(arr["lp_q"]),
        lps_head=np.zeros_like(arr["lq_head"]),
        self_mask=np.ones(arr["mask"].shape, bool),
    )
    return arr


def fixed_rollout(prompt, response, slot=0, g=0, k=2) -> Rollout:
    """A rollout with the given prompt and response ids, fixed log-probs (-0.1 * position) and a
    top-``k`` head that repeats the sampled token, one version span (version 3)."""
    t = len(response)
    return Rollout(
        prompt_ids=np.array(prompt, np.int32),
        response_ids=np.array(response, np.int32),
        logprobs=-0.1 * np.arange(1, t + 1, dtype=np.float32),
        head_ids=np.tile(np.array(response, np.int32)[:, None], (1, k)),
        head_logprobs=-np.ones((t, k), np.float32),
        finish_reason="stop",
        version_spans=[(3, 0, t)],
        slot_id=slot,
        sample_index=g,
    )
