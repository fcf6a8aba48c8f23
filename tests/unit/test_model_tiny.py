"""make_tiny: the directory loads in transformers (model + tokenizer), is deterministic, and the
tokenizer has the ChatML specials and splits arithmetic into single digits."""

import json

import numpy as np
import pytest

from dlc_jax.model.tiny import CHATML_TEMPLATE, cli, make_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny") / "m", seed=0)


def test_layout_and_config(tiny):
    names = {p.name for p in tiny.iterdir()}
    for f in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        assert f in names, f
    cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["vocab_size"] == 2048
    assert (
        cfg["hidden_size"],
        cfg["num_hidden_layers"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
    ) == (128, 2, 2, 32)
    assert cfg["tie_word_embeddings"] is False
    assert cfg["eos_token_id"] == 2047


def test_tokenizer_chatml_and_digits(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    assert len(tok) == 2048
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2047
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>"]) == [2045, 2046]
    text = tok.apply_chat_template(
        [{"role": "user", "content": "12+7=?"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\n12+7=?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text)["input_ids"]
    assert ids[0] == 2046 and ids[-5] == 2047
    assert tok.decode(ids) == text
    pieces = [tok.decode([i]) for i in tok("12+7=19")["input_ids"]]
    assert pieces == ["1", "2", "+", "7", "=", "1", "9"]
    assert tok.chat_template == CHATML_TEMPLATE


def test_loads_in_transformers_and_deterministic(tiny, tmp_path):
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    with torch.no_grad():
        logits = model(torch.tensor([[2046, 16, 17, 10, 22]])).logits
    assert logits.shape == (1, 5, 2048) and torch.isfinite(logits).all()
    # Same seed -> identical weights (through the CLI); different seed -> different weights.
    assert cli([str(tmp_path / "again"), "--seed", "0"]) == 0
    a, b = (
        load_file(tiny / "model.safetensors"),
        load_file(tmp_path / "again" / "model.safetensors"),
    )
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    c = load_file(
        make_tiny(tmp_path / "other", seed=1, tie_word_embeddings=True) / "model.safetensors"
    )
    assert "lm_head.weight" not in c
    assert not np.array_equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
