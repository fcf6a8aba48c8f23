"""Experiment presets: which arms, which scenarios, how long, and the base training config.

An *arm* is a correction (a ``dlc_jax.rl.LOSSES`` name plus options) with its resync rule; a
*scenario* is the sampler condition (sync schedule and weight perturbation). Every run of a preset
uses the same base config (model, data order, optimizer, batch) and differs only in the fields the
arm and scenario set, so the comparison is controlled.
"""

from __future__ import annotations

import dataclasses

from dlc_jax.data.chain_arith import ChainArithConfig
from dlc_jax.experiments.heldout import HeldoutConfig
from dlc_jax.experiments.prefixes import PrefixConfig
from dlc_jax.experiments.warmup import ChainWarmup
from dlc_jax.model.config import shape_kwargs


@dataclasses.dataclass(frozen=True)
class Arm:
    """loss: LOSSES key; options: extra LossConfig fields; own_resync: the arm's resync policy
    (DLC's ESS trigger) overriding the scenario's schedule, or None to follow the scenario;
    extra: other trainer ``key=value`` overrides of the arm (e.g. ``sampler.head_k=0``)."""

    name: str
    loss: str
    options: tuple[tuple[str, object], ...] = ()
    own_resync: str | None = None
    extra: tuple[str, ...] = ()


SCENARIO_KINDS = ("lag", "discrepancy", "both")
SYNCS = ("every_k", "never", "onpolicy")


@dataclasses.dataclass(frozen=True)
class Scenario:
    """sync: 'every_k' | 'never' (the stale sampler's schedule; k = sync_k) | 'onpolicy' (synced
    before every batch, no prefetch: zero lag, for every arm, DLC's own trigger included);
    quantization: sampler weight quantization ('' = none; 'int8' on the JAX backend,
    'fp8_per_channel' on vLLM); dtype: the sampler's compute dtype ('' = the base config's);
    weight_noise: std of Gaussian noise on the sampler's weights, relative to each tensor's RMS
    (0 = none). kind: which error source the scenario has: 'lag' (the sampler computes like the
    trainer but holds old weights), 'discrepancy' (current weights, other numerics) or 'both'."""

    name: str
    sync: str = "every_k"
    sync_k: int = 4
    quantization: str = ""
    weight_noise: float = 0.0
    dtype: str = ""
    kind: str = "both"

    def __post_init__(self):
        if self.sync not in SYNCS:
            raise ValueError(
                f"scenario {self.name}: sync must be one of {SYNCS}, got {self.sync!r}"
            )
        if self.kind not in SCENARIO_KINDS:
            raise ValueError(
                f"scenario {self.name}: kind must be one of {SCENARIO_KINDS}, got {self.kind!r}"
            )
        perturbed = bool(self.quantization or self.dtype or self.weight_noise)
        lagged = self.sync != "onpolicy"
        want = {(True, False): "lag", (False, True): "discrepancy", (True, True): "both"}.get(
            (lagged, perturbed)
        )
        if want != self.kind:
            raise ValueError(
                f"scenario {self.name}: sync={self.sync} with perturbation={perturbed} is kind "
                f"{want!r}, not {self.kind!r}"
            )


ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        *(Arm(n, n) for n in ("naive", "tis", "mis", "score_centering", "score_centering_tis")),
        # PPO's clip against the sampler (bypass)
        Arm("ppo_clip", "ppo_clip", options=(("old_policy", "sampler"),)),
        *(Arm(n, n) for n in ("decoupled_ppo", "m2po", "vcpo")),
        Arm("dlc", "dlc", own_resync="ess"),
        # DLC whose trigger reads the sequence lag ESS (resync.statistic=sequence)
        Arm("dlc_seq", "dlc", own_resync="ess", extra=("resync.statistic=sequence",)),
        Arm("dlc_noresync", "dlc"),
        # diagnostic: DLC's lag clip against theta_s alone (no head, so no centering), no resync
        Arm("dlc_nocenter", "dlc", extra=("sampler.head_k=0",)),
        # control: theta_0 frozen (an Adam step of 1e-12 is below the fp32 resolution of the
        # weights): can the 2x band reject a policy that does not learn?
        Arm("frozen", "naive", extra=("optim.lr=1e-12",)),
    )
}


