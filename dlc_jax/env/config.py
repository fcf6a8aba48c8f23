"""The ``env`` config section: which environment drives multi-turn episodes, and their limits.

``env.fn`` empty (the default) keeps the single-turn path: one sampler call per prompt, scored by
the ``reward`` functions. Set, every rollout is an episode of that environment (`EnvSampler`).
"""

from __future__ import annotations

import dataclasses
from typing import Literal


@dataclasses.dataclass
class EnvConfig:
    """fn: ``package.module:Name`` of a class (or factory) called with no arguments per episode,
    '' = single-turn. kwargs: keyword arguments passed to it. max_turns: sampler calls per episode.
    max_total_tokens: prompt + all turns of an episode (0 = sampler.max_model_len).
    max_env_tokens_per_turn: tokens of one environment answer; a longer one is cut on
    ``truncation_side`` ('left' keeps its end, 'right' its start; the chat template's own tokens
    around the content are never cut) or, with 'error', ends the episode (reason
    ``env_oversized``). on_prefix_break: what a turn whose tokens do not extend the episode's
    history exactly does: 'error' stops the run, 'split' goes on from the sampler's own
    tokens as a new sequence in the same training row (both parts token-exact and trained;
    counted in ``env/splits``; when the row would outgrow ``max_total_tokens`` the episode ends
    at the break instead, reason ``prefix_break``). reward: 'sum' of the turn rewards or the
    'last' one.
    timeout_s: one reset / step call; a call that runs longer ends its episode (``env_timeout``).
    workers: environment calls (reset, step, close) run at once per sampler request.
    allow_special_tokens: message contents may hold the tokenizer's control tokens (an
    environment that must emit them); by default a control token's text in a message is encoded
    as plain text, counted in ``env/escaped_special_tokens`` (docs/ENVIRONMENTS.md).
    """

    fn: str = ""
    kwargs: dict = dataclasses.field(default_factory=dict)
    max_turns: int = 4
    max_total_tokens: int = 0
    max_env_tokens_per_turn: int = 64
    truncation_side: Literal["left", "right", "error"] = "left"
    on_prefix_break: Literal["error", "split"] = "error"
    reward: Literal["sum", "last"] = "sum"
    timeout_s: float = 10.0
    workers: int = 64
    allow_special_tokens: bool = False

    def __post_init__(self):
        if self.max_turns < 1:
            raise ValueError(f"EnvConfig.max_turns: must be >= 1, got {self.max_turns}")
        if self.max_total_tokens < 0:
            raise ValueError(
                f"EnvConfig.max_total_tokens: must be >= 0, got {self.max_total_tokens}"
            )
        if self.max_env_tokens_per_turn < 1:
            raise ValueError(
                "EnvConfig.max_env_tokens_per_turn: must be >= 1, got "
                f"{self.max_env_tokens_per_turn}"
            )
        if self.truncation_side not in ("left", "right", "error"):
            raise ValueError(
                f"EnvConfig.truncation_side: must be 'left', 'right' or 'error', got "
                f"{self.truncation_side!r}"
            )
        if self.on_prefix_break not in ("error", "split"):
            raise ValueError(
                "EnvConfig.on_prefix_break: must be 'error' or 'split', got "
                f"{self.on_prefix_break!r}"
            )
        if self.reward not in ("sum", "last"):
            raise ValueError(f"EnvConfig.reward: must be 'sum' or 'last', got {self.reward!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"EnvConfig.timeout_s: must be > 0, got {self.timeout_s}")
        if self.workers < 1:
            raise ValueError(f"EnvConfig.workers: must be >= 1, got {self.workers}")
        if self.fn and ":" not in self.fn:
            raise ValueError(f"EnvConfig.fn: expected 'package.module:Name', got {self.fn!r}")

    @property
    def enabled(self) -> bool:
        return bool(self.fn)
