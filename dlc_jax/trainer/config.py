"""Training config: `load_config` -> `read_layered` (YAML + ``base:`` chain) -> ``key.sub=value``
overrides -> `from_dict` -> `validate` (sections: `config_sections`).

A bad key or value is a :class:`ConfigError` starting with the dotted key (``optim.lr``); no config
library, whose errors read their own way. NaN is refused, infinity too except for ``_INF_OK``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from dlc_jax.rl.loss_config import LossConfig
from dlc_jax.trainer.config_sections import (
    _FIELD_NAME,
    _YAML_NAME,
    ConfigError,
    DistributedSection,
    LossSection,
    OptimSection,
    ResyncSection,
    TrainConfig,
    to_dict,
)

MAX_YAML_DEPTH = 64
# float keys where +inf is meaningful ("no cap"); every other float must be finite
_INF_OK = frozenset({"tis_cap", "seq_tis_cap", "behave_cap", "dual_clip"})
# Checks beyond type: (predicate, requirement text, the dotted keys it applies to).
_RULES: list[tuple[Callable[[Any], bool], str, str]] = [
    (
        lambda v: v == -1 or v >= 1,
        ">= 1 or -1 (all remaining devices)",
        "mesh.data mesh.fsdp mesh.tensor",
    ),
    (lambda v: v == -1 or v >= 1, ">= 1 or -1 (from the environment)", "distributed.num_processes"),
    (lambda v: v >= -1, ">= 0 or -1 (from the environment)", "distributed.process_id"),
    (lambda v: v >= 2, ">= 2", "sampler.max_model_len"),
    (
        lambda v: v > 0,
        "> 0",
        "sampler.startup_timeout_s sampler.reconnect_timeout_s sampler.connect_timeout_s "
        "sampler.temperature optim.eps optim.lr sft.lr",
    ),
    (
        lambda v: v >= 0,
        ">= 0",
        "sampler.retries sampler.retry_backoff_s sampler.retry_max_backoff_s sampler.head_k "
        "sampler.weight_noise optim.weight_decay optim.warmup async.max_staleness async.prefetch "
        "train.steps checkpoint.every sft.steps",
    ),
    (
        lambda v: v >= 0,
        ">= 0 (0 = off)",
        "sampler.top_k optim.grad_clip log.samples_every eval.every resync.max_interval",
    ),
    (lambda v: v >= 0, ">= 0 (0 = greedy)", "eval.temperature"),
    (lambda v: v >= 0, ">= 0 (0 = sampler.max_tokens)", "eval.max_tokens"),
    (
        lambda v: v >= 1,
        ">= 1",
        "sampler.n sampler.max_tokens distributed.initialization_timeout_s resync.k "
        "resync.max_snapshots train.batch_prompts train.micro_batches train.max_nonfinite_steps "
        "checkpoint.keep sft.batch_size log.progress_every log.samples_n eval.n",
    ),
    (lambda v: 0 < v <= 1, "in (0, 1]", "sampler.top_p resync.threshold"),
    (lambda v: 0 <= v < 1, "in [0, 1)", "optim.b1 optim.b2"),
    (lambda v: 0 <= v <= 1, "in [0, 1]", "optim.min_lr_ratio"),
]


def _coerce(key: str, tp, value):
    """``value`` converted to annotation ``tp`` or a ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value is False and "off" in choices:  # YAML 1.1 reads a bare `off` as false
            value = "off"
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {list(choices)}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else _coerce(key, args[0], value)
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
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        value = float(value)
        if math.isnan(value) or (math.isinf(value) and key.rsplit(".", 1)[-1] not in _INF_OK):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return value
    if tp is str:
        if value is None:
            return ""
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return str(value)
    for kind, accepts, what in ((list, (list, tuple), "a list"), (dict, dict, "a mapping")):
        if tp is kind or origin is kind:
            if not isinstance(value, accepts):
                raise ConfigError(f"{key}: expected {what}, got {value!r}")
            return kind(value)
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
    """A section's own error under its dotted key (``loss.clip_low: ...``)."""
    if msg.startswith((f"{where}.", f"{where}:")):  # already names its dotted key
        return msg
    for name in (cls.__name__, *(b.__name__ for b in cls.__mro__[1:])):
        m = re.match(rf"{name}\.(\w+):?\s*(.*)", msg, re.S)
        if m and m.group(1) in {f.name for f in dataclasses.fields(cls)}:
            return f"{where}.{m.group(1)}: {re.sub(r'^has an? ', '', m.group(2))}"
    return f"{where}: {msg}"