@dataclasses.dataclass(frozen=True)
class ExperimentPreset:
    """base_config: YAML path relative to the repo root (or absolute); overrides: ``key=value``
    applied to every run; steps / checkpoint_every: run length and the fixed checkpoint steps (the
    KL is measured at every checkpoint); onpolicy_seeds: ``train.seed`` of the on-policy runs (>= 2;
    the noise threshold is the mean KL over their pairs); seeds: ``train.seed`` of each arm's runs
    (an arm run with seed s is compared with the on-policy runs of the other seeds, exactly like an
    on-policy pair); kl_temperature: temperature of the KL (the sampling temperature); task: the
    chain-arithmetic warm-up and data the runs use (None: the base config's model and data);
    own_prefix_scenarios: scenarios whose runs are also measured on their own sampled prefixes
    (``own_prefix_prompts`` prompts per checkpoint, see own_prefixes.py); heldout: greedy and
    sampled accuracy of every checkpoint on held-out prompts (heldout.py); more_seeds: seeds run
    only by the arms in more_seed_arms (the arms whose comparisons need more power)."""

    name: str
    base_config: str
    arms: tuple[str, ...]
    scenarios: tuple[Scenario, ...]
    steps: int
    checkpoint_every: int
    overrides: tuple[str, ...] = ()
    onpolicy_seeds: tuple[int, ...] = (0, 1)
    seeds: tuple[int, ...] = (0,)
    task: ChainWarmup | None = None
    own_prefix_scenarios: tuple[str, ...] = ()
    own_prefix_prompts: int = 16
    prefixes: PrefixConfig = dataclasses.field(default_factory=PrefixConfig)
    heldout: HeldoutConfig = dataclasses.field(default_factory=HeldoutConfig)
    more_seeds: tuple[int, ...] = ()
    more_seed_arms: tuple[str, ...] = ()
    kl_temperature: float = 1.0
    kl_chunk_size: int = 256
    eval_batch_size: int = 16
    notes: tuple[str, ...] = ()

    def __post_init__(self):
        bad = [a for a in self.arms if a not in ARMS]
        if bad:
            raise ValueError(f"preset {self.name}: unknown arms {bad} (known: {sorted(ARMS)})")
        if len(set(self.onpolicy_seeds)) < 2 or len(set(self.seeds)) < 1:
            raise ValueError(
                f"preset {self.name}: need >= 2 distinct onpolicy_seeds and >= 1 seed, got "
                f"{self.onpolicy_seeds}, {self.seeds}"
            )
        if self.checkpoint_every < 1 or self.steps < self.checkpoint_every:
            raise ValueError(
                f"preset {self.name}: need 1 <= checkpoint_every <= steps, got "
                f"{self.checkpoint_every}, {self.steps}"
            )

    def scenario(self, name: str) -> Scenario:
        for s in self.scenarios:
            if s.name == name:
                return s
        raise KeyError(
            f"preset {self.name}: no scenario {name!r} (have {[s.name for s in self.scenarios]})"
        )


TINY_STEPS, TINY_CKPT, TINY_LR = 20, 5, 2e-4

# The first CPU matrix (kept to reproduce its committed report, docs/experiments/tiny_v1): 7 arms
# x 3 seeds under one collapse scenario + 3 on-policy runs = 24 trainings. A stale (never synced)
# and int8-quantized sampler, chain-arithmetic answers of ~14-36 tokens. Its on-policy runs lose
# held-out accuracy (the learning rate is too high for the tiny model: see the sweep).
CPU_ARMS = ("naive", "tis", "mis", "ppo_clip", "decoupled_ppo", "dlc", "dlc_noresync")
CHAIN_TASK = ChainWarmup(
    task=ChainArithConfig(min_terms=3, max_terms=5, digits=1, num_examples=2000), steps=300
)
TINY_OVERRIDES = (
    "sampler.backend=jax",
    "log.tensorboard=false",
    "log.progress=false",
    "sampler.head_k=8",
    "sampler.max_tokens=48",
    "sampler.max_model_len=96",
    "sampler.n=8",
)

