"""The ``lora`` section of the training config (LoRA RL: adapter-only training).

``lora.rank = 0`` (the default) trains every parameter (full fine-tuning); ``rank > 0`` adds a
rank-``rank`` adapter ``delta W = (alpha / rank) * A @ B`` to every projection whose module path
matches one of ``targets`` and trains only the adapters (the base weights are frozen: no gradient,
no optimizer state, not in the theta_s snapshots or checkpoints).
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
    """rank: adapter rank (0 = off: full fine-tuning); alpha: the scale is alpha / rank;
    targets: comma-separated module-name patterns (fnmatch) matched against a projection's last
    name or its dotted path (``model.layers.3.mlp.down_proj``); dropout: probability of dropping
    an element of an adapter's input in the training forward (``dlc_jax.lora.dropout``; 0 = off;
    never in the theta_s forward or the sampler); push: 'merged' = the sampler receives base +
    delta as a full model through the usual weight push, 'adapter' = it receives the adapters
    alone (PEFT names) and serves base + delta itself (``dlc_jax.lora.push``), 'auto' = adapter
    where the sampler declares it serves adapters and serves the trainer's base, else merged
    (``dlc_jax.lora.push.choose_push``; the trainer's start log says which and why); seed: the
    adapters' initialization (A random, B zero: the delta starts at 0) and the dropout masks."""

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
