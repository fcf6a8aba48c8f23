"""Training config schema: nested dataclasses, YAML loading, ``key.sub=value`` CLI overrides.

Sections are the library's own dataclasses where one exists (``mesh`` = ``model.MeshConfig``,
``data`` = ``DataConfig``, ``reward`` = ``RewardConfig``, ``loss`` = ``rl.LossConfig`` plus the
trainer's ``old_policy``); the others are defined here.

Every key is checked in one place (`load_config` -> `from_dict` for types and choices, `validate`
for
ranges and cross-field rules; a section dataclass's own checks are reported under its key): an
unknown
key or a bad value is a :class:`ConfigError` whose message starts with the full dotted key (e.g.
``optim.lr``). The YAML section ``async`` maps to the field ``async_`` (``async`` is a Python
keyword).

No config library: OmegaConf / pydantic would replace the ~40 lines of type coercion below but
accept
different inputs (e.g. pydantic refuses an int for a str field, OmegaConf has no Literal choices)
and
word errors their own way; the dotted-key errors and the accepted inputs are what users rely on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from dlc_jax.data.arithmetic import ArithmeticConfig
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

# Checks beyond type: (dotted key, predicate, requirement text).
_RULES: list[tuple[str, Any, str]] = [
    ("sampler.n", lambda v: v >= 1, ">= 1"),
    ("sampler.max_tokens", lambda v: v >= 1, ">= 1"),
    ("sampler.temperature", lambda v: v > 0, "> 0"),
    ("sampler.top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("sampler.top_k", lambda v: v >= 0, ">= 0 (0 = off)"),
    ("sampler.head_k", lambda v: v >= 0, ">= 0"),
    ("sampler.weight_noise", lambda v: v >= 0, ">= 0"),
    ("distributed.num_processes", lambda v: v == -1 or v >= 1, ">= 1 or -1 (from the environment)"),
    ("distributed.process_id", lambda v: v >= -1, ">= 0 or -1 (from the environment)"),
    ("distributed.initialization_timeout_s", lambda v: v >= 1, ">= 1"),
    ("optim.lr", lambda v: v > 0, "> 0"),
    ("optim.warmup", lambda v: v >= 0, ">= 0"),
    ("optim.grad_clip", lambda v: v >= 0, ">= 0 (0 = off)"),
    ("optim.b1", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("optim.b2", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("optim.min_lr_ratio", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("resync.threshold", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("resync.k", lambda v: v >= 1, ">= 1"),
    ("resync.max_snapshots", lambda v: v >= 1, ">= 1"),
    ("async.max_staleness", lambda v: v >= 0, ">= 0"),
    ("async.prefetch", lambda v: v >= 0, ">= 0"),
    ("train.steps", lambda v: v >= 0, ">= 0"),
    ("train.batch_prompts", lambda v: v >= 1, ">= 1"),
    ("train.micro_batches", lambda v: v >= 1, ">= 1"),
    ("checkpoint.every", lambda v: v >= 0, ">= 0"),
    ("checkpoint.keep", lambda v: v >= 1, ">= 1"),
    ("sampler.connect_timeout_s", lambda v: v > 0, "> 0"),
    ("train.max_nonfinite_steps", lambda v: v >= 1, ">= 1"),
    ("sft.steps", lambda v: v >= 0, ">= 0"),
    ("log.progress_every", lambda v: v >= 1, ">= 1"),
    ("log.samples_every", lambda v: v >= 0, ">= 0 (0 = off)"),
    ("log.samples_n", lambda v: v >= 1, ">= 1"),
    ("eval.every", lambda v: v >= 0, ">= 0 (0 = off)"),
    ("eval.n", lambda v: v >= 1, ">= 1"),
    ("eval.temperature", lambda v: v >= 0, ">= 0 (0 = greedy)"),
    ("eval.max_tokens", lambda v: v >= 0, ">= 0 (0 = sampler.max_tokens)"),
]


def _coerce(key: str, tp, value):
    """``value`` converted to annotation ``tp`` or a ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {list(choices)}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(key, args[0], value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{key}: expected a bool, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not (
            isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        ):
            raise ConfigError(f"{key}: expected an int, got {value!r}")
        return int(value)
    if tp is float:
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if value is None:
            return ""
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return str(value)
    if tp is dict or typing.get_origin(tp) is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, prefix=key)
    raise ConfigError(f"{key}: unsupported field type {tp!r}")


