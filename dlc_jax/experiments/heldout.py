"""Held-out accuracy of theta_t from a run's checkpoints (a never-synced sampler's rollout reward is
the initial policy's): near-greedy and sampled answers, seeded by the step only so runs are paired
(docs/experiments/README.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from dlc_jax.experiments.own_prefixes import sample_responses

GREEDY_TEMPERATURE = 1e-4


@dataclasses.dataclass(frozen=True)
class HeldoutConfig:
    """prompts: held-out prompts; samples: sampled answers per prompt; seed: base sampling seed
    (plus the step); every_checkpoint: evaluate every checkpoint, else only the last."""

    prompts: int = 64
    samples: int = 4
    temperature: float = 1.0
    max_tokens: int = 48
    seed: int = 20_000
    every_checkpoint: bool = True

    def __post_init__(self):
        if self.prompts < 1 or self.samples < 1 or self.max_tokens < 1:
            raise ValueError(
                f"heldout: prompts, samples and max_tokens must be >= 1, got {self.prompts}, "
                f"{self.samples}, {self.max_tokens}"
            )
        if self.temperature <= 0:
            raise ValueError(f"heldout.temperature must be > 0, got {self.temperature}")


@dataclasses.dataclass
class HeldoutScore:
    """Accuracy of one policy on the held-out prompts (means of the per-prompt scores)."""

    greedy: float
    sampled: float
    greedy_correct: list[int]
    sampled_correct: list[float]


def score_answers(texts: Sequence[str], answers: Sequence[str]) -> np.ndarray:
    """1.0 where the response's final number is the reference answer's (the training reward)."""
    from dlc_jax.data.rewards import exact_match_reward

    if len(texts) != len(answers):
        raise ValueError(f"{len(texts)} responses for {len(answers)} answers")
    return np.array([float(exact_match_reward(t, a) > 0) for t, a in zip(texts, answers)])


def sampled_answers(model, prompts, decode, *, eos_id: int, **sampling) -> list[str]:
    """One answer per prompt sampled from ``model``, decoded without its eos."""
    outs = sample_responses(model, prompts, eos_id=eos_id, pad_id=eos_id, **sampling)
    return [decode([int(t) for t in o if int(t) != eos_id]) for o in outs]


def heldout_score(
    model,
    prompt_ids: Sequence[np.ndarray],
    answers: Sequence[str],
    decode,
    *,
    eos_id: int,
    cfg: HeldoutConfig,
    step: int,
) -> HeldoutScore:
    """Greedy and sampled accuracy of ``model`` on the first ``cfg.prompts`` prompts."""
    n = min(cfg.prompts, len(prompt_ids))
    if n < 1 or len(answers) < n:
        raise ValueError(f"heldout: need {cfg.prompts} prompts with answers, got {len(answers)}")
    prompts, gold = list(prompt_ids[:n]), list(answers[:n])

    def answers_of(ps, temperature: float, seed: int) -> list[str]:
        kw = dict(max_tokens=cfg.max_tokens, temperature=temperature, seed=seed)
        return sampled_answers(model, ps, decode, eos_id=eos_id, **kw)

    greedy = score_answers(answers_of(prompts, GREEDY_TEMPERATURE, cfg.seed + step), gold)
    sampled_texts = answers_of(prompts * cfg.samples, cfg.temperature, cfg.seed + 1_000 + step)
    per_prompt = score_answers(sampled_texts, gold * cfg.samples).reshape(cfg.samples, n).mean(0)
    return HeldoutScore(
        greedy=float(greedy.mean()),
        sampled=float(per_prompt.mean()),
        greedy_correct=[int(x) for x in greedy],
        sampled_correct=[float(x) for x in per_prompt],
    )
