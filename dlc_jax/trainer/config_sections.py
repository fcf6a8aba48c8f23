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
    """The model to train and how it runs.

    path: HF model directory ('' = make the tiny model under sft.cache_dir); preset: the
    ``model.PRESETS`` name of the tiny model; param_dtype / compute_dtype: 'float32' | 'bfloat16'.

    How it runs (the ``Qwen3Config`` run options, docs/MODEL.md): attention_impl is the attention
    kernel, 'auto' (splash on TPU, cuDNN on GPU in bf16, dense on CPU) or one of 'splash', 'cudnn',
    'xla', 'dense'. scan_layers: true stacks the decoder layers and runs them with lax.scan (one
    compiled layer), false loops over them; null scans models of at least
    ``model.config.SCAN_MIN_LAYERS`` layers. moe_impl (mixture-of-experts models only; a dense
    model ignores it) is the experts' kernel: 'auto' (the Pallas megablox grouped matmul when the
    mesh's devices are TPUs, else ``jax.lax.ragged_dot``) or one of 'ragged', 'megablox', 'dense'
    (every expert on every token: the reference). moe_dispatch (megablox with tokens split over
    the `expert` mesh axis) is how tokens reach their experts' devices: 'allgather' (the default)
    or 'all_to_all' (``jax.lax.ragged_all_to_all``: each token only to the devices holding its
    experts; docs/MODEL.md).

    remat and remat_policy say what a decoder layer keeps for the backward pass. remat_policy names
    the policy ('none', 'full', 'save_dots', 'save_attn_out', 'save_dots_and_attn_out'); '' takes
    it from remat: 'full' when remat is true, else 'none'. remat may be left null when a policy is
    named. Both given must agree (remat true with a policy other than 'none', remat false with
    'none'); a contradiction is a config error, so turning remat off on a config that names a
    policy never leaves the policy silently on. `remat_policy_name` is the policy used.
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
        if self.remat_policy:
            return self.remat_policy
        return "full" if self.remat else "none"

    def run_options(self) -> dict:
        """The ``Qwen3Config`` run options of this section (scan_layers None = by layer count)."""
        return {
            "attention_impl": self.attention_impl,
            "scan_layers": self.scan_layers,
            "remat_policy": self.remat_policy_name(),
        }


@dataclasses.dataclass
class SamplerSection:
    """The sampler the trainer drives and how it samples.

    backend: 'vllm' | 'jax' | 'inprocess' (the JAX backend inside the trainer's process: no server,
    no subprocess; for debugging a config on one machine). address: 'host:port' of a running
    sampler ('' = spawn one on loopback), or several comma-separated ('h1:p,h2:p') driven as one
    ``dlc_jax.sampler.client.pool.SamplerPool``. token_file: the file holding the bearer token ('' =
    none). tls_root_cert: PEM of the CA that signed the samplers' certificates ('' = plaintext);
    tls_server_name: an override of the TLS target name. n: the group size G. head_k: the size of
    the sampler's top-k head reported per token (0 = none, no centering term). push_transport: how
    weight pushes carry the bytes: 'auto' (the sampler's raw socket data plane when it offers one,
    as a spawned loopback sampler does, else gRPC), 'grpc' or 'socket'. push_relay: with several
    samplers, 'off' (a copy to each from the trainer), 'chain' / 'tree' / 'auto' (one copy from
    the trainer, forwarded between samplers; ``dlc_jax.sampler.push.relay``).
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
    # the gRPC client's own retries of an UNAVAILABLE call (waits retry_backoff_s, doubling, capped
    # at retry_max_backoff_s) before the trainer reconnects (sampler.reconnect_timeout_s)
    retries: int = 5
    retry_backoff_s: float = 0.25
    retry_max_backoff_s: float = 8.0
    push_transport: Literal["auto", "grpc", "socket"] = "auto"
    push_relay: Literal["off", "chain", "tree", "auto"] = "off"


@dataclasses.dataclass
class DistributedSection:
    """Multi-host JAX (``dlc_jax.trainer.distributed``).

    mode: 'auto' initializes when the environment says there are several processes
    (coordinator_address or JAX_COORDINATOR_ADDRESS set); 'always' always calls
    ``jax.distributed.initialize`` (on a TPU pod slice JAX detects the rest); 'never' runs a single
    process. Not 'on'/'off', which YAML reads as booleans. coordinator_address: 'host:port' of
    process 0 ('' = from the environment, or auto-detected on TPU). num_processes and process_id:
    -1 = from the environment, or auto-detected.
    """

    mode: Literal["auto", "always", "never"] = "auto"
    coordinator_address: str = ""
    num_processes: int = -1
    process_id: int = -1
    initialization_timeout_s: int = 300