def from_dict(cls, d: dict | None, prefix: str = ""):
    """Build dataclass ``cls`` from a nested dict, naming the dotted key of any bad entry."""
    d = {} if d is None else d
    where = prefix or "<config>"
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected a mapping, got {d!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in d.items():
        name = _FIELD_NAME.get(k, k)
        key = f"{prefix}.{k}" if prefix else str(k)
        if name not in names:
            known = sorted(_YAML_NAME.get(n, n) for n in names)
            raise ConfigError(f"{key}: unknown config key (known: {known})")
        kwargs[name] = _coerce(key, hints[name], v)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        raise ConfigError(_section_error(where, cls, str(e))) from e


def _section_error(where: str, cls, msg: str) -> str:
    """A section dataclass's own error under its dotted key: "LossConfig.clip_low has ..." from the
    ``loss`` section becomes "loss.clip_low: has ..."."""
    for name in (cls.__name__, *(b.__name__ for b in cls.__mro__[1:])):
        m = re.match(rf"{name}\.(\w+):?\s*(.*)", msg, re.S)
        if m and m.group(1) in {f.name for f in dataclasses.fields(cls)}:
            return f"{where}.{m.group(1)}: {re.sub(r'^has an? ', '', m.group(2))}"
    return f"{where}: {msg}"


def to_dict(obj) -> dict:
    """Nested dict of a config dataclass (YAML names, e.g. ``async``)."""
    out = {}
    for f in dataclasses.fields(obj):
        v = vars(obj)[f.name]
        out[_YAML_NAME.get(f.name, f.name)] = to_dict(v) if dataclasses.is_dataclass(v) else v
    return out


def _get(cfg: TrainConfig, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = vars(obj)[_FIELD_NAME.get(part, part)]
    return obj


def validate(cfg: TrainConfig) -> TrainConfig:
    """Range and cross-field checks (types, choices and each section's own checks ran while
    parsing); errors name the key."""
    for key, ok, req in _RULES:
        v = _get(cfg, key)
        if not ok(v):
            raise ConfigError(f"{key}: must be {req}, got {v!r}")
    if cfg.sampler.head_k > 20 and cfg.sampler.backend == "vllm":
        raise ConfigError(
            f"sampler.head_k: vLLM reports at most 20 logprobs by default, got {cfg.sampler.head_k}"
        )
    if (cfg.train.batch_prompts * cfg.sampler.n) % cfg.train.micro_batches:
        raise ConfigError(
            f"train.micro_batches: {cfg.train.micro_batches} must divide batch_prompts*sampler.n = "
            f"{cfg.train.batch_prompts * cfg.sampler.n}"
        )
    return cfg


def make_loss_config(loss: LossSection) -> LossConfig:
    """``rl.LossConfig`` of the loss section (kept for callers; same as ``loss.loss_config()``)."""
    return loss.loss_config()


def _set_dotted(d: dict, dotted: str, value) -> None:
    parts = dotted.split(".")
    cur = d
    for p in parts[:-1]:
        nxt = cur.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{dotted}: {p!r} is not a section")
        cur = nxt
    cur[parts[-1]] = value


def parse_override(item: str) -> tuple[str, Any]:
    """``"optim.lr=1e-5"`` -> ``("optim.lr", 1e-05)`` (value parsed as YAML, then type-coerced
    later)."""
    if "=" not in item:
        raise ConfigError(f"{item}: override must look like key.sub=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"{item}: empty key in override")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def packaged_config(name: str) -> Path:
    """``dlc_jax/configs/<name>`` shipped inside the package (the repository's ``configs/`` links
    there), found through importlib.resources so a non-editable install has it too."""
    from importlib.resources import files

    return Path(str(files("dlc_jax") / "configs" / name))


def default_config_path() -> Path:
    """The embedded default, ``tiny_cpu.yaml`` shipped with the package."""
    return packaged_config("tiny_cpu.yaml")


def _resolve_config_path(name: str | Path, relative_to: Path | None = None) -> Path:
    """A config file: a path (relative to the including file's folder for ``base:``), or a packaged
    config by name (``tiny_cpu``, ``tiny_cpu.yaml``, ``configs/tiny_cpu.yaml``)."""
    p = Path(name)
    if relative_to is not None and not p.is_absolute() and (relative_to / p).exists():
        return relative_to / p
    if p.exists() or p.is_absolute():
        return p
    if p.parent.name in ("", "configs"):
        shipped = packaged_config(p.name if p.suffix in (".yaml", ".yml") else p.name + ".yaml")
        if shipped.exists():
            return shipped
    return p


def _merge(cls, base: dict, over: dict) -> dict:
    """``over`` layered on ``base``: config sections merge key by key, any other value (a
    mapping-typed field such as ``reward.fns`` included) is replaced whole."""
    hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
    out = dict(base)
    for k, v in over.items():
        tp = hints.get(_FIELD_NAME.get(k, k))
        if isinstance(v, dict) and isinstance(out.get(k), dict) and dataclasses.is_dataclass(tp):
            out[k] = _merge(tp, out[k], v)
        else:
            out[k] = v
    return out


def read_layered(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict:
    """The YAML mapping of ``path`` with its ``base:`` chain applied (base first, then the file).

    ``base`` names a packaged config (``base: tiny_cpu``) or a path, relative to the file that
    names it; a base may have its own base. Errors name the file."""
    p = _resolve_config_path(path)
    if not p.exists():
        raise ConfigError(f"--config: no such file {str(p)!r}")
    if p.resolve() in _seen:
        chain = " -> ".join(str(s) for s in (*_seen, p.resolve()))
        raise ConfigError(f"base: config files include each other ({chain})")
    try:
        d = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    base = d.pop("base", None)
    if base in (None, ""):
        return d
    if not isinstance(base, str):
        raise ConfigError(f"base: expected a config name or path in {p}, got {base!r}")
    bp = _resolve_config_path(base, relative_to=p.parent)
    if not bp.exists():
        raise ConfigError(
            f"base: no packaged config or file {base!r} (named in {p}; packaged: "
            f"{sorted(x.stem for x in packaged_config('').glob('*.yaml'))})"
        )
    return _merge(TrainConfig, read_layered(bp, (*_seen, p.resolve())), d)


def _resolve_auto(d: dict) -> None:
    """``sft.enabled: auto`` (the embedded default's): on for the tiny model made locally
    (``model.path`` empty), off for a model the user gives."""
    sft = d.get("sft")
    if isinstance(sft, dict) and str(sft.get("enabled")).lower() == "auto":
        model = d.get("model") if isinstance(d.get("model"), dict) else {}
        sft["enabled"] = not (model or {}).get("path")


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Load YAML (``None`` = no file, all defaults) with its ``base:`` chain, apply overrides, parse
    and validate."""
    d: dict = read_layered(path) if path is not None else {}
    for item in overrides:
        k, v = parse_override(item)
        if k == "base":
            raise ConfigError("base: give it in the config file (base: NAME), not as an override")
        _set_dotted(d, k, v)
    _resolve_auto(d)
    return validate(from_dict(TrainConfig, d))


def dump_config(cfg: TrainConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


__all__ = [
    "ConfigError",
    "TrainConfig",
    "LossSection",
    "MeshConfig",
    "load_config",
    "dump_config",
    "from_dict",
    "to_dict",
    "validate",
    "parse_override",
    "make_loss_config",
    "default_config_path",
    "ArithmeticConfig",
]