TINY_V1 = ExperimentPreset(
    name="tiny_v1",
    base_config="configs/tiny_cpu.yaml",
    arms=CPU_ARMS,
    scenarios=(Scenario("collapse", sync="never", quantization="int8"),),
    steps=TINY_STEPS,
    checkpoint_every=TINY_CKPT,
    seeds=(0, 1, 2),
    onpolicy_seeds=(0, 1, 2),
    task=CHAIN_TASK,
    own_prefix_scenarios=("collapse",),
    overrides=TINY_OVERRIDES[:6] + ("train.batch_prompts=8", "sampler.n=8", f"optim.lr={TINY_LR}"),
    prefixes=PrefixConfig(num_prompts=32, max_tokens=48),
    notes=(
        "These runs predate the held-out evaluation and used DLC's first centering term, which "
        "also centered the clipped lag and was fixed afterwards; at this learning rate the "
        "on-policy runs lose held-out accuracy (docs/experiments/README.md, findings 1 and 2).",
    ),
)

# The matrix of issue 19: every source of mismatch on its own, then both; ten arms; 5 seeds for
# the arms the main comparisons need (on-policy, naive, TIS, DLC), 3 for the rest. The learning
# rate / batch are the sweep's (docs/experiments/README.md): at TINY_V1's 2e-4 the on-policy runs
# lose held-out accuracy; at 5e-5 with 32 prompts x 8 samples three on-policy runs raise the
# greedy held-out accuracy by 0.094 [0.016, 0.177] in 20 steps.
TINY_ARMS = (
    "naive",
    "tis",
    "mis",
    "score_centering",
    "ppo_clip",
    "decoupled_ppo",
    "m2po",
    "dlc",
    "dlc_noresync",
)
# One scenario per source and one with both, chosen so that `collapse`'s two sources are exactly
# `lag_never`'s lag and `disc_int8`'s discrepancy: 101 trainings, about 11,000 CPU-s, so the matrix
# fits 150 minutes on 2 cores. The other lag / discrepancy scenarios (sync every 4, bf16 compute,
# weight noise) are the `tiny_more` preset, with the same settings.
TINY_SCENARIOS = (
    Scenario("lag_never", sync="never", kind="lag"),
    Scenario("disc_int8", sync="onpolicy", quantization="int8", kind="discrepancy"),
    Scenario("collapse", sync="never", quantization="int8", kind="both"),
)
TINY_MORE_SCENARIOS = (
    Scenario("lag_k4", sync="every_k", sync_k=4, kind="lag"),
    Scenario("disc_bf16", sync="onpolicy", dtype="bfloat16", kind="discrepancy"),
    Scenario("disc_noise", sync="onpolicy", weight_noise=0.05, kind="discrepancy"),
)

TINY = dataclasses.replace(
    TINY_V1,
    name="tiny",
    arms=TINY_ARMS,
    scenarios=TINY_SCENARIOS,
    seeds=(0, 1, 2),
    onpolicy_seeds=(0, 1, 2, 3, 4),
    more_seeds=(3, 4),
    more_seed_arms=("naive", "tis", "dlc"),
    own_prefix_scenarios=("collapse",),
    overrides=TINY_OVERRIDES + ("train.batch_prompts=32", "optim.lr=5e-05"),
    heldout=HeldoutConfig(every_checkpoint=False),  # the final accuracy; the curve costs 4x
    notes=(),
)
TINY_MORE = dataclasses.replace(TINY, name="tiny_more", scenarios=TINY_MORE_SCENARIOS)

