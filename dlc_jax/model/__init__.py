"""dlc_jax.model: Flax NNX Qwen3, HF checkpoint I/O, mesh/sharding rules, tiny test models."""

from .config import PRESETS, Qwen3Config, UnsupportedModelError
from .hf_io import CheckpointError, hf_param_shapes, iter_hf_tensors, load_hf, save_hf
from .qwen3 import Qwen3ForCausalLM
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
    "LOGICAL_RULES",
    "MeshConfig",
    "make_mesh",
    "shard_model",
    "make_tiny",
]
