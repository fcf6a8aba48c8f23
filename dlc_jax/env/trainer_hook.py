"""What the trainer needs to run ``env.fn`` episodes: the `EnvSampler` in front of its sampler,
and the data row an episode is reset with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dlc_jax.env.chat_delta import ChatDelta
from dlc_jax.env.protocol import load_env_factory
from dlc_jax.env.runner import EnvSampler


def env_row(record: Any) -> dict:
    """The row an environment's ``reset`` gets from a `PromptRecord`: its prompt text, gold
    answer, data row index and extra scalar columns."""
    return {
        **dict(record.metadata),
        "prompt": record.prompt,
        "answer": record.answer,
        "row": record.row,
    }


def make_env_sampler(cfg: Any, tokenizer: Any, inner_fn: Callable[[], Any]) -> EnvSampler | None:
    """The `EnvSampler` of ``cfg.env`` (None when ``env.fn`` is empty); the trainer gives it the
    rows of each batch it opens (`EnvSampler.add_rows`)."""
    if not cfg.env.enabled:
        return None
    factory = load_env_factory(cfg.env.fn, cfg.env.kwargs)
    delta = ChatDelta.for_env(cfg.env, tokenizer, enable_thinking=cfg.data.enable_thinking)
    return EnvSampler(inner_fn, factory, delta, cfg.env, max_model_len=cfg.sampler.max_model_len)
