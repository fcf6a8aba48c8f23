"""Experiment presets: arms (a correction with its resync rule), scenarios (the sampler's sync
schedule and perturbation), run length and the base config every run of the preset shares."""

from __future__ import annotations

import dataclasses

from dlc_jax.data.chain_arith import ChainArithConfig
from dlc_jax.experiments.heldout import HeldoutConfig
from dlc_jax.experiments.prefixes import PrefixConfig
from dlc_jax.experiments.warmup import ChainWarmup
from dlc_jax.model.config import shape_kwargs


@dataclasses.dataclass(frozen=True)
class Arm:
    """own_resync: the arm's resync policy instead of the scenario's; extra: trainer overrides."""

    name: str
    loss: str
    options: tuple[tuple[str, object], ...] = ()
    own_resync: str | None = None
    extra: tuple[str, ...] = ()


SCENARIO_KINDS = ("lag", "discrepancy", "both")
SYNCS = ("every_k", "never", "onpolicy")


@dataclasses.dataclass(frozen=True)
class Scenario:
    """sync: 'every_k' (k = sync_k) | 'never' | 'onpolicy' (synced before every batch, for every
    arm); quantization: sampler weight quantization ('' = none); dtype: the sampler's compute dtype
    ('' = the base config's); weight_noise: Gaussian noise std on the sampler's weights relative to
    each tensor's RMS; kind: the error source, 'lag' (old weights), 'discrepancy' (other numerics)
    or 'both' (checked against the other fields)."""

    name: str
    sync: str = "every_k"
    sync_k: int = 4
    quantization: str = ""
    weight_noise: float = 0.0
    dtype: str = ""
    kind: str = "both"

    def __post_init__(self):
        for key, allowed in (("sync", SYNCS), ("kind", SCENARIO_KINDS)):
            if getattr(self, key) not in allowed:
                raise ValueError(
                    f"scenario {self.name}: {key} must be one of {allowed}, got "
                    f"{getattr(self, key)!r}"
                )
        perturbed = bool(self.quantization or self.dtype or self.weight_noise)
        kinds = {(True, False): "lag", (False, True): "discrepancy", (True, True): "both"}
        want = kinds.get((self.sync != "onpolicy", perturbed))  # by (lagged, perturbed)
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
        # diagnostic: DLC's lag clip alone (no head, so no centering), no resync
        Arm("dlc_nocenter", "dlc", extra=("sampler.head_k=0",)),
        # control: theta_0 frozen (lr below the weights' fp32 resolution)
        Arm("frozen", "naive", extra=("optim.lr=1e-12",)),
    )
}


@dataclasses.dataclass(frozen=True)
class ExperimentPreset:
    """base_config: YAML path relative to the repo root (or absolute); overrides: ``key=value`` for
    every run; checkpoint_every: where the KL is measured; onpolicy_seeds (>= 2) / seeds:
    ``train.seed`` of the on-policy / arm runs (an arm run is compared with the on-policy runs of
    the other seeds); task: the chain warm-up and data (None: the base config's);
    own_prefix_scenarios: also measured on the runs' own prefixes (own_prefixes.py); more_seeds:
    seeds run only by more_seed_arms."""

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

# The first CPU matrix (reproduces docs/experiments/tiny_v1): a never-synced int8 sampler.
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

# Every source of mismatch on its own, then both; learning rate and batch from the sweep.
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
# `collapse`'s two sources are exactly `lag_never`'s lag and `disc_int8`'s discrepancy; the other
# scenarios are the `tiny_more` preset.
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
    onpolicy_seeds=(0, 1, 2, 3, 4),
    more_seeds=(3, 4),
    more_seed_arms=("naive", "tis", "dlc"),
    overrides=TINY_OVERRIDES + ("train.batch_prompts=32", "optim.lr=5e-05"),
    heldout=HeldoutConfig(every_checkpoint=False),  # the final accuracy; the curve costs 4x
    notes=(),
)
TINY_MORE = dataclasses.replace(TINY, name="tiny_more", scenarios=TINY_MORE_SCENARIOS)

# v3: the pilot's point (docs/experiments/README.md, "pilot") and discrepancies of measured size
# (docs/experiments/numerics); `tiny_v3_more` holds the scenarios that do not decide the claims.
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
)

QWEN3_1P7B = dataclasses.replace(
    QWEN3_0P6B, name="qwen3_1p7b", base_config="configs/qwen3_1p7b_dlc.yaml", eval_batch_size=8
)

# Qwen3-0.6B's body with 4 of its 28 layers and a 4k vocabulary, random init then the chain
# warm-up: the smallest accelerator preset (launch/gpu_experiment.sh).
QWEN3_0P6B_BODY_4L = tuple(
    shape_kwargs(
        "Qwen3-0.6B", vocab_size=4096, num_hidden_layers=4, tie_word_embeddings=True
    ).items()
)
SMOKE_TASK = dataclasses.replace(
    CHAIN_TASK, steps=500, batch_size=64, lr=1e-3, eval_prompts=16, model_dims=QWEN3_0P6B_BODY_4L
)

QWEN3_0P6B_SMOKE = dataclasses.replace(
    TINY_V1,
    name="qwen3_0p6b_smoke",
    arms=("tis", "dlc"),
    seeds=(0,),
    onpolicy_seeds=(0, 1),
    steps=12,
    checkpoint_every=4,
    task=SMOKE_TASK,
    overrides=TINY_V1.overrides[:-1] + ("optim.lr=5e-5",),
    notes=(),
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
