"""The ``env`` config section: which environment drives multi-turn episodes, and their limits."""

from __future__ import annotations

import dataclasses
from typing import Literal


@dataclasses.dataclass
class EnvConfig:
    """The ``env`` keys (docs/ENVIRONMENTS.md). fn: ``package.module:Name`` called with
    ``kwargs`` per episode ('' = single-turn). max_total_tokens: prompt + all turns (0 =
    sampler.max_model_len). max_env_tokens_per_turn: a longer answer is cut on
    ``truncation_side`` or ends the episode ('error'). on_prefix_break: 'error' stops the run,
    'split' goes on as a new sequence in the same row. timeout_s: one environment call."""

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
        sides = ("left", "right", "error")
        rules = (
            ("max_turns", lambda v: v >= 1, ">= 1"),
            ("max_total_tokens", lambda v: v >= 0, ">= 0"),
            ("max_env_tokens_per_turn", lambda v: v >= 1, ">= 1"),
            ("truncation_side", sides.__contains__, "'left', 'right' or 'error'"),
            ("on_prefix_break", ("error", "split").__contains__, "'error' or 'split'"),
            ("reward", ("sum", "last").__contains__, "'sum' or 'last'"),
            ("timeout_s", lambda v: v > 0, "> 0"),
            ("workers", lambda v: v >= 1, ">= 1"),
        )
        for name, ok, req in rules:
            if not ok(v := getattr(self, name)):
                raise ValueError(f"EnvConfig.{name}: must be {req}, got {v!r}")
        if self.fn and ":" not in self.fn:
            raise ValueError(f"EnvConfig.fn: expected 'package.module:Name', got {self.fn!r}")

    @property
    def enabled(self) -> bool:
        return bool(self.fn)
