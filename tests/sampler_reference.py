"""fp32 trainer-side reference for checking a sampler: processed logprobs of given tokens under
given weights, computed with transformers (independent of both sampler backends) and the
trainer's own sampling transform (`dlc_jax.rl.sampling.processed_logits`).

Used by the sampler tests; imports torch/transformers lazily.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def load_hf_reference(model_dir: str, weights: Mapping[str, np.ndarray] | None = None):
    """transformers Qwen3ForCausalLM in fp32 from `model_dir`, optionally with replaced weights."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if weights is not None:
        sd = {k: torch.from_numpy(np.asarray(v, np.float32).copy()) for k, v in weights.items()}
        missing, unexpected = model.load_state_dict(sd, strict=False)
        if unexpected:
            raise KeyError(f"reference model has no tensors {unexpected[:3]}")
    return model.eval()


def processed_logprobs(
    model, prompt_ids, response_ids, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """-> (lp [T] of each response token, full processed log-prob rows [T, V]; -inf off-support).
    temperature == 0 (greedy) -> plain log_softmax(logits)."""
    import jax
    import jax.numpy as jnp
    import torch

    from dlc_jax.rl.sampling import processed_logits

    ids = list(prompt_ids) + list(response_ids)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
    p = len(prompt_ids)
    rows = jnp.asarray(logits[p - 1 : len(ids) - 1])  # [T, V] predicting the response tokens
    if temperature == 0:
        lp_rows = jax.nn.log_softmax(rows, axis=-1)
    else:
        z, mask = processed_logits(rows, temperature=temperature, top_k=top_k, top_p=top_p)
        if mask is not None:
            z = jnp.where(mask, z, -jnp.inf)
        lp_rows = jax.nn.log_softmax(z, axis=-1)
    lp_rows = np.asarray(lp_rows)
    lp = lp_rows[np.arange(len(response_ids)), np.asarray(response_ids)]
    return lp, lp_rows
