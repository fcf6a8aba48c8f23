"""Token-budget packing (segment ids, per-token advantages) gives the unpacked DLC loss and
gradients through a real tiny Qwen3 forward and backward: a whole compiled model program, so it
lives in the integration tier (the packing layout is hand-checked in the unit tier's
test_trainer_batching.py)."""

import numpy as np

from dlc_jax.sampler.wire.types import Rollout
from dlc_jax.trainer.batching import step_arrays


def test_packed_rows_give_the_unpacked_loss_and_grads():
    """The same 12 rollouts, one per row vs token-budget packed (segment ids, per-token advantages):
    the DLC loss, every gradient and the per-token log-probs agree to ~1e-5 on a tiny Qwen3, with
    2 scanned micro-batches each."""
    import jax
    from flax import nnx

    from dlc_jax.model import Qwen3Config, Qwen3ForCausalLM
    from dlc_jax.rl import LossConfig
    from dlc_jax.trainer.step import StepConfig, accumulate_grads, device_batch

    cfg = Qwen3Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=False,
    )
    graphdef, params = nnx.split(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    rng = np.random.default_rng(0)
    k = 3
    rs = []
    for i in range(12):
        p, t = 2 + i % 4, 3 + (i * 5) % 7
        lq = np.log(rng.dirichlet(np.ones(k + 1), size=t)[:, :k]).astype(np.float32)
        head = rng.choice(97, size=(t, k), replace=False).astype(np.int32)
        rs.append(
            Rollout(
                prompt_ids=rng.integers(0, 97, p).astype(np.int32),
                response_ids=head[:, 0].copy(),
                logprobs=lq[:, 0].copy(),
                head_ids=head,
                head_logprobs=lq,
                finish_reason="stop",
                version_spans=[(0, 0, t)],
                slot_id=i // 4,
                sample_index=i % 4,
            )
        )
    adv = rng.normal(size=12).astype(np.float32)
    scfg = StepConfig(loss=LossConfig(name="dlc"), head_k=k, micro_batches=2)

    def run(arrays):
        arrays = dict(
            arrays,
            lp_s=np.zeros_like(arrays["lp_q"]),
            lps_head=np.zeros_like(arrays["lq_head"]),
            self_mask=np.ones(arrays["mask"].shape, bool),
        )
        fn = jax.jit(lambda prm, b: accumulate_grads(prm, graphdef, b, scfg))
        return arrays, fn(params, device_batch(arrays))

    ua, (ug, ulm, ulp, *_) = run(step_arrays(rs, adv, seq_len=16, head_k=k))
    pa, (pg, plm, plp, *_) = run(
        step_arrays(rs, adv, seq_len=32, head_k=k, pack=True, row_multiple=2)
    )
    assert pa["input_ids"].shape[0] < ua["input_ids"].shape[0] / 2  # 12 rows -> 4 packed rows
    assert float(np.sum(pa["mask"])) == float(np.sum(ua["mask"]))
    np.testing.assert_allclose(float(plm["loss"]), float(ulm["loss"]), rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(pg), jax.tree.leaves(ug)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # per-token log-probs: gather each rollout's masked tokens from both layouts
    for i in range(12):
        u_tok = np.asarray(ulp)[i][ua["mask"][i] > 0]
        sel = (pa["seq_index"] == i) & (pa["mask"] > 0)
        np.testing.assert_allclose(np.asarray(plp)[sel], u_tok, rtol=1e-5, atol=1e-6)
