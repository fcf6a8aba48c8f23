"""dlc_jax.model: Flax NNX Qwen3 and Qwen3-MoE behind a model-family registry, HF checkpoint I/O,
mesh/sharding rules, tiny test models."""

from .config import PRESETS, Qwen3Config, UnsupportedModelError
from .hf_io import CheckpointError, hf_param_shapes, iter_hf_tensors, save_hf
from .hf_load import load_hf
from .qwen3 import Qwen3ForCausalLM
from .registry import FAMILIES, ModelFamily, config_from_pretrained, family_for_hf, family_of
from .sharding import LOGICAL_RULES, MeshConfig, make_mesh, shard_model
from .tiny import make_tiny

__all__ = [
    "PRESETS",
    "Qwen3Config",
    "UnsupportedModelError",
    "CheckpointError",
    "hf_param_shapes",
    "iter_hf_tensors",
    "load_hf",
    "save_hf",
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