@dataclasses.dataclass(frozen=True)
class LossSection(LossConfig):
    """The ``loss`` section: ``rl.LossConfig`` (the name and every loss hyper-parameter, given
    inline in YAML) plus old_policy, what lp_old (the PPO anchor, or proximal policy, of ppo_clip,
    decoupled_ppo and m2po) is.

    'current' = stop_gradient(lp), the trainer at theta_t (one optimizer step per batch: r = 1);
    'sampler' = lp_q, the sampler's reported log-probs (the common async "bypass" PPO baseline);
    'snapshot' = lp_s, the trainer at the sampler's weights theta_s.
    """

    old_policy: Literal["current", "sampler", "snapshot"] = "current"

    def loss_config(self) -> LossConfig:
        """The ``LossConfig`` part (what the train step's loss reads)."""
        fields = {f.name for f in dataclasses.fields(LossConfig)}
        return LossConfig(**{k: v for k, v in dataclasses.asdict(self).items() if k in fields})


@dataclasses.dataclass
class OptimSection:
    """AdamW with a linear warmup, then a decay ('cosine' | 'linear' | 'constant') to
    lr * min_lr_ratio."""

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
    """When theta_t is pushed to the sampler.

    policy: 'ess' (push when the lag ESS < threshold) | 'every_k' | 'never' | 'onpolicy'.
    statistic: the lag ESS the 'ess' policy reads: 'token' (normalized ESS of exp(ell) over every
    valid token) or 'sequence' (of exp(sum of a response's ell), VCPO's; it falls far sooner when
    most tokens are near-certain). threshold: resync below this ESS, in (0, 1]. max_interval: with
    'ess', also push after this many steps without a sync (0 = no cap; bounded staleness).
    stale_rollouts: rollouts in flight from an older version are 'train'ed with their snapshot or
    'drop'ped.
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
    """max_staleness: rollouts more than this many versions behind theta_t are dropped and
    resampled. prefetch: how many upcoming batches are requested from the sampler ahead of
    training."""

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
    # unpacked row lengths: 'pow2' (next power of two), 'fine' (next multiple of 16), 'max'
    # (always sampler.max_model_len); each distinct length compiles the step again
    length_buckets: Literal["pow2", "fine", "max"] = "pow2"
    # JAX's persistent compilation cache ('' = off): a restarted run reads its programs back
    compile_cache_dir: str = ""
    seed: int = 0
    advantage: Literal["grpo", "mean", "drgrpo"] = "grpo"
    max_nonfinite_steps: int = 3  # consecutive NaN/Inf loss or gradient steps (skipped) -> stop


@dataclasses.dataclass
class CheckpointSection:
    """dir: the orbax checkpoint directory. every: the save period in steps (0 = only at exit).
    keep: how many of the last checkpoints are kept."""

    dir: str = "runs/default/ckpt"
    every: int = 10
    keep: int = 2
    resume: bool = True
    overwrite: bool = False  # resume=false on a used run dir: delete the old run (else refuse)
    allow_config_change: bool = False  # resume with a different training-relevant config


@dataclasses.dataclass
class LogSection:
    """Where and how the run's metrics go.

    dir: metrics.jsonl, samples.jsonl, summary.json and tb/ go here. progress: a tqdm bar on a
    terminal (a plain line every progress_every steps when stdout is not one, or when false).
    samples_every: log samples_n sample completions (prompt, response, reward, a per-token
    delta/ell summary) to samples.jsonl and TensorBoard text every N steps (0 = off). wandb: also
    log to Weights & Biases (wandb_project, wandb_run_name; WANDB_MODE=offline works).
    """

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

    source / subset / split: like ``data.*`` (the same source syntax; '' = data.source); the prompt
    and answer fields, the answer format and the chat template are the ``data`` section's. n: how
    many prompts (the first n, in order). temperature: 0 = greedy, else sampled. max_tokens: 0 =
    sampler.max_tokens. Scored by the training rewards: eval/reward_mean is the mean total reward,
    eval/accuracy the share of responses whose total reward is >= correct_min (1.0 = a right
    answer under the built-in rewards).
    """

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
        """Stable short hash of the given sections (all when none), without the dotted keys in
        ``drop`` (``model.scan_layers``)."""
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
