"""Model families keyed by the HF `model_type`: each architecture's config class, NNX module, HF
tensor names, matmul parameter counts and sampler support. Code outside `dlc_jax.model` asks the
registry (`family_of(config)`, `config_from_pretrained(path)`, `build_model(config)`) instead of
naming a family. Module classes are imported lazily (light modules such as the plan import this)."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

from .config import UnsupportedModelError, read_hf_config


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """One architecture: HF identity, where its pieces live, what it supports."""

    model_type: str  # HF config.json "model_type"
    architecture: str  # HF config.json "architectures"[0]
    config_module: str  # "dlc_jax.model.config:Qwen3Config"
    model_module: str  # "dlc_jax.model.qwen3:Qwen3ForCausalLM"
    # config -> {HF name: HF shape}; (config, active) -> matmul parameter counts
    names_module: str = "dlc_jax.model.hf_names:qwen3_param_shapes"
    counts_module: str = "dlc_jax.model.hf_names:qwen3_matmul_params"
    samplers: tuple[str, ...] = ("jax", "vllm")  # sampler backends that can run the family
    routed_experts: bool = False  # forward returns/accepts routed expert ids (routing replay)

    @property
    def config_cls(self) -> Any:
        return _resolve(self.config_module)

    @property
    def model_cls(self) -> Any:
        return _resolve(self.model_module)

    def hf_param_shapes(self, config) -> dict[str, tuple[int, ...]]:
        """HF tensor name -> HF shape, in checkpoint order."""
        return _resolve(self.names_module)(config)

    def matmul_params(self, config, *, active: bool = True) -> dict[str, int]:
        """Matmul parameter counts over the decoder layers: {'decoder': all, 'down': MLP down
        projections, 'vocab': the output projection}; `active`: what one token multiplies."""
        return _resolve(self.counts_module)(config, active=active)


def _resolve(spec: str) -> Any:
    mod, _, attr = spec.partition(":")
    return getattr(importlib.import_module(mod), attr)


FAMILIES: dict[str, ModelFamily] = {}


def register(family: ModelFamily) -> ModelFamily:
    FAMILIES[family.model_type] = family
    return family


for _family in (
    ModelFamily(
        model_type="qwen3",
        architecture="Qwen3ForCausalLM",
        config_module="dlc_jax.model.config:Qwen3Config",
        model_module="dlc_jax.model.qwen3:Qwen3ForCausalLM",
    ),
    ModelFamily(
        model_type="qwen3_moe",
        architecture="Qwen3MoeForCausalLM",
        config_module="dlc_jax.model.config:Qwen3MoeConfig",
        model_module="dlc_jax.model.qwen3_moe:Qwen3MoeForCausalLM",
        routed_experts=True,
    ),
):
    register(_family)


def family_for_hf(d: dict[str, Any]) -> ModelFamily:
    """The family of an HF config dict: by `model_type`, else by `architectures`."""
    model_type = d.get("model_type")
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    archs = d.get("architectures") or []
    for f in FAMILIES.values():
        if f.architecture in archs:
            return f
    known = sorted(f"{f.model_type} ({f.architecture})" for f in FAMILIES.values())
    raise UnsupportedModelError(
        f"unsupported architecture {archs} (model_type={model_type!r}); dlc_jax.model supports "
        f"{known}"
    )


def family_of(config) -> ModelFamily:
    """The family whose config class `config` is an instance of."""
    for f in FAMILIES.values():
        if type(config) is f.config_cls:
            return f
    raise UnsupportedModelError(f"no model family for config type {type(config).__name__}")


def config_from_hf(d: dict[str, Any], **options):
    """The family's config for an HF config dict (`options`: run options such as scan_layers)."""
    return family_for_hf(d).config_cls.from_hf_dict(d, **options)


def config_from_pretrained(path, **options):
    """The family's config read from `path` (a directory or a config.json file)."""
    return config_from_hf(read_hf_config(path), **options)


def build_model(config, **kwargs):
    cls: Callable[..., Any] = family_of(config).model_cls
    return cls(config, **kwargs)
