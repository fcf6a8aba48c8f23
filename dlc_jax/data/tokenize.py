"""Prompt tokenization with the model's HF tokenizer (loaded from the model directory, offline).

Token ids are produced once here and then travel unchanged trainer -> sampler -> trainer; nothing
downstream re-tokenizes text.
"""

from __future__ import annotations

import numpy as np


def load_tokenizer(model_dir: str):
    """The HF fast tokenizer stored in ``model_dir`` (``tokenizer.json`` + config), no network."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - rewrap with the path that failed
        raise ValueError(f"cannot load a tokenizer from model dir {model_dir!r}: {e}") from e


def chatml(prompt: str, system: str | None = None) -> str:
    """The ChatML text of a single user turn followed by the assistant header (Qwen3 format)."""
    out = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return out + f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


def encode_prompt(tokenizer, prompt: str, *, chat_template: bool = False, system: str | None = None) -> np.ndarray:
    """Token ids [P] (int32) of ``prompt``; wrapped in ChatML first when ``chat_template``."""
    text = chatml(prompt, system) if chat_template else prompt
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) == 0:
        raise ValueError(f"prompt {prompt!r} tokenized to zero tokens")
    return np.asarray(ids, dtype=np.int32)
