"""HF tensor names/shapes and matmul parameter counts of the Qwen3 families (dense and MoE: one
function each, a dense layer being a layer that is not sparse; registered in `registry.py`)."""

from __future__ import annotations


def _attention_shapes(c, p: str) -> dict[str, tuple[int, ...]]:
    d, hd = c.hidden_size, c.head_dim
    return {
        p + "input_layernorm.weight": (d,),
        p + "self_attn.q_proj.weight": (c.num_attention_heads * hd, d),
        p + "self_attn.k_proj.weight": (c.num_key_value_heads * hd, d),
        p + "self_attn.v_proj.weight": (c.num_key_value_heads * hd, d),
        p + "self_attn.o_proj.weight": (d, c.num_attention_heads * hd),
        p + "self_attn.q_norm.weight": (hd,),
        p + "self_attn.k_norm.weight": (hd,),
        p + "post_attention_layernorm.weight": (d,),
    }


def _mlp_shapes(p: str, d: int, f: int) -> dict[str, tuple[int, ...]]:
    return {
        p + "gate_proj.weight": (f, d),
        p + "up_proj.weight": (f, d),
        p + "down_proj.weight": (d, f),
    }


def qwen3_param_shapes(c) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> HF shape, in checkpoint order (no lm_head.weight when tied). A sparse
    layer's MLP is `mlp.gate.weight` [E, D] and `mlp.experts.{e}.{gate,up,down}_proj.weight`."""
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size)}
    d = c.hidden_size
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        out.update(_attention_shapes(c, p))
        if c.is_sparse(i):
            out[p + "mlp.gate.weight"] = (c.num_experts, d)
            for e in range(c.num_experts):
                out.update(_mlp_shapes(p + f"mlp.experts.{e}.", d, c.moe_intermediate_size))
        else:
            out.update(_mlp_shapes(p + "mlp.", d, c.intermediate_size))
    out["model.norm.weight"] = (d,)
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (c.vocab_size, d)
    return out


def _attention_params(c) -> int:
    d, h, kv, hd = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    return d * h * hd + 2 * d * kv * hd + h * hd * d


def qwen3_matmul_params(c, *, active: bool = True) -> dict[str, int]:
    """Matmul parameters over all layers; a sparse layer: router + top-k (`active`) or E experts."""
    d = c.hidden_size
    experts = getattr(c, "num_experts_per_tok" if active else "num_experts", 0)
    decoder = down = 0
    for i in range(c.num_hidden_layers):
        decoder += _attention_params(c)
        if c.is_sparse(i):
            decoder += d * c.num_experts + experts * 3 * d * c.moe_intermediate_size
            down += experts * d * c.moe_intermediate_size
        else:
            decoder += 3 * d * c.intermediate_size
            down += d * c.intermediate_size
    return {"decoder": decoder, "down": down, "vocab": c.vocab_size * d}
