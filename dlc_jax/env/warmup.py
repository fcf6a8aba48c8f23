"""Supervised warm-up on an environment's demonstrations (``sft.enabled`` with ``env.fn``).

A random tiny model never writes a tool call, so RL on a tool task needs a warm-up, as the
single-turn default does. An environment class may offer ``demonstration(row) -> [completion of
each turn]`` (an expert); each demonstration is played through a fresh environment exactly as an
episode is (opening tokens, each completion + end-of-turn, each answer's token delta), and
cross-entropy is trained on the generated tokens only (the same loss mask as RL). The result is
cached by the model / data / sft / env sections, like `dlc_jax.trainer.sft.ensure_sft_model`.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from dlc_jax.env.chat_delta import ChatDelta
from dlc_jax.env.history import History
from dlc_jax.env.protocol import call_env, check_step, load_env_factory

logger = logging.getLogger(__name__)


def demo_sequence(factory: Callable[[], Any], row: dict, delta: ChatDelta) -> History:
    """The token-exact episode of the environment's own demonstration for ``row``."""
    env = factory()
    demo = getattr(env, "demonstration", None)
    if not callable(demo):
        raise ValueError(
            f"sft.enabled with env.fn: {type(env).__name__} has no demonstration(row) method; "
            "set sft.enabled=false or give model.path"
        )
    hist = History(delta.opening(call_env(env.reset, row), getattr(env, "tools", None)), 0)
    turns = list(demo(row))
    for i, text in enumerate(turns):
        hist.response += delta.encode(text) + [delta.eos_id]
        hist.mask += [1.0] * (len(hist.response) - len(hist.mask))
        msgs, _, done = check_step(call_env(env.step, text))
        if done or i == len(turns) - 1:
            break
        hist.add_env(delta.answer(msgs))
    return hist


def demo_batch(hists: list[History], seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """``input_ids`` / ``targets`` int32 and ``mask`` float32 [N, seq_len] (1 where the target is
    a generated token)."""
    n = len(hists)
    ids = np.full((n, seq_len), pad_id, np.int32)
    tgt = np.full((n, seq_len), pad_id, np.int32)
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


def _rows(cfg) -> list[dict]:
    from dlc_jax.data.answers import extract_gold
    from dlc_jax.data.sources import open_source

    d = cfg.data
    src = open_source(
        d.source, split=d.split, subset=d.subset, arithmetic=d.arithmetic, seed=d.seed
    )
    out = []
    for i in range(min(len(src), 4096)):
        raw = src.row(i)
        out.append(
            {
                **raw,
                "prompt": str(raw[d.prompt_field]),
                "answer": extract_gold(str(raw[d.answer_field]), d.answer_format),
            }
        )
    return out


def ensure_env_sft_model(cfg, *, log: Callable[[str], None] | None = None) -> Path:
    """HF dir of the tiny model warmed on ``env.fn``'s demonstrations (cached)."""
    from dlc_jax.data.tokenize import load_tokenizer
    from dlc_jax.model import load_hf, save_hf
    from dlc_jax.trainer.sft import _TOKENIZER_FILES, base_model_dir, sft_train

    log = log or logger.info
    key = cfg.hash("model", "data", "sft", "env")
    out = Path(cfg.sft.cache_dir) / f"env-sft-{key}"
    if (out / "sft.json").exists():
        log(f"sft: reusing cached environment warm-up {out}")
        return out
    base = base_model_dir(cfg)
    tok = load_tokenizer(str(base))
    delta = ChatDelta(tok, int(tok.eos_token_id), enable_thinking=cfg.data.enable_thinking)
    factory = load_env_factory(cfg.env.fn, cfg.env.kwargs)
    hists = [demo_sequence(factory, r, delta) for r in _rows(cfg)]
    seq_len = max(len(h) for h in hists)
    model = load_hf(str(base))
    rng = np.random.default_rng(cfg.train.seed + 1)

    def batches():
        while True:
            idx = rng.integers(0, len(hists), cfg.sft.batch_size)
            arr = demo_batch([hists[i] for i in idx], seq_len, int(tok.eos_token_id))
            yield {k: jnp.asarray(v) for k, v in arr.items()}

    t0 = time.time()
    losses = sft_train(model, batches(), lr=cfg.sft.lr, steps=cfg.sft.steps, log=log)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_hf(model, tmp)
    for f in _TOKENIZER_FILES:
        if (base / f).exists() and not (tmp / f).exists():
            shutil.copy(base / f, tmp / f)
    info = {
        "base": str(base),
        "env": cfg.env.fn,
        "demonstrations": len(hists),
        "steps": cfg.sft.steps,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "seconds": time.time() - t0,
    }
    (tmp / "sft.json").write_text(json.dumps(info, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    log(f"sft: {cfg.sft.steps} steps on {len(hists)} demonstrations of {cfg.env.fn}; saved {out}")
    return out
