"""Prompt rendering and tokenization with the model's HF tokenizer: with ``chat_template`` by its
chat template (ChatML when it has none), the content encoded as text (control tokens counted, never
matched); without, as is. Token ids are made once here, never re-tokenized downstream."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import TypedDict, Unpack

import numpy as np

from dlc_jax.data.text_tokens import encode_chat

# Tokenizer classes loaded directly when AutoTokenizer would pick them (no remote code, a Qwen
# model type): importing AutoTokenizer pulls in every model's config module (~4 CPU-s).
_DIRECT_CLASSES = {
    "PreTrainedTokenizerFast": ("transformers.tokenization_utils_tokenizers", "TokenizersBackend"),
    "TokenizersBackend": ("transformers.tokenization_utils_tokenizers", "TokenizersBackend"),
    "Qwen2Tokenizer": ("transformers.models.qwen2.tokenization_qwen2", "Qwen2Tokenizer"),
    "Qwen2TokenizerFast": ("transformers.models.qwen2.tokenization_qwen2", "Qwen2Tokenizer"),
}
_DIRECT_MODEL_TYPES = ("qwen2", "qwen3", "qwen3_moe")


def _direct_tokenizer_class(model_dir: str):
    """The class AutoTokenizer would pick for ``model_dir`` when it is one of `_DIRECT_CLASSES`
    (named by tokenizer_config.json, no ``auto_map``, a Qwen model type), else None."""
    d = Path(model_dir)
    try:
        tok_cfg = json.loads((d / "tokenizer_config.json").read_text())
        model_type = json.loads((d / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None
    name = tok_cfg.get("tokenizer_class") if isinstance(tok_cfg, dict) else None
    if (
        "auto_map" in tok_cfg
        or model_type not in _DIRECT_MODEL_TYPES
        or name not in _DIRECT_CLASSES
        or not (d / "tokenizer.json").is_file()
    ):
        return None
    module, cls = _DIRECT_CLASSES[name]
    return getattr(importlib.import_module(module), cls)


def load_tokenizer(model_dir: str):
    """The HF fast tokenizer in ``model_dir``, offline, skipping AutoTokenizer where it can."""
    try:
        cls = _direct_tokenizer_class(str(model_dir))
        if cls is None:
            from transformers import AutoTokenizer as cls  # type: ignore[no-redef]
        return cls.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - rewrap with the path that failed
        raise ValueError(f"cannot load a tokenizer from model dir {model_dir!r}: {e}") from e


def chatml(prompt: str, system: str | None = None) -> str:
    """The ChatML text of a single user turn followed by the assistant header (Qwen3 format)."""
    out = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return out + f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


class PromptFormat(TypedDict, total=False):
    """How a prompt is rendered: `render_prompt`'s keywords (defaults there)."""

    chat_template: bool
    system: str | None
    enable_thinking: bool


def _render(tokenizer, messages: list[dict], enable_thinking: bool) -> str:
    if not (
        getattr(tokenizer, "chat_template", None) and hasattr(tokenizer, "apply_chat_template")
    ):
        system = messages[0]["content"] if len(messages) > 1 else None
        return chatml(messages[-1]["content"], system)
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
    )


def _chat(tokenizer, prompt: str, fmt: PromptFormat):
    """(render(messages) -> text, messages) of ``prompt``; None without ``chat_template``."""
    if not fmt.get("chat_template", False):
        return None
    system, thinking = fmt.get("system"), fmt.get("enable_thinking", True)
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    return (lambda m: _render(tokenizer, m, thinking)), messages


def render_prompt(tokenizer, prompt: str, **fmt: Unpack[PromptFormat]) -> str:
    """The text the model sees for ``prompt`` (module doc)."""
    chat = _chat(tokenizer, prompt, fmt)
    return prompt if chat is None else chat[0](chat[1])


def encode_prompt_counted(
    tokenizer, prompt: str, **fmt: Unpack[PromptFormat]
) -> tuple[np.ndarray, int]:
    """(token ids [P] int32 of the rendered ``prompt``, control tokens of it kept as text)."""
    chat = _chat(tokenizer, prompt, fmt)
    if chat is not None:
        ids, escaped = encode_chat(tokenizer, *chat)
    else:
        ids, escaped = tokenizer.encode(prompt, add_special_tokens=False), 0
    if len(ids) == 0:
        raise ValueError(f"prompt {prompt!r} tokenized to zero tokens")
    return np.asarray(ids, dtype=np.int32), escaped


def encode_prompt(tokenizer, prompt: str, **fmt: Unpack[PromptFormat]) -> np.ndarray:
    """Token ids [P] (int32) of the rendered ``prompt``."""
    return encode_prompt_counted(tokenizer, prompt, **fmt)[0]


def count_prompt_tokens(tokenizer, prompts: list[str], **fmt: Unpack[PromptFormat]) -> list[int]:
    """Token count of each rendered prompt as `encode_prompt` encodes it (batched for HF)."""
    from dlc_jax.data.text_tokens import count_control

    if fmt.get("chat_template") and any(count_control(tokenizer, p) for p in prompts):
        return [len(encode_prompt(tokenizer, p, **fmt)) for p in prompts]
    texts = [render_prompt(tokenizer, p, **fmt) for p in prompts]
    if callable(tokenizer) and hasattr(tokenizer, "batch_decode"):
        out: list[int] = []
        for i in range(0, len(texts), 1024):
            ids = tokenizer(texts[i : i + 1024], add_special_tokens=False)["input_ids"]
            out.extend(len(x) for x in ids)
        return out
    return [len(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
