"""How far each sampler numerics (``JAX_NUMERICS``, vLLM-CPU bf16) is from the fp32 trainer: mean
and p99 |log p_trainer - log q_sampler| per token at the same weights, teacher-forced on the
reference responses up to the first EOS (``--numerics``; ``numerics.json`` feeds the report)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dlc_jax.experiments.prefixes import PrefixSet

# name -> BackendConfig knobs of the JAX backend; "vllm_cpu_bf16" is vLLM's engine
JAX_NUMERICS: dict[str, dict] = {
    "jax_bf16": {"dtype": "bfloat16"},
    "jax_int8": {"quantization": "int8"},
    "jax_fp8_e4m3": {"quantization": "fp8_e4m3"},
    "jax_fp8_e4m3_bf16": {"quantization": "fp8_e4m3", "dtype": "bfloat16"},
    **{f"noise_{s}": {"weight_noise": s} for s in (0.05, 0.1, 0.2, 0.3)},
}
VLLM_NAME = "vllm_cpu_bf16"


def delta_stats(lp_trainer: np.ndarray, lp_sampler: np.ndarray, mask: np.ndarray) -> dict:
    """Mean and 99th percentile of |lp_trainer - lp_sampler| over the tokens where mask > 0."""
    d = np.abs(np.asarray(lp_trainer, np.float64) - np.asarray(lp_sampler, np.float64))
    d = d[np.asarray(mask) > 0]
    if d.size == 0:
        return {"delta_abs_mean": None, "delta_abs_p99": None, "tokens": 0}
    return {
        "delta_abs_mean": round(float(d.mean()), 6),
        "delta_abs_p99": round(float(np.percentile(d, 99)), 6),
        "tokens": int(d.size),
    }


def response_mask(ps: PrefixSet, eos_id: int) -> np.ndarray:
    """The prefix mask cut after each response's first ``eos_id``."""
    mask = ps.prefix_mask.copy()
    for i, (p, n) in enumerate(zip(ps.prompt_lens, ps.response_lens)):
        resp = ps.tokens[i, p : p + n]
        hits = np.flatnonzero(resp == eos_id)
        if hits.size:  # the token at p + k is predicted at position p + k - 1
            mask[i, p + int(hits[0]) :] = 0.0
    return mask


def next_token_logprobs(model, tokens: np.ndarray) -> np.ndarray:
    """[N, L] fp32 log-prob of token t+1 at position t (the last column is 0)."""
    import jax
    import jax.numpy as jnp

    logits = model(jnp.asarray(tokens, jnp.int32)).astype(jnp.float32)
    lp = jax.nn.log_softmax(logits, axis=-1)
    nxt = jnp.asarray(tokens[:, 1:], jnp.int32)
    got = jnp.take_along_axis(lp[:, :-1], nxt[..., None], axis=-1)[..., 0]
    return np.concatenate([np.asarray(got), np.zeros((tokens.shape[0], 1), np.float32)], axis=1)


def jax_sampler_model(model_dir: str, knobs: dict):
    """The JAX sampler backend's model for ``knobs`` (weights transformed as a served push)."""
    from flax import nnx

    from dlc_jax.sampler.backends.base import BackendConfig
    from dlc_jax.sampler.backends.jax_backend import JaxBackend

    backend = JaxBackend(BackendConfig(model_dir=model_dir, **knobs))
    graphdef, state = backend.load_weights_dir(model_dir)
    return nnx.merge(graphdef, state)


def vllm_logprobs(model_dir: str, ps: PrefixSet) -> np.ndarray:
    """[N, L] vLLM-CPU (bfloat16) prompt log-probs laid out like ``next_token_logprobs``."""
    import gc

    import vllm

    llm = vllm.LLM(
        model=model_dir,
        dtype="bfloat16",
        enforce_eager=True,
        max_model_len=int(ps.tokens.shape[1]) + 8,
        seed=0,
        gpu_memory_utilization=0.1,
    )
    try:
        lens = ps.prompt_lens + ps.response_lens
        seqs = [[int(t) for t in row[:n]] for row, n in zip(ps.tokens, lens)]
        params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        res = llm.generate([vllm.TokensPrompt(prompt_token_ids=s) for s in seqs], params)
    finally:
        del llm
        gc.collect()
    out = np.zeros(ps.tokens.shape, np.float32)
    for i, (seq, r) in enumerate(zip(seqs, res)):
        for t in range(1, len(seq)):  # prompt_logprobs[t]: log q(seq[t] | seq[:t])
            out[i, t - 1] = r.prompt_logprobs[t][seq[t]].logprob
    return out


def measure_numerics(
    model_dir: str, ps: PrefixSet, names: list[str] | None = None, *, log=print
) -> dict[str, dict]:
    """``{NAME: delta_stats}`` (or ``{error}`` where it cannot run) for ``names``, vLLM last."""
    from dlc_jax.model import load_hf

    names = names or [*JAX_NUMERICS, VLLM_NAME]
    eos = json.loads((Path(model_dir) / "config.json").read_text()).get("eos_token_id")
    mask = response_mask(ps, int(eos)) if isinstance(eos, int) else ps.prefix_mask
    ref = next_token_logprobs(load_hf(model_dir), ps.tokens)
    out: dict[str, dict] = {}
    for name in names:
        if name == VLLM_NAME:
            try:
                lq = vllm_logprobs(model_dir, ps)
            except Exception as e:  # noqa: BLE001 -- recorded: vLLM may not run on this host
                out[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                log(f"numerics {name}: not measured ({out[name]['error']})")
                continue
        else:
            lq = next_token_logprobs(jax_sampler_model(model_dir, JAX_NUMERICS[name]), ps.tokens)
        out[name] = delta_stats(ref, lq, mask)
        log(f"numerics {name}: {out[name]}")
    return out


def write_numerics(out_dir: str | Path, numerics: dict[str, dict]) -> Path:
    """``numerics.json`` and ``numerics.md`` (the table) under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "numerics.json").write_text(json.dumps(numerics, indent=1) + "\n")
    lines = ["| numerics | mean abs delta | p99 abs delta | tokens |", "|---|---|---|---|"]
    for name, v in numerics.items():
        if "error" in v:
            lines.append(f"| {name} | not measured: {v['error']} | — | — |")
            continue
        lines.append(
            f"| {name} | {v['delta_abs_mean']:.4f} | {v['delta_abs_p99']:.4f} | {v['tokens']} |"
        )
    (out / "numerics.md").write_text("\n".join(lines) + "\n")
    return out / "numerics.md"
