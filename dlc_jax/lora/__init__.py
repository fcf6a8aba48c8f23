"""LoRA RL: rank-r adapters on the projections, trained alone (see ``adapters`` and ``config``)."""

from dlc_jax.lora.adapters import (
    LoraParam,
    adapter_parameter_count,
    apply_lora,
    merged_model,
    trainable_filter,
)
from dlc_jax.lora.base_check import base_fingerprint, base_meta, check_base
from dlc_jax.lora.config import LoraConfig

__all__ = [
    "LoraConfig",
    "LoraParam",
    "adapter_parameter_count",
    "apply_lora",
    "base_fingerprint",
    "base_meta",
    "check_base",
    "merged_model",
    "trainable_filter",
]
