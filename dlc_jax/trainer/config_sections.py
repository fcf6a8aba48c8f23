"""The training config's sections (one dataclass per YAML section; the library's own where one
exists, e.g. ``data`` = ``DataConfig``) and `TrainConfig`. YAML ``async`` is the field ``async_``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Literal

from dlc_jax.data.prompts import DataConfig
from dlc_jax.data.rewards import RewardConfig
from dlc_jax.env.config import EnvConfig
from dlc_jax.lora.config import LoraConfig
from dlc_jax.model.config import (
    ATTENTION_IMPLS,
    MOE_DISPATCHES,
    MOE_IMPLS,
    REMAT_POLICIES,
    check_choice,
)
from dlc_jax.model.routing import MoeSection
from dlc_jax.model.sharding import MeshConfig
from dlc_jax.rl.loss_config import LossConfig
from dlc_jax.trainer.plan_section import PlanConfig


class ConfigError(ValueError):
    """A bad config key or value; the message starts with the dotted key."""


@dataclasses.dataclass
class ModelSection:
    """The model to train and its run options (docs/MODEL.md). path: HF model directory ('' =
    the tiny model ``preset``). attention_impl: 'auto' (splash on TPU, cuDNN on GPU in bf16, dense
    on CPU) or a kernel; scan_layers: null = by layer count; moe_impl: 'auto' (megablox on TPU,
    else ragged); remat_policy: '' follows remat ('full' when true, else 'none').
    """

    path: str = ""
    preset: str = "tiny"
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    remat: bool | None = None
    remat_policy: str = ""
    scan_layers: bool | None = None
    attention_impl: str = "auto"
    moe_impl: str = "auto"
    moe_dispatch: str = "allgather"

    def __post_init__(self):
        check_choice("ModelSection.moe_impl", self.moe_impl, list(MOE_IMPLS))
        check_choice("ModelSection.moe_dispatch", self.moe_dispatch, list(MOE_DISPATCHES))
        check_choice("ModelSection.attention_impl", self.attention_impl, list(ATTENTION_IMPLS))
        if self.remat_policy not in ("", *REMAT_POLICIES):
            raise ValueError(
                f"ModelSection.remat_policy: must be '' (from remat) or one of "
                f"{list(REMAT_POLICIES)}, got {self.remat_policy!r}"
            )
        if self.remat_policy and self.remat is not None:
            if self.remat != (self.remat_policy != "none"):
                raise ValueError(
                    f"ModelSection.remat_policy: {self.remat_policy!r} contradicts model.remat="
                    f"{str(self.remat).lower()} (remat=true goes with a policy other than 'none', "
                    "remat=false with 'none'; '' follows remat)"
                )

    def remat_policy_name(self) -> str:
        """The remat policy the model is built with (remat_policy, or 'full'/'none' from remat)."""
        return self.remat_policy or ("full" if self.remat else "none")

    def run_options(self) -> dict:
        """The ``Qwen3Config`` run options of this section."""
        return {
            "attention_impl": self.attention_impl,
            "scan_layers": self.scan_layers,
            "remat_policy": self.remat_policy_name(),
        }


@dataclasses.dataclass
class SamplerSection:
    """The sampler the trainer drives. backend 'inprocess': the JAX backend in the trainer's
    process. address: 'host:port', several comma-separated (a pool), or '' (spawn on loopback).
    n: the group size G; head_k: the top-k head per token; push_relay: samplers forward pushes.
    """

    backend: Literal["vllm", "jax", "inprocess"] = "vllm"
    address: str = ""
    token_file: str = ""
    tls_root_cert: str = ""
    tls_server_name: str = ""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    quantization: str = ""
    weight_noise: float = 0.0
    n: int = 4
    max_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    head_k: int = 8
    max_model_len: int = 128
    startup_timeout_s: float = 600.0
    reconnect_timeout_s: float = 600.0
    connect_timeout_s: float = 30.0  # first connection to a given sampler.address
    # the client's own retries of UNAVAILABLE (backoff doubling) before the trainer reconnects
    retries: int = 5
    retry_backoff_s: float = 0.25
    retry_max_backoff_s: float = 8.0
    push_transport: Literal["auto", "grpc", "socket"] = "auto"
    push_relay: Literal["off", "chain", "tree", "auto"] = "off"


@dataclasses.dataclass
class DistributedSection:
    """Multi-host JAX. mode: 'auto' initializes when a coordinator address is set (config or
    JAX_COORDINATOR_ADDRESS), 'always', 'never' (not on/off: YAML booleans). '' / -1: from the
    environment."""

    mode: Literal["auto", "always", "never"] = "auto"
    coordinator_address: str = ""
    num_processes: int = -1
    process_id: int = -1
    initialization_timeout_s: int = 300


@dataclasses.dataclass(frozen=True)
class LossSection(LossConfig):
    """``rl.LossConfig`` plus old_policy, the PPO anchor lp_old: 'current' = stop_gradient(lp),
    'sampler' = lp_q (the async "bypass" baseline), 'snapshot' = lp_s (theta_s)."""

    old_policy: Literal["current", "sampler", "snapshot"] = "current"

    def loss_config(self) -> LossConfig:
        """The ``LossConfig`` part."""
        return LossConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LossConfig)})


@dataclasses.dataclass
class OptimSection:
    """AdamW, linear warmup, then a decay to lr * min_lr_ratio."""

    lr: float = 1e-5
    warmup: int = 0
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8


@dataclasses.dataclass
class ResyncSection:
    """When theta_t is pushed to the sampler (``trainer.resync``). statistic: the lag ESS of
    'ess'; max_interval: with 'ess', also push after this many steps without a sync (0: no cap);
    stale_rollouts: older rollouts in flight are 'train'ed with their snapshot or 'drop'ped.
    """

    policy: Literal["ess", "every_k", "never", "onpolicy"] = "ess"
    statistic: Literal["token", "sequence"] = "token"
    threshold: float = 0.5
    k: int = 4
    max_interval: int = 0
    stale_rollouts: Literal["train", "drop"] = "train"
    max_snapshots: int = 4


@dataclasses.dataclass
class AsyncSection:
    """max_staleness: versions behind before a rollout is dropped; prefetch: batches ahead."""

    max_staleness: int = 8
    prefetch: int = 1


@dataclasses.dataclass
class TrainSection:
    """steps: optimizer steps. batch_prompts: prompts per step (each with sampler.n samples).
    micro_batches: gradient accumulation splits. advantage: 'grpo' | 'mean' | 'drgrpo'."""

    steps: int = 20
    batch_prompts: int = 8
    micro_batches: int = 1
    pack: bool = False  # pack rollouts into rows of sampler.max_model_len tokens (segment ids)
    # unpacked row lengths (each compiles the step): power of 2, multiple of 16 or max_model_len
    length_buckets: Literal["pow2", "fine", "max"] = "pow2"
    # JAX's persistent compilation cache ('' = off): a restarted run reads its programs back
    compile_cache_dir: str = ""
    seed: int = 0
    advantage: Literal["grpo", "mean", "drgrpo"] = "grpo"
    max_nonfinite_steps: int = 3  # consecutive NaN/Inf loss or gradient steps (skipped) -> stop


@dataclasses.dataclass
class CheckpointSection:
    """every: the save period in steps (0 = only at exit); keep: how many are kept."""

    dir: str = "runs/default/ckpt"
    every: int = 10
    keep: int = 2
    resume: bool = True
    overwrite: bool = False  # resume=false on a used run dir: delete the old run (else refuse)
    allow_config_change: bool = False  # resume with a different training-relevant config


@dataclasses.dataclass
class LogSection:
    """The run's metrics under dir (metrics.jsonl, samples.jsonl, summary.json, tb/), the progress
    bar or line, samples_n completions every samples_every steps (0 = off), wandb."""

    dir: str = "runs/default/logs"
    jsonl: bool = True
    tensorboard: bool = True
    progress: bool = True
    progress_every: int = 10
    samples_every: int = 0
    samples_n: int = 4
    wandb: bool = False
    wandb_project: str = "dlc-jax"
    wandb_run_name: str = ""


@dataclasses.dataclass
class EvalSection:
    """Held-out evaluation every ``every`` steps (0 = off) of the first n prompts of source ('' =
    data.source); max_tokens 0 = sampler.max_tokens; accuracy: share of reward >= correct_min."""

    every: int = 0
    source: str = ""
    subset: str = ""
    split: str = "test"
    n: int = 64
    temperature: float = 0.0
    correct_min: float = 1.0
    max_tokens: int = 0


@dataclasses.dataclass
class SFTSection:
    """Supervised warm-up of the tiny model on the synthetic task (cached by config hash)."""

    enabled: bool = False  # YAML may say 'auto': on only when model.path is '' (the tiny model)
    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3
    cache_dir: str = "runs/cache"


@dataclasses.dataclass
class TrainConfig:
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    distributed: DistributedSection = dataclasses.field(default_factory=DistributedSection)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    sampler: SamplerSection = dataclasses.field(default_factory=SamplerSection)
    loss: LossSection = dataclasses.field(default_factory=LossSection)
    optim: OptimSection = dataclasses.field(default_factory=OptimSection)
    resync: ResyncSection = dataclasses.field(default_factory=ResyncSection)
    async_: AsyncSection = dataclasses.field(default_factory=AsyncSection)
    train: TrainSection = dataclasses.field(default_factory=TrainSection)
    checkpoint: CheckpointSection = dataclasses.field(default_factory=CheckpointSection)
    log: LogSection = dataclasses.field(default_factory=LogSection)
    sft: SFTSection = dataclasses.field(default_factory=SFTSection)
    eval: EvalSection = dataclasses.field(default_factory=EvalSection)
    plan: PlanConfig = dataclasses.field(default_factory=PlanConfig)  # dlc-jax plan defaults
    moe: MoeSection = dataclasses.field(default_factory=MoeSection)  # mixture-of-experts options
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)  # multi-turn (dlc_jax.env)
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)  # LoRA RL (rank 0: off)

    def to_dict(self) -> dict:
        return to_dict(self)

    def hash(self, *sections: str, drop: tuple[str, ...] = ()) -> str:
        """Stable short hash of ``sections`` (all when none) less the dotted keys ``drop``."""
        d = self.to_dict()
        if sections:
            d = {s: d[s] for s in sections}
        for key in drop:
            section, name = key.split(".", 1)
            if section in d:
                d[section] = {k: v for k, v in d[section].items() if k != name}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


_YAML_NAME = {"async_": "async"}
_FIELD_NAME = {v: k for k, v in _YAML_NAME.items()}


def to_dict(obj) -> dict:
    """Nested dict of a config dataclass (YAML names, e.g. ``async``)."""
    out = {}
    for f in dataclasses.fields(obj):
        v = vars(obj)[f.name]
        out[_YAML_NAME.get(f.name, f.name)] = to_dict(v) if dataclasses.is_dataclass(v) else v
    return out
