"""The model-family registry: dense Qwen3 dispatch, refusal of unknown architectures."""

from __future__ import annotations

import pytest

from dlc_jax.model import PRESETS, Qwen3Config, Qwen3ForCausalLM, UnsupportedModelError
from dlc_jax.model.hf_io import hf_param_shapes
from dlc_jax.model.registry import config_from_hf, family_for_hf, family_of
from dlc_jax.plan.flops import layer_matmul_params, model_matmul_params


def test_dense_qwen3_dispatch():
    cfg = PRESETS["Qwen3-0.6B"]
    fam = family_of(cfg)
    assert fam.model_type == "qwen3" and fam.model_cls is Qwen3ForCausalLM
    assert family_for_hf(cfg.to_hf_dict()) is fam
    assert family_for_hf({"architectures": ["Qwen3ForCausalLM"]}) is fam
    again = config_from_hf(cfg.to_hf_dict(), scan_layers=True)
    assert isinstance(again, Qwen3Config) and again == cfg.replace(scan_layers=True)
    names = hf_param_shapes(cfg)
    assert len(names) == 2 + 11 * cfg.num_hidden_layers  # embed, norm (tied: no lm_head)


def test_dense_counts_unchanged():
    """The per-layer count is the q, k, v, o projections and the 3 MLP ones (as before)."""
    c = PRESETS["Qwen3-8B"]
    d, f, h, kv, hd = 4096, 12288, 32, 8, 128
    per = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f
    assert layer_matmul_params(c) == per
    mm = model_matmul_params(c)
    assert mm == {"decoder": 36 * per, "down": 36 * d * f, "vocab": 151936 * d}


def test_unknown_architecture_refused():
    with pytest.raises(UnsupportedModelError, match="LlamaForCausalLM"):
        family_for_hf({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
