"""PEFT layout of the adapters: W_hf + (alpha / r) * lora_B @ lora_A is the merged model's HF
weight, for looped and scanned layers."""

import json

import jax
import numpy as np
import pytest
from flax import nnx
from model_helpers import LORA_DIMS

from dlc_jax.lora import LoraConfig, LoraParam, apply_lora, merged_model
from dlc_jax.lora.export import adapter_bytes, peft_tensors, save_peft
from dlc_jax.model.config import Qwen3Config
from dlc_jax.model.hf_io import iter_hf_tensors
from dlc_jax.model.qwen3 import Qwen3ForCausalLM

DIMS = dict(LORA_DIMS, tie_word_embeddings=True)  # the tied variant: export shares the head


@pytest.mark.parametrize("scan", [False, True])
def test_peft_factors_rebuild_the_merged_hf_weights(scan, tmp_path):
    m = Qwen3ForCausalLM(Qwen3Config(**DIMS, scan_layers=scan), rngs=nnx.Rngs(0))
    cfg = LoraConfig(rank=3, alpha=6.0)
    apply_lora(m, cfg)
    for i, (_, v) in enumerate(nnx.to_flat_state(nnx.state(m, LoraParam))):
        x = v.get_value()
        v.set_value(0.3 * jax.random.normal(jax.random.key(i), x.shape, x.dtype))
    base = dict(iter_hf_tensors(m))  # the adapters are not HF tensors: the base weights
    merged = dict(iter_hf_tensors(merged_model(m)))
    peft = dict(peft_tensors(m))
    assert len(peft) == 2 * 7 * DIMS["num_hidden_layers"]
    for name in base:
        a = peft.get(f"base_model.model.{name[: -len('.weight')]}.lora_A.weight")
        if a is None:
            np.testing.assert_array_equal(merged[name], base[name])  # not adapted
            continue
        b = peft[f"base_model.model.{name[: -len('.weight')]}.lora_B.weight"]
        assert a.shape == (3, base[name].shape[1]) and b.shape == (base[name].shape[0], 3)
        np.testing.assert_allclose(merged[name], base[name] + 2.0 * b @ a, atol=1e-5)
    out = save_peft(m, cfg, tmp_path / "adapter", base="BASE")
    conf = json.loads((out / "adapter_config.json").read_text())
    assert conf["r"] == 3 and conf["lora_alpha"] == 6.0 and "lm_head" not in conf["target_modules"]
    assert sorted(conf["target_modules"]) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    from safetensors.numpy import load_file

    saved = load_file(str(out / "adapter_model.safetensors"))
    assert set(saved) == set(peft)
    assert adapter_bytes(m) == sum(x.nbytes for x in saved.values())
