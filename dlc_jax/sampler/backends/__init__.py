"""Sampler backends: `vllm` (AsyncLLM) and `jax` (the project's Qwen3 with a KV cache)."""

from __future__ import annotations

from .base import BackendConfig, SamplerBackend


def make_backend(name: str, cfg: BackendConfig) -> SamplerBackend:
    """Construct (not start) a backend by name."""
    if name == "vllm":
        from .vllm_backend import VLLMBackend

        return VLLMBackend(cfg)
    if name == "jax":
        from .jax_backend import JaxBackend

        return JaxBackend(cfg)
    raise ValueError(f"unknown sampler backend {name!r} (expected 'vllm' or 'jax')")


__all__ = ["BackendConfig", "SamplerBackend", "make_backend"]
