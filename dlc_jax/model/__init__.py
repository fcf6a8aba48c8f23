"""dlc_jax.model: Flax NNX Qwen3 and Qwen3-MoE behind a model-family registry, HF checkpoint I/O,
mesh/sharding rules, tiny test models. Names are imported on first use (PEP 562), so importing a
light module such as ``dlc_jax.model.config`` imports no JAX."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# module -> the names it lends the package
_MODULES = {
    "config": ("PRESETS", "ModelShape", "Qwen3Config", "UnsupportedModelError"),
    "hf_io": ("CheckpointError", "hf_param_shapes", "iter_hf_tensors", "save_hf"),
    "hf_load": ("load_hf",),
    "qwen3": ("Qwen3ForCausalLM",),
    "registry": ("FAMILIES", "ModelFamily", "config_from_pretrained", "family_for_hf", "family_of"),
    "sharding": ("LOGICAL_RULES", "MeshConfig", "make_mesh", "shard_model"),
    "tiny": ("make_tiny",),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}
__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # the names of __all__ for type checkers
    from .config import PRESETS, ModelShape, Qwen3Config, UnsupportedModelError  # noqa: F401
    from .hf_io import CheckpointError, hf_param_shapes, iter_hf_tensors, save_hf  # noqa: F401
    from .hf_load import load_hf  # noqa: F401
    from .qwen3 import Qwen3ForCausalLM  # noqa: F401
    from .registry import FAMILIES, ModelFamily, config_from_pretrained, family_for_hf, family_of  # noqa: F401
    from .sharding import LOGICAL_RULES, MeshConfig, make_mesh, shard_model  # noqa: F401
    from .tiny import make_tiny  # noqa: F401
