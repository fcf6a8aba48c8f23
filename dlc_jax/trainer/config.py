"""Training config: loading YAML with its ``base:`` chain, ``key.sub=value`` CLI overrides, and
the public names of the config (`load_config`, `dump_config`, the sections, `from_dict`, ...).

The sections live in `config_sections`, parsing and checking in `config_parse`; this module reads
files and layers them (`load_config` -> `read_layered` -> overrides -> `from_dict` -> `validate`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from dlc_jax.data.arithmetic import ArithmeticConfig
from dlc_jax.model.sharding import MeshConfig
from dlc_jax.trainer.config_parse import (
    from_dict,
    load_yaml,
    make_loss_config,
    safe_yaml,
    validate,
)
from dlc_jax.trainer.config_sections import (
    _FIELD_NAME,
    AsyncSection,
    CheckpointSection,
    ConfigError,
    DistributedSection,
    EvalSection,
    LogSection,
    LossSection,
    ModelSection,
    OptimSection,
    ResyncSection,
    SamplerSection,
    SFTSection,
    TrainConfig,
    TrainSection,
    to_dict,
)


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
    """``"optim.lr=1e-5"`` -> ``("optim.lr", 1e-05)``: the value is parsed as YAML here and
    coerced to the key's type when the config is parsed."""
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
    d = load_yaml(p) or {}
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
    """Load YAML (``None`` = no file, all defaults) with its ``base:`` chain, apply the overrides,
    then parse and validate."""
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
    "ModelSection",
    "SamplerSection",
    "DistributedSection",
    "LossSection",
    "OptimSection",
    "ResyncSection",
    "AsyncSection",
    "TrainSection",
    "CheckpointSection",
    "LogSection",
    "EvalSection",
    "SFTSection",
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
