"""Naive reference for the chunked token log-probs (test-only): materializes [B,T,V] logits
and follows vLLM's positional top-k/top-p algorithm (ascending sort, mask sorted positions,
scatter back) rather than the threshold form of ``dlc_jax.rl.sampling``. Tiny vocabularies only."""

import jax
import jax.numpy as jnp

from dlc_jax.rl.logprobs import OUT_OF_SUPPORT_LOGPROB, TokenLogprobs


def reference_token_logprobs(
    hidden,
    unembed,
    targets,
    *,
    head_ids=None,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    out_of_support=OUT_OF_SUPPORT_LOGPROB,
):
    """TokenLogprobs of ``targets`` (and ``head_ids``) from the full processed softmax."""
    logits = (
        jnp.einsum(
            "btd,vd->btv",
            hidden.astype(jnp.float32),
            unembed.astype(jnp.float32),
            precision=jax.lax.Precision.HIGHEST,
        )
        / temperature
    )
    vocab = logits.shape[-1]
    order = jnp.argsort(logits, axis=-1)  # ascending
    srt = jnp.take_along_axis(logits, order, axis=-1)
    if 0 < top_k < vocab:
        kth = srt[..., vocab - top_k][..., None]
        srt = jnp.where(srt < kth, -jnp.inf, srt)
    if top_p < 1.0:
        cum = jnp.cumsum(jax.nn.softmax(srt, axis=-1), axis=-1)
        rm = (cum <= 1 - top_p).at[..., -1].set(False)
        srt = jnp.where(rm, -jnp.inf, srt)
    inv = jnp.argsort(order, axis=-1)
    masked = jnp.take_along_axis(srt, inv, axis=-1)
    logp = jax.nn.log_softmax(masked, axis=-1)
    logp = jnp.where(jnp.isfinite(logp), logp, out_of_support)
    lp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    lp_head = None if head_ids is None else jnp.take_along_axis(logp, head_ids, axis=-1)
    pr = jax.nn.softmax(masked, axis=-1)
    ent = -jnp.sum(jnp.where(pr > 0, pr * jnp.log(jnp.where(pr > 0, pr, 1.0)), 0.0), axis=-1)
    return TokenLogprobs(lp=lp, lp_head=lp_head, entropy=ent)