def validate(cfg: TrainConfig) -> TrainConfig:
    """Range and cross-field checks (types and choices were checked while parsing)."""
    for ok, req, keys in _RULES:
        for key in keys.split():
            section, name = key.split(".")
            v = getattr(getattr(cfg, _FIELD_NAME.get(section, section)), name)
            if not ok(v):
                raise ConfigError(f"{key}: must be {req}, got {v!r}")
    axes = {a: getattr(cfg.mesh, a) for a in ("data", "fsdp", "tensor")}
    if sum(v == -1 for v in axes.values()) > 1:
        raise ConfigError(f"mesh: at most one axis may be -1, got {axes}")
    if cfg.sampler.max_tokens >= cfg.sampler.max_model_len:
        raise ConfigError(
            f"sampler.max_model_len: {cfg.sampler.max_model_len} leaves no room for a prompt "
            f"before sampler.max_tokens={cfg.sampler.max_tokens} (must be larger)"
        )
    if cfg.sampler.head_k > 20 and cfg.sampler.backend == "vllm":
        raise ConfigError(
            f"sampler.head_k: vLLM reports at most 20 logprobs by default, got {cfg.sampler.head_k}"
        )
    if (cfg.train.batch_prompts * cfg.sampler.n) % cfg.train.micro_batches:
        raise ConfigError(
            f"train.micro_batches: {cfg.train.micro_batches} must divide batch_prompts*sampler.n = "
            f"{cfg.train.batch_prompts * cfg.sampler.n}"
        )
    if cfg.env.enabled and cfg.moe.router_replay != "off":
        raise ConfigError(
            "moe.router_replay: multi-turn episodes (env.fn) do not carry routed experts yet; "
            "set moe.router_replay=off with env.fn"
        )
    if cfg.env.max_total_tokens > cfg.sampler.max_model_len:
        raise ConfigError(
            f"env.max_total_tokens: must be <= sampler.max_model_len = "
            f"{cfg.sampler.max_model_len}, got {cfg.env.max_total_tokens}"
        )
    return cfg


def make_loss_config(loss: LossSection) -> LossConfig:
    """``loss.loss_config()`` (docs/CONTRACTS.md)."""
    return loss.loss_config()


def load_yaml(path: Path):
    """The YAML of ``path``; not UTF-8, not YAML or too deep: a ConfigError naming the file."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (a YAML config must be UTF-8)") from None
    try:
        return safe_yaml(text, str(path))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None


def safe_yaml(text: str, where: str, *, lines: bool = True):
    """``yaml.safe_load(text)`` refusing nesting deeper than ``MAX_YAML_DEPTH``."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                at = f":{event.start_mark.line + 1}" if lines and event.start_mark else ""
                raise ConfigError(f"{where}{at}: nested more than {MAX_YAML_DEPTH} levels deep")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    return yaml.safe_load(text)


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
    """``"optim.lr=1e-5"`` -> ``("optim.lr", 1e-05)`` (YAML; coerced to the key's type later)."""
    if "=" not in item:
        raise ConfigError(f"{item}: override must look like key.sub=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"{item}: empty key in override")
    try:
        value = safe_yaml(raw, key, lines=False) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def packaged_config(name: str) -> Path:
    """``dlc_jax/configs/<name>`` through importlib.resources (non-editable installs too)."""
    from importlib.resources import files

    return Path(str(files("dlc_jax") / "configs" / name))


def default_config_path() -> Path:
    """The embedded default, ``tiny_cpu.yaml``."""
    return packaged_config("tiny_cpu.yaml")


def _resolve_config_path(name: str | Path, relative_to: Path | None = None) -> Path:
    """A path (relative to ``relative_to`` first) or a packaged config's name."""
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
    """``over`` on ``base``: sections merge key by key, other values are replaced whole."""
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
    """The YAML mapping of ``path`` over its ``base:`` chain; errors name the file."""
    p = _resolve_config_path(path)
    if not p.exists():
        raise ConfigError(f"--config: no such file {str(p)!r}")
    if p.resolve() in _seen:
        chain = " -> ".join(str(s) for s in (*_seen, p.resolve()))
        raise ConfigError(f"base: config files include each other ({chain})")
    d = load_yaml(p) or {}
    if not isinstance(d, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    if (base := d.pop("base", None)) in (None, ""):
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
    """``sft.enabled: auto``: on for the tiny model (``model.path`` empty), else off."""
    sft = d.get("sft")
    if isinstance(sft, dict) and str(sft.get("enabled")).lower() == "auto":
        model = d.get("model") if isinstance(d.get("model"), dict) else {}
        sft["enabled"] = not (model or {}).get("path")


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Load YAML (``None``: all defaults) with its ``base:`` chain, apply overrides, validate."""
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
    "DistributedSection",
    "LossSection",
    "OptimSection",
    "ResyncSection",
    "load_config",
    "dump_config",
    "from_dict",
    "to_dict",
    "validate",
    "parse_override",
    "make_loss_config",
    "default_config_path",
]
