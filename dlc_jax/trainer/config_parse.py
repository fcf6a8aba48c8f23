"""Parsing and checking a config mapping: types and choices (`from_dict`), then ranges and
cross-field rules (`validate`).

Every key is checked here: an unknown key or a bad value is a :class:`ConfigError` whose message
starts with the full dotted key (e.g. ``optim.lr``); a section dataclass's own checks are reported
under its key.

No config library: OmegaConf / pydantic would replace the ~40 lines of type coercion below but
accept different inputs (e.g. pydantic refuses an int for a str field, OmegaConf has no Literal
choices) and word errors their own way; the dotted-key errors and the accepted inputs are what
users rely on.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from typing import Any, Literal

from dlc_jax.rl.loss_config import LossConfig
from dlc_jax.trainer.config_sections import (
    _FIELD_NAME,
    _YAML_NAME,
    ConfigError,
    LossSection,
    TrainConfig,
)

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
    if cfg.env.enabled and cfg.eval.every:
        raise ConfigError(
            "eval.every: evaluation runs single-turn prompts and cannot run env.fn episodes yet; "
            "set eval.every=0 with env.fn"
        )
    if cfg.env.max_total_tokens > cfg.sampler.max_model_len:
        raise ConfigError(
            f"env.max_total_tokens: must be <= sampler.max_model_len = "
            f"{cfg.sampler.max_model_len}, got {cfg.env.max_total_tokens}"
        )
    return cfg


def make_loss_config(loss: LossSection) -> LossConfig:
    """``rl.LossConfig`` of the loss section (kept for callers; same as ``loss.loss_config()``)."""
    return loss.loss_config()
