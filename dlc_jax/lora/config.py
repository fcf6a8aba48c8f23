"""The ``lora`` section of the training config (LoRA RL: adapter-only training). ``lora.rank = 0``
trains every parameter; ``rank > 0`` adds ``delta W = (alpha / rank) * A @ B`` to every projection
matching ``targets`` and trains only the adapters (the base is frozen: no gradient, no optimizer
state, not in snapshots or checkpoints).
"""

from __future__ import annotations

import dataclasses

# every attention and MLP projection of a Qwen3 decoder layer; never lm_head (vLLM drops an lm_head
# delta from prompt log-probs) nor the embedding
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
NEVER_TARGETS = ("lm_head", "embed_tokens")
PUSH_MODES = ("auto", "merged", "adapter")


@dataclasses.dataclass
class LoraConfig:
    """rank: adapter rank (0 = off); alpha: scale = alpha / rank; targets: comma-separated
    fnmatch patterns on a projection's last name or dotted path; dropout: on the adapters' input
    in the training forward (``lora.dropout``); push: 'merged' (base + delta as a full model),
    'adapter' (the adapters alone, ``lora.push``) or 'auto' (adapter where the sampler serves
    adapters of the trainer's base, else merged; the start log says which); seed: A's init and
    the dropout masks."""

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
