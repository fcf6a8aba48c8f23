"""Shared helpers for the Qwen3-MoE tests: random HF Qwen3-MoE directories (no tokenizer)."""

from __future__ import annotations

from pathlib import Path

# all layers sparse, renormalized top-k, GQA 2
MOE_UNIFORM = dict(
    vocab_size=211,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=24,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    tie_word_embeddings=False,
    rope_theta=10000.0,
)
# layer 0 dense (mlp_only_layers), layer 1 sparse, layer 2 dense (decoder_sparse_step 2), tied,
# top-k weights not renormalized
MOE_MIXED = dict(
    vocab_size=173,
    hidden_size=48,
    intermediate_size=80,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=8,
    num_experts=6,
    num_experts_per_tok=3,
    norm_topk_prob=False,
    decoder_sparse_step=2,
    mlp_only_layers=[0],
    tie_word_embeddings=True,
    rope_theta=1_000_000.0,
)


def make_random_moe_dir(path, *, seed=0, noise=0.1, **cfg) -> Path:
    """Random transformers Qwen3MoeForCausalLM saved to `path` (fp32, per-expert HF names), every
    tensor with extra N(0, noise) (non-trivial norms and routers)."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    c = Qwen3MoeConfig(max_position_embeddings=512, rms_norm_eps=1e-6, **cfg)
    c.architectures = ["Qwen3MoeForCausalLM"]
    torch.manual_seed(seed)
    m = Qwen3MoeForCausalLM(c).to(torch.float32).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(noise * torch.randn_like(p))
    path = Path(path)
    m.save_pretrained(path)
    return path
