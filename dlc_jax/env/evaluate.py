"""Held-out evaluation of ``env.fn`` episodes: one episode per eval row through its own
`EnvSampler` in front of the training sampler (counters apart from the run's ``env/*`` totals);
``eval/accuracy`` is the share of episodes with reward >= ``eval.correct_min``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dlc_jax.env.chat_delta import ChatDelta
from dlc_jax.env.config import EnvConfig
from dlc_jax.env.protocol import load_env_factory
from dlc_jax.env.runner import EnvSampler
from dlc_jax.sampler.wire.types import SamplingParams


class EnvEvaluator:
    """rows: the data rows of the eval prompts (``prompt``, ``answer``, ``row``, extra columns, as
    `dlc_jax.env.runner.env_row` makes them); correct_min: the reward that counts as right."""

    def __init__(
        self,
        cfg: EnvConfig,
        tokenizer: Any,
        rows: list[dict],
        *,
        max_model_len: int,
        correct_min: float,
        enable_thinking: bool = True,
    ) -> None:
        if not rows:
            raise ValueError("eval.n: no eval rows for env.fn episodes")
        self.cfg, self.rows, self.correct_min = cfg, list(rows), float(correct_min)
        self.factory = load_env_factory(cfg.fn, cfg.kwargs)
        self.delta = ChatDelta.for_env(cfg, tokenizer, enable_thinking=enable_thinking)
        self.max_model_len = int(max_model_len)

    def run(self, client: Any, params: SamplingParams, request_id: str) -> dict[str, float]:
        """One episode per row through ``client`` (a Sampler); ``eval/*`` metrics."""
        n = len(self.rows)
        env = EnvSampler(
            lambda: client,
            self.factory,
            self.delta,
            self.cfg,
            max_model_len=self.max_model_len,
            row_fn=self.rows.__getitem__,
        )
        rewards, turns, gen = np.zeros(n), np.zeros(n), np.zeros(n)
        versions: list[int] = []
        seen = 0
        for r in env.generate([[] for _ in range(n)], params, list(range(n)), request_id):
            i, ep = int(r.slot_id), r.episode or {}
            rewards[i], turns[i] = r.reward, ep.get("turns", 0)
            gen[i] = float(r.generated_mask().sum())
            versions += [v for v, _, _ in r.version_spans]
            seen += 1
        if seen != n:
            raise RuntimeError(f"eval: {seen} episodes ended for {n} rows")
        totals = env.totals()
        return {
            "eval/accuracy": float(np.mean(rewards >= self.correct_min)),
            "eval/reward_mean": float(np.mean(rewards)),
            "eval/turns": float(np.mean(turns)),
            "eval/response_len": float(np.mean(gen)),
            "eval/env_errors": float(totals.get("env/errors", 0.0)),
            "eval/version": float(min(versions)) if versions else -1.0,
        }


def make_env_evaluator(
    cfg: Any, tokenizer: Any, records: list[Any]
) -> Callable[[Any, SamplingParams, str], dict[str, float]] | None:
    """The `EnvEvaluator.run` of ``cfg`` for the eval ``records``, or None without ``env.fn``."""
    if not cfg.env.enabled:
        return None
    from dlc_jax.env.runner import env_row

    ev = EnvEvaluator(
        cfg.env,
        tokenizer,
        [env_row(r) for r in records],
        max_model_len=cfg.sampler.max_model_len,
        correct_min=cfg.eval.correct_min,
        enable_thinking=cfg.data.enable_thinking,
    )
    return ev.run
