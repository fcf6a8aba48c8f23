"""dlc_jax.model: Flax NNX Qwen3 and Qwen3-MoE behind a model-family registry, HF checkpoint I/O,
mesh/sharding rules, tiny test models.

The names below are imported on first use (PEP 562), so importing a light module of the package
(``dlc_jax.model.config``: the configs and the model shape the benchmarks share) imports no JAX."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "PRESETS": "config",
    "ModelShape": "config",
    "Qwen3Config": "config",
    "UnsupportedModelError": "config",
    "CheckpointError": "hf_io",
    "hf_param_shapes": "hf_io",
    "iter_hf_tensors": "hf_io",
    "save_hf": "hf_io",
    "load_hf": "hf_load",
    "Qwen3ForCausalLM": "qwen3",
    "FAMILIES": "registry",
    "ModelFamily": "registry",
    "config_from_pretrained": "registry",
    "family_for_hf": "registry",
    "family_of": "registry",
    "LOGICAL_RULES": "sharding",
    "MeshConfig": "sharding",
    "make_mesh": "sharding",
    "shard_model": "sharding",
    "make_tiny": "tiny",
}

__all__ = [
    "PRESETS",
    "ModelShape",
    "Qwen3Config",
    "UnsupportedModelError",
    "CheckpointError",
    "hf_param_shapes",
    "iter_hf_tensors",
    "save_hf",
    "load_hf",
    "Qwen3ForCausalLM",
    "FAMILIES",
    "ModelFamily",
    "config_from_pretrained",
    "family_for_hf",
    "family_of",
    "LOGICAL_RULES",
    "MeshConfig",
    "make_mesh",
    "shard_model",
    "make_tiny",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from .config import PRESETS, ModelShape, Qwen3Config, UnsupportedModelError
    from .hf_io import CheckpointError, hf_param_shapes, iter_hf_tensors, save_hf
    from .hf_load import load_hf
    from .qwen3 import Qwen3ForCausalLM
    from .registry import FAMILIES, ModelFamily, config_from_pretrained, family_for_hf, family_of
    from .sharding import LOGICAL_RULES, MeshConfig, make_mesh, shard_model
    from .tiny import make_tiny