# v3 (issue 32): the pilot's point (docs/experiments/README.md, "pilot"): at 1e-4 with 32 prompts
# x 8 samples for 40 steps the on-policy run still gains held-out accuracy while DLC without
# resync's sequence lag ESS falls below 0.5 (its token ESS stays ~0.97: DLC's clip bounds it).
# Discrepancies of measured size (docs/experiments/numerics): FP8 e4m3 weights 0.0125 mean
# |delta| per token (>= 0.01, bf16-engine size), weight noise 0.2 0.065 (>= 0.05, FP8-rollout
# size). The main preset holds the scenarios that decide the claims; `tiny_v3_more` the others.
V3_OVERRIDES = TINY_OVERRIDES + ("train.batch_prompts=32", "optim.lr=1e-4")
V3_ARMS = TINY_ARMS + ("dlc_seq", "frozen")
V3_SCENARIOS = (
    Scenario("lag_never", sync="never", kind="lag"),
    Scenario("both_noise20", sync="never", weight_noise=0.2, kind="both"),
)
V3_MORE_SCENARIOS = (
    Scenario("disc_fp8", sync="onpolicy", quantization="fp8_e4m3", kind="discrepancy"),
    Scenario("disc_noise20", sync="onpolicy", weight_noise=0.2, kind="discrepancy"),
    Scenario("both_fp8", sync="never", quantization="fp8_e4m3", kind="both"),
    # bounded staleness: synced every k steps (8 = prime-rl's max_off_policy_steps default)
    Scenario("lag_k2", sync="every_k", sync_k=2, kind="lag"),
    Scenario("lag_k4", sync="every_k", sync_k=4, kind="lag"),
    Scenario("lag_k8", sync="every_k", sync_k=8, kind="lag"),
)
TINY_V3 = dataclasses.replace(
    TINY,
    name="tiny_v3",
    arms=V3_ARMS,
    scenarios=V3_SCENARIOS,
    steps=40,
    checkpoint_every=10,
    seeds=(0, 1, 2),
    onpolicy_seeds=(0, 1, 2, 3, 4),
    more_seeds=(3, 4),
    more_seed_arms=("naive", "tis", "mis", "dlc", "dlc_noresync", "dlc_seq"),
    own_prefix_scenarios=("lag_never", "both_noise20"),
    overrides=V3_OVERRIDES,
)
TINY_V3_MORE = dataclasses.replace(
    TINY_V3,
    name="tiny_v3_more",
    arms=("naive", "tis", "mis", "score_centering", "dlc", "dlc_noresync"),
    scenarios=V3_MORE_SCENARIOS,
    more_seeds=(),
    more_seed_arms=(),
    own_prefix_scenarios=(),
)

QWEN3_0P6B = ExperimentPreset(
    name="qwen3_0p6b",
    base_config="configs/qwen3_0p6b_dlc.yaml",
    arms=TINY_ARMS,
    scenarios=(
        Scenario("collapse", sync="never", quantization="fp8_per_channel"),
        Scenario("stale_k64", sync="every_k", sync_k=64, kind="lag"),
        Scenario("quant_fp8", sync="every_k", sync_k=8, quantization="fp8_per_channel"),
        Scenario("noise", sync="every_k", sync_k=8, weight_noise=0.02),
    ),
    steps=300,
    checkpoint_every=25,
    seeds=(0, 1, 2),
    onpolicy_seeds=(0, 1, 2),
    overrides=("checkpoint.keep=100",),
    prefixes=PrefixConfig(
        num_prompts=128,
        max_tokens=512,
        chat_template=True,
        source="/data/gsm8k/test.parquet",
        prompt_field="question",
        answer_field="answer",
        system="Reason step by step and end with '#### <answer>'.",
    ),
    eval_batch_size=16,
)

QWEN3_1P7B = dataclasses.replace(
    QWEN3_0P6B, name="qwen3_1p7b", base_config="configs/qwen3_1p7b_dlc.yaml", eval_batch_size=8
)

# Qwen3-0.6B's body (width, heads, MLP) with 4 of its 28 layers and the offline 4k tokenizer, random
# init then the chain warm-up: the smallest accelerator preset (launch/gpu_experiment.sh), a few
# minutes on one GPU.
QWEN3_0P6B_BODY_4L = tuple(
    shape_kwargs(
        "Qwen3-0.6B", vocab_size=4096, num_hidden_layers=4, tie_word_embeddings=True
    ).items()
)

QWEN3_0P6B_SMOKE = dataclasses.replace(
    TINY_V1,
    name="qwen3_0p6b_smoke",
    arms=("tis", "dlc"),
    seeds=(0,),
    onpolicy_seeds=(0, 1),
    steps=12,
    checkpoint_every=4,
    task=ChainWarmup(
        task=ChainArithConfig(min_terms=3, max_terms=5, digits=1, num_examples=2000),
        steps=500,
        batch_size=64,
        lr=1e-3,
        eval_prompts=16,
        model_dims=QWEN3_0P6B_BODY_4L,
    ),
    overrides=TINY_V1.overrides[:-1] + ("optim.lr=5e-5",),
    notes=(),
    prefixes=PrefixConfig(num_prompts=32, max_tokens=48),
)

PRESETS: dict[str, ExperimentPreset] = {
    p.name: p
    for p in (
        TINY,
        TINY_MORE,
        TINY_V3,
        TINY_V3_MORE,
        TINY_V1,
        QWEN3_0P6B,
        QWEN3_1P7B,
        QWEN3_0P6B_SMOKE,
    )
}
