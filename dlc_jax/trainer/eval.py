"""Held-out evaluation: the first ``eval.n`` prompts of the ``eval`` source through the training
sampler, scored by the training rewards (with ``env.fn``: episodes, `dlc_jax.env.evaluate`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from typing import Any

import numpy as np

from dlc_jax.data.prompts import DataConfig, load_data
from dlc_jax.data.tokenize import count_prompt_tokens, encode_prompt
from dlc_jax.env.evaluate import make_env_evaluator
from dlc_jax.sampler.wire.types import SamplingParams
from dlc_jax.trainer.batch_requests import SEEDED_BACKENDS
from dlc_jax.trainer.step_inputs import decode, score_texts

logger = logging.getLogger(__name__)


def eval_data_config(data: DataConfig, ev) -> DataConfig:
    """The ``data`` section with the eval source / subset / split, unshuffled, one pass."""
    return dataclasses.replace(
        data,
        source=ev.source or data.source,
        subset=ev.subset if ev.source else data.subset,
        split=ev.split,
        shuffle=False,
        epochs=1,
    )


class Evaluator:
    """``run(client, step)`` -> ``eval/*`` metrics (``eval/version``: the sampler's, may trail)."""

    def __init__(self, cfg, tokenizer, eos_id: int, rewards):
        self.cfg, self.ev, self.rewards, self.eos_id = cfg, cfg.eval, rewards, eos_id
        self.tokenizer = tokenizer
        data = eval_data_config(cfg.data, cfg.eval)
        render: dict[str, Any] = dict(
            chat_template=data.chat_template,
            system=data.system or None,
            enable_thinking=data.enable_thinking,
        )
        self.max_tokens = cfg.eval.max_tokens or cfg.sampler.max_tokens
        try:
            examples, stats = load_data(
                data,
                answer_check=rewards.check_answers,
                max_prompt_tokens=cfg.sampler.max_model_len - self.max_tokens,
                count_tokens=lambda prompts: count_prompt_tokens(tokenizer, prompts, **render),
            )
        except ValueError as e:  # the source's errors name data.*: here they are eval.*'s
            raise type(e)(re.sub(r"data\.(source|split|subset)", r"eval.\1", str(e))) from None
        self.examples = examples[: cfg.eval.n]
        if not self.examples:
            raise ValueError(f"eval.source: no usable prompt in {data.source!r} ({stats})")
        self.prompt_ids = [encode_prompt(tokenizer, e.prompt, **render) for e in self.examples]
        self.env_run = make_env_evaluator(cfg, tokenizer, self.examples)
        logger.info(
            "eval: %d prompts of %s (split %s) every %d steps, temperature %g",
            len(self.examples),
            data.source,
            data.split,
            cfg.eval.every,
            cfg.eval.temperature,
        )

    def run(self, client, step: int) -> dict[str, float]:
        t0 = time.time()
        params = SamplingParams(  # one sample, no top-k/top-p truncation, no head
            max_tokens=self.max_tokens,
            temperature=self.ev.temperature,
            stop_token_ids=(self.eos_id,),
            seed=step if self.cfg.sampler.backend in SEEDED_BACKENDS else None,
        )
        if self.env_run is not None:
            out = self.env_run(client, params, f"eval-{step}")
            return {**out, "eval/seconds": time.time() - t0}
        texts = [""] * len(self.examples)
        lens = np.zeros(len(self.examples))
        versions = []
        for r in client.generate(self.prompt_ids, params, request_id=f"eval-{step}"):
            texts[r.slot_id] = decode(self.tokenizer, r)
            lens[r.slot_id] = len(r.response_ids)
            versions += [v for v, _, _ in r.version_spans]
        ids = [f"eval-{step}/{i}" for i in range(len(texts))]
        rewards, _ = score_texts(self.rewards, self.examples, texts, ids)
        return {
            "eval/accuracy": float(np.mean(rewards >= self.ev.correct_min)),
            "eval/reward_mean": float(np.mean(rewards)),
            "eval/response_len": float(lens.mean()),
            "eval/version": float(min(versions)) if versions else -1.0,
            "eval/seconds": time.time() - t0,
        }
