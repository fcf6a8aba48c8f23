"""An environment's demonstrations (``demonstration(row) -> [completion of each turn]``) played as
token-exact episodes, with an episode's guards: the warm-up data of a tool task, which a random
tiny model never solves. Training loop: `dlc_jax.trainer.sft.ensure_env_sft_model`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from dlc_jax.env.chat_delta import ChatDelta, TemplateError
from dlc_jax.env.config import EnvConfig
from dlc_jax.env.history import History
from dlc_jax.env.protocol import (
    EnvConfigError,
    EnvTimeout,
    check_step,
    close_env,
    load_env_factory,
    open_env,
    timed_call,
)

logger = logging.getLogger(__name__)


class NoDemonstrationError(EnvConfigError):
    """The environment offers no demonstrations (or none played): the warm-up cannot run."""


def demo_sequence(
    factory: Callable[[], Any], row: dict, delta: ChatDelta, timeout: float = 10.0
) -> History:
    """The token-exact episode of the environment's demonstration for ``row``."""
    env = timed_call(factory, (), timeout)
    demo = getattr(env, "demonstration", None)
    if not callable(demo):
        raise NoDemonstrationError(
            f"sft.enabled with env.fn: {type(env).__name__} has no demonstration(row) method; "
            "set sft.enabled=false or give model.path"
        )
    hist = History(open_env(env, row, delta, timeout), 0)
    turns = timed_call(demo, (row,), timeout)
    if not isinstance(turns, (list, tuple)) or not all(isinstance(t, str) for t in turns):
        raise ValueError(f"demonstration(): expected a list of strings, got {turns!r:.100}")
    for i, text in enumerate(turns):
        hist.response += delta.encode(text) + [delta.eos_id]
        hist.mask += [1.0] * (len(hist.response) - len(hist.mask))
        msgs, _, done = check_step(timed_call(env.step, (text,), timeout))
        if done or i == len(turns) - 1:
            break
        hist.add_env(delta.answer(msgs))
    close_env(env, timeout)
    return hist


def demonstrations(
    cfg: EnvConfig, tokenizer: Any, rows: list[dict], *, enable_thinking: bool = True
) -> tuple[list[History], dict[str, float]]:
    """(the demonstration sequences of ``rows``, counters ``env/warmup_*``); failing ones are left
    out and counted, none played is a `NoDemonstrationError`."""
    factory = load_env_factory(cfg.fn, cfg.kwargs)
    delta = ChatDelta.for_env(cfg, tokenizer, enable_thinking=enable_thinking)
    hists: list[History] = []
    counts = dict.fromkeys(("env/warmup_demonstrations", "env/warmup_errors"), 0.0)
    counts["env/warmup_timeouts"] = 0.0
    last = ""
    for row in rows:
        try:
            hists.append(demo_sequence(factory, row, delta, cfg.timeout_s))
        except (NoDemonstrationError, TemplateError):
            raise
        except EnvTimeout as e:
            counts["env/warmup_timeouts"] += 1
            last = str(e)
        except Exception as e:  # noqa: BLE001 - an environment's failure drops its demonstration
            counts["env/warmup_errors"] += 1
            last = f"{type(e).__name__}: {e}"[:200]
        if counts["env/warmup_timeouts"] >= 3 and not hists:
            break  # an environment that hangs on every call: do not wait timeout_s per row
    counts["env/warmup_demonstrations"] = float(len(hists))
    counts["env/escaped_special_tokens"] = float(delta.escaped)
    if not hists:
        raise NoDemonstrationError(
            f"sft.enabled with env.fn: no demonstration of {cfg.fn} could be played "
            f"({int(counts['env/warmup_errors'])} failed, "
            f"{int(counts['env/warmup_timeouts'])} ran past env.timeout_s={cfg.timeout_s:g}); "
            f"last: {last}"
        )
    if counts["env/warmup_errors"] or counts["env/warmup_timeouts"]:
        logger.warning("env warm-up: demonstrations left out: %s; last: %s", counts, last)
    return hists, counts


def demo_batch(hists: list[History], seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """``input_ids`` / ``targets`` int32 and ``mask`` float32 (1: generated target) [N, seq_len]."""
    n = len(hists)
    ids, tgt = np.full((2, n, seq_len), pad_id, np.int32)
    mask = np.zeros((n, seq_len), np.float32)
    for i, h in enumerate(hists):
        seq = np.asarray(h.tokens, np.int32)
        if len(seq) > seq_len:
            raise ValueError(f"demonstration of {len(seq)} tokens > sampler.max_model_len")
        p = len(h.prompt)
        ids[i, : len(seq)] = seq
        tgt[i, : len(seq) - 1] = seq[1:]
        mask[i, p - 1 : len(seq) - 1] = np.asarray(h.mask, np.float32)
    return {"input_ids": ids, "targets": tgt, "mask": mask}
