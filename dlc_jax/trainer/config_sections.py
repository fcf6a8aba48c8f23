"""The training config's sections: one dataclass per YAML section, and `TrainConfig` holding them.

Sections are the library's own dataclasses where one exists (``mesh`` = ``model.MeshConfig``,
``data`` = ``DataConfig``, ``reward`` = ``RewardConfig``, ``loss`` = ``rl.LossConfig`` plus the
trainer's ``old_policy``); the others are defined here. The YAML section ``async`` maps to the
field ``async_`` (``async`` is a Python keyword); `to_dict` writes the YAML names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Literal

from dlc_jax.data.prompts import DataConfig
from dlc_jax.data.rewards import RewardConfig
from dlc_jax.model.sharding import MeshConfig
from dlc_jax.plan.config import PlanConfig
from dlc_jax.rl.loss_config import LossConfig


class ConfigError(ValueError):
    """A bad config key or value; the message starts with the dotted key."""


@dataclasses.dataclass
class ModelSection:
    """path: HF model dir ('' = make the tiny model under sft.cache_dir); preset: model.PRESETS name
    for
    the tiny model; dtypes: 'float32' | 'bfloat16'; remat: rematerialize decoder layers."""

    path: str = ""
    preset: str = "tiny"
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    remat: bool = False


@dataclasses.dataclass
class SamplerSection:
    """backend: 'vllm' | 'jax'; address: 'host:port' of a running sampler ('' = spawn one on
    loopback),
    or several comma-separated ('h1:p,h2:p') driven as one ``dlc_jax.sampler.pool.SamplerPool``;
    token_file: file holding the bearer token ('' = none); tls_root_cert: PEM of the CA that signed
    the
    samplers' certificates ('' = plaintext); tls_server_name: override of the TLS target name;
    n: group size G; head_k: sampler top-k head reported per token (0 = none, no centering term);
    push_transport: how weight pushes carry the bytes: 'auto' (the sampler's raw socket data plane
    when
    it offers one -- a spawned loopback sampler does --, else gRPC), 'grpc' or 'socket'."""

    backend: Literal["vllm", "jax"] = "vllm"
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
    push_transport: Literal["auto", "grpc", "socket"] = "auto"


@dataclasses.dataclass
class DistributedSection:
    """Multi-host JAX (``dlc_jax.trainer.distributed``). mode: 'auto' (initialize when the
    environment
    says there are several processes: coordinator_address / JAX_COORDINATOR_ADDRESS set),
    'always' (always call ``jax.distributed.initialize``; on a TPU pod slice JAX detects the rest),
    'never' (single process); not 'on'/'off', which YAML reads as booleans. coordinator_address:
    'host:port' of process 0 ('' = from the environment / auto-detected on TPU); num_processes and
    process_id: -1 = from the environment / auto-detected."""

    mode: Literal["auto", "always", "never"] = "auto"
    coordinator_address: str = ""
    num_processes: int = -1
    process_id: int = -1
    initialization_timeout_s: int = 300


@dataclasses.dataclass(frozen=True)
class LossSection(LossConfig):
    """The ``loss`` section: ``rl.LossConfig`` (name + every loss hyper-parameter, given inline in
    YAML) and what lp_old -- the PPO anchor / proximal policy of ppo_clip, decoupled_ppo, m2po --
    is:
    'current' = stop_gradient(lp), the trainer at theta_t (one optimizer step per batch: r = 1);
    'sampler' = lp_q, the sampler's reported log-probs (the common async "bypass" PPO baseline);
    'snapshot' = lp_s, the trainer at the sampler's weights theta_s."""

    old_policy: Literal["current", "sampler", "snapshot"] = "current"

    def loss_config(self) -> LossConfig:
        """The ``LossConfig`` part (what the train step's loss reads)."""
        fields = {f.name for f in dataclasses.fields(LossConfig)}
        return LossConfig(**{k: v for k, v in dataclasses.asdict(self).items() if k in fields})


@dataclasses.dataclass
class OptimSection:
    """AdamW with linear warmup then decay ('cosine' | 'linear' | 'constant') to lr *
    min_lr_ratio."""

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
    """policy: 'ess' (push when lag ESS < threshold) | 'every_k' | 'never' | 'onpolicy';
    stale_rollouts: rollouts in flight from an older version are 'train'ed with their snapshot or
    'drop'ped."""

    policy: Literal["ess", "every_k", "never", "onpolicy"] = "ess"
    threshold: float = 0.5
    k: int = 4
    stale_rollouts: Literal["train", "drop"] = "train"
    max_snapshots: int = 4


@dataclasses.dataclass
class AsyncSection:
    """max_staleness: rollouts more than this many versions behind theta_t are dropped and
    resampled;
    prefetch: how many upcoming batches are requested from the sampler ahead of training."""

    max_staleness: int = 8
    prefetch: int = 1


@dataclasses.dataclass
class TrainSection:
    """steps: optimizer steps; batch_prompts: prompts per step (each with sampler.n samples);
    micro_batches: gradient accumulation splits; advantage: 'grpo' | 'mean' | 'drgrpo'."""

    steps: int = 20
    batch_prompts: int = 8
    micro_batches: int = 1
    pack: bool = False  # pack rollouts into rows of sampler.max_model_len tokens (segment ids)
    seed: int = 0
    advantage: Literal["grpo", "mean", "drgrpo"] = "grpo"
    max_nonfinite_steps: int = 3  # consecutive NaN/Inf loss or gradient steps (skipped) -> stop


@dataclasses.dataclass
class CheckpointSection:
    """dir: orbax checkpoint directory; every: save period in steps (0 = only at exit); keep:
    last N."""

    dir: str = "runs/default/ckpt"
    every: int = 10
    keep: int = 2
    resume: bool = True
    overwrite: bool = False  # resume=false on a used run dir: delete the old run (else refuse)
    allow_config_change: bool = False  # resume with a different training-relevant config


@dataclasses.dataclass
class LogSection:
    """dir: metrics.jsonl, samples.jsonl, summary.json and tb/ go here; progress: a tqdm bar on a
    terminal (a plain line every progress_every steps when stdout is not one, or when false);
    samples_every: log sample completions (prompt, response, reward, per-token delta/ell summary) to
    samples.jsonl and TensorBoard text every N steps (0 = off), samples_n of them;
    wandb: also log to Weights & Biases (wandb_project / wandb_run_name; WANDB_MODE=offline
    works)."""

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
    """Held-out evaluation through the training sampler every ``every`` steps (0 = off).

    source / subset / split: like ``data.*`` (same source syntax; '' = data.source); the prompt and
    answer fields, answer format and chat template are the ``data`` section's. n: prompts (the
    first n, in order); temperature: 0 = greedy, else sampled; max_tokens: 0 = sampler.max_tokens.
    Scored by the training rewards: eval/reward_mean is the mean total reward, eval/accuracy the
    share of responses whose total reward is >= correct_min (1.0 = a right answer under the
    built-in rewards)."""

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

    def to_dict(self) -> dict:
        return to_dict(self)

    def hash(self, *sections: str) -> str:
        """Stable short hash of the given sections (all when none)."""
        d = self.to_dict()
        if sections:
            d = {s: d[s] for s in sections}
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
