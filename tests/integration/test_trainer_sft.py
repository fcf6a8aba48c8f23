"""SFT warm-up: example alignment (hand-checked) and the config-hash cache."""

import json

import numpy as np
import pytest

from dlc_jax.data.arithmetic import ArithmeticConfig, ArithmeticSource
from dlc_jax.trainer.sft import sft_examples


class CharTok:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def test_sft_examples_mask_answer_and_eos_only():
    src = ArithmeticSource(ArithmeticConfig(digits=1, num_examples=4), seed=0)
    ex = src[0]
    b = sft_examples(src, CharTok(), 3, [0], seq_len=12, chat_template=False)
    seq = [ord(c) for c in ex["prompt"] + ex["answer"]] + [3]
    n, p = len(seq), len(ex["prompt"])
    np.testing.assert_array_equal(b["input_ids"][0, :n], seq)
    np.testing.assert_array_equal(b["targets"][0, : n - 1], seq[1:])
    # loss on the positions that predict the answer characters and eos
    assert b["mask"][0].tolist() == [0.0] * (p - 1) + [1.0] * (n - p) + [0.0] * (12 - n + 1)
    assert (
        "".join(chr(t) for t, m in zip(b["targets"][0], b["mask"][0]) if m and t != 3)
        == ex["answer"]
    )
    with pytest.raises(ValueError, match="seq_len"):
        sft_examples(src, CharTok(), 3, [0], seq_len=3, chat_template=False)


@pytest.mark.slow
def test_sft_trains_and_is_cached(tmp_path):
    from dlc_jax.model.tiny import make_tiny
    from dlc_jax.trainer.config import default_config_path, load_config
    from dlc_jax.trainer.sft import ensure_sft_model

    tiny = make_tiny(tmp_path / "tiny", hidden_size=64, intermediate_size=128, head_dim=16)
    cfg = load_config(
        default_config_path(),
        [
            f"model.path={tiny}",
            "sft.steps=30",
            "sft.batch_size=16",
            f"sft.cache_dir={tmp_path}/cache",
        ],
    )
    logs = []
    out = ensure_sft_model(cfg, log=logs.append)
    info = json.loads((out / "sft.json").read_text())
    assert info["loss_last"] < 0.5 * info["loss_first"]
    assert (out / "tokenizer.json").exists() and (out / "config.json").exists()
    from dlc_jax.model import load_hf

    load_hf(str(out))  # a loadable HF dir
    logs.clear()
    assert ensure_sft_model(cfg, log=logs.append) == out and any("reusing" in line for line in logs)
    other = load_config(
        default_config_path(),
        [f"model.path={tiny}", "sft.steps=31", f"sft.cache_dir={tmp_path}/cache"],
    )
    from dlc_jax.trainer.sft import sft_cache_dir

    assert sft_cache_dir(other) != out  # keyed by the config hash
