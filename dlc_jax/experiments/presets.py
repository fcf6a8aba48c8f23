"""Experiment presets: which arms, which scenarios, how long, and the base training config.

An *arm* is a correction (a ``dlc_jax.rl.LOSSES`` name plus options) with its resync rule; a
*scenario* is the sampler condition (sync schedule and weight perturbation). Every run of a preset
uses the same base config (model, data order, optimizer, batch) and differs only in the fields the
arm and scenario set, so the comparison is controlled.
"""

from __future__ import annotations

import dataclasses

from dlc_jax.experiments.prefixes import PrefixConfig
from dlc_jax.data.arithmetic import ArithmeticConfig


@dataclasses.dataclass(frozen=True)
class Arm:
    """loss: LOSSES key; options: extra LossConfig fields; own_resync: the arm's resync policy
    (DLC's ESS trigger) overriding the scenario's schedule, or None to follow the scenario."""

    name: str
    loss: str
    options: tuple[tuple[str, object], ...] = ()
    own_resync: str | None = None


@dataclasses.dataclass(frozen=True)
class Scenario:
    """sync: 'every_k' | 'never' (the stale sampler's schedule; k = sync_k);
    quantization: sampler weight quantization ('' = none; 'int8' on the JAX backend,
    'fp8_per_channel' on vLLM); weight_noise: std of Gaussian noise on the sampler's weights, relative
    to each tensor's RMS (0 = none)."""

    name: str
    sync: str = "every_k"
    sync_k: int = 4
    quantization: str = ""
    weight_noise: float = 0.0


ARMS: dict[str, Arm] = {a.name: a for a in (
    Arm("naive", "naive"),
    Arm("tis", "tis"),
    Arm("mis", "mis"),
    Arm("score_centering", "score_centering"),
    Arm("score_centering_tis", "score_centering_tis"),
    Arm("ppo_clip", "ppo_clip", options=(("old_policy", "sampler"),)),  # clip vs the sampler (bypass)
    Arm("decoupled_ppo", "decoupled_ppo"),
    Arm("m2po", "m2po"),
    Arm("vcpo", "vcpo"),
    Arm("dlc", "dlc", own_resync="ess"),
    Arm("dlc_noresync", "dlc"),
)}


@dataclasses.dataclass(frozen=True)
class ExperimentPreset:
    """base_config: YAML path relative to the repo root (or absolute); overrides: ``key=value`` applied
    to every run; steps / checkpoint_every: run length and the fixed checkpoint steps (the KL is
    measured at every checkpoint); onpolicy_seeds: ``train.seed`` of the two on-policy runs (the arms
    use the first); kl_temperature: temperature of the KL (the sampling temperature)."""

    name: str
    base_config: str
    arms: tuple[str, ...]
    scenarios: tuple[Scenario, ...]
    steps: int
    checkpoint_every: int
    overrides: tuple[str, ...] = ()
    onpolicy_seeds: tuple[int, int] = (0, 1)
    prefixes: PrefixConfig = dataclasses.field(default_factory=PrefixConfig)
    kl_temperature: float = 1.0
    kl_chunk_size: int = 256
    eval_batch_size: int = 16
    notes: tuple[str, ...] = ()

    def __post_init__(self):
        bad = [a for a in self.arms if a not in ARMS]
        if bad:
            raise ValueError(f"preset {self.name}: unknown arms {bad} (known: {sorted(ARMS)})")
        if self.checkpoint_every < 1 or self.steps < self.checkpoint_every:
            raise ValueError(f"preset {self.name}: need 1 <= checkpoint_every <= steps, got "
                             f"{self.checkpoint_every}, {self.steps}")

    def scenario(self, name: str) -> Scenario:
        for s in self.scenarios:
            if s.name == name:
                return s
        raise KeyError(f"preset {self.name}: no scenario {name!r} (have {[s.name for s in self.scenarios]})")


ALL_ARMS = tuple(ARMS)

TINY = ExperimentPreset(
    name="tiny",
    base_config="configs/tiny_cpu.yaml",
    # Measured on 2 shared CPU cores (load average 7-17 from other jobs): ~25-60 s per 40-step run with the
    # persistent compile cache warm (~115 s cold), +~10 s of KL evaluation; the full matrix (2 on-policy
    # runs + 11 arms x 4 scenarios, DLC shared by the two stale scenarios = 45 trainings) took ~41 minutes.
    arms=ALL_ARMS,
    scenarios=(
        Scenario("stale_k4", sync="every_k", sync_k=4),
        Scenario("stale_never", sync="never"),
        Scenario("quant_int8", sync="every_k", sync_k=4, quantization="int8"),
        Scenario("noise", sync="every_k", sync_k=4, weight_noise=0.05),
    ),
    steps=40,
    checkpoint_every=8,
    overrides=("sampler.backend=jax", "log.tensorboard=false", "log.progress=false", "sampler.head_k=8"),
    prefixes=PrefixConfig(num_prompts=32, max_tokens=4, arithmetic=ArithmeticConfig(digits=1, operators="+",
                                                                                    num_examples=100)),
    notes=("tiny preset: all 11 arms x 4 scenarios, 40 steps per run (8 prompts x 8 samples, lr 1e-3, "
           "tiny SFT-warmed Qwen3 on 1-digit addition), 32 reference prompts x <= 4 response tokens = the "
           "reference prefixes; the on-policy pair is shared by all scenarios.",),
)

QWEN3_0P6B = ExperimentPreset(
    name="qwen3_0p6b",
    base_config="configs/qwen3_0p6b_dlc.yaml",
    arms=ALL_ARMS,
    scenarios=(
        Scenario("stale_k64", sync="every_k", sync_k=64),
        Scenario("stale_never", sync="never"),
        Scenario("quant_fp8", sync="every_k", sync_k=8, quantization="fp8_per_channel"),
        Scenario("noise", sync="every_k", sync_k=8, weight_noise=0.02),
    ),
    steps=300,
    checkpoint_every=25,
    overrides=("checkpoint.keep=100",),
    prefixes=PrefixConfig(num_prompts=128, max_tokens=512, chat_template=True, source="/data/gsm8k/test.parquet",
                          prompt_field="question", answer_field="answer",
                          system="Reason step by step and end with '#### <answer>'."),
    eval_batch_size=16,
)

QWEN3_1P7B = dataclasses.replace(QWEN3_0P6B, name="qwen3_1p7b", base_config="configs/qwen3_1p7b_dlc.yaml",
                                 eval_batch_size=8)

PRESETS: dict[str, ExperimentPreset] = {p.name: p for p in (TINY, QWEN3_0P6B, QWEN3_1P7B)}
