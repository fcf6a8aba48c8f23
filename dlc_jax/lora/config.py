"""The ``lora`` config section: ``rank > 0`` trains ``delta W = (alpha / rank) * A @ B`` on every
projection matching ``targets`` alone (the base frozen); 0 trains every parameter."""

from __future__ import annotations

import dataclasses

# every attention and MLP projection of a Qwen3 decoder layer (never NEVER_TARGETS)
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
NEVER_TARGETS = ("lm_head", "embed_tokens")
PUSH_MODES = ("auto", "merged", "adapter")


@dataclasses.dataclass
class LoraConfig:
    """targets: comma-separated fnmatch patterns on a projection's name or dotted path; dropout:
    on the adapters' input in training; push: 'merged' (full weights), 'adapter' or 'auto'
    (adapter where the sampler serves the trainer's base); seed: A's init and dropout masks."""

    rank: int = 0
    alpha: float = 32.0
    targets: str = ",".join(DEFAULT_TARGETS)
    dropout: float = 0.0
    push: str = "auto"
    seed: int = 0

    def __post_init__(self):
        if self.rank < 0:
            raise ValueError(f"LoraConfig.rank: must be >= 0 (0 = off), got {self.rank}")
        if not self.alpha > 0:
            raise ValueError(f"LoraConfig.alpha: must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoraConfig.dropout: must be in [0, 1), got {self.dropout}")
        if self.push not in PUSH_MODES:
            raise ValueError(f"LoraConfig.push: must be one of {PUSH_MODES}, got {self.push!r}")
        if not self.patterns:
            raise ValueError("LoraConfig.targets: must name at least one projection pattern")
        for t in self.patterns:
            if any(n in str(t) for n in NEVER_TARGETS):
                raise ValueError(
                    f"LoraConfig.targets: {t!r} names {NEVER_TARGETS}: never adapted (vLLM drops "
                    f"an lm_head delta from prompt log-probs)"
                )

    @property
    def patterns(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in str(self.targets).split(",") if t.strip())

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank if self.rank else 0.0
