"""Shared helpers for the test_model_*.py files (unit and integration): random HF Qwen3
directories and a transformers reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# The LoRA tests' tiny untied Qwen3 (adapters on every projection; small enough for many steps).
LORA_DIMS = dict(
    vocab_size=61,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    tie_word_embeddings=False,
)
# The multi-host tests' tiny Qwen3 (2 layers, GQA 2; shards over 2 processes x 4 devices).
MULTIHOST_DIMS = dict(
    hidden_size=32,
    intermediate_size=64,
    head_dim=8,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
)
# Two odd random configs: tied with GQA 3, untied with GQA 4 (no tokenizer needed).
CONFIG_TIED = dict(
    vocab_size=301,
    hidden_size=96,
    intermediate_size=200,
    num_hidden_layers=3,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=24,
    tie_word_embeddings=True,
    rope_theta=10000.0,
)
CONFIG_UNTIED = dict(
    vocab_size=257,
    hidden_size=64,
    intermediate_size=136,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=16,
    tie_word_embeddings=False,
    rope_theta=1_000_000.0,
)


def make_random_hf_dir(path, *, seed=0, noise=0.1, **cfg) -> Path:
    """Random transformers Qwen3 saved to `path` (fp32). Every tensor (norms too) gets extra
    N(0, noise) so parity tests exercise non-trivial norm weights and non-uniform logits."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    c = Qwen3Config(max_position_embeddings=512, rms_norm_eps=1e-6, **cfg)
    c.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(seed)
    m = Qwen3ForCausalLM(c).to(torch.float32).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(noise * torch.randn_like(p))
    path = Path(path)
    m.save_pretrained(path)
    return path


def hf_logits(path_or_model, ids, mask=None, positions=None) -> np.ndarray:
    """fp32 transformers logits [B,T,V] with explicit position_ids (HF does not derive them from
    the mask)."""
    import torch
    from transformers import AutoModelForCausalLM

    m = path_or_model
    if not hasattr(m, "forward"):
        m = AutoModelForCausalLM.from_pretrained(path_or_model, dtype=torch.float32).eval()
    ids = np.asarray(ids)
    mask = np.ones(ids.shape, np.int64) if mask is None else np.asarray(mask, np.int64)
    if positions is None:
        positions = np.maximum(mask.cumsum(-1) - 1, 0)
    with torch.no_grad():
        out = m(
            torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            position_ids=torch.tensor(np.asarray(positions)),
        )
    return out.logits.float().numpy()


def padded_batch(vocab: int, seed: int = 0):
    """(ids [4,11], mask): row 0 left-padded by 3, row 1 right-padded by 4, row 2 full, row 3 a
    single real token at the end."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, vocab, (4, 11))
    mask = np.ones((4, 11), np.int64)
    mask[0, :3] = 0
    mask[1, -4:] = 0
    mask[3, :10] = 0
    ids[mask == 0] = 0
    return ids, mask


def _fwd(m, ids, mask, positions, segment_ids):
    return m(ids, mask, positions, segment_ids)


_jit_fwd = None


def jit_forward(model, ids, mask=None, positions=None, segment_ids=None) -> np.ndarray:
    """model(ids, mask, positions, segment_ids) under nnx.jit (much cheaper than eager op-by-op on
    CPU)."""
    global _jit_fwd
    if _jit_fwd is None:
        from flax import nnx

        _jit_fwd = nnx.jit(_fwd)
    return np.asarray(_jit_fwd(model, ids, mask, positions, segment_ids))
