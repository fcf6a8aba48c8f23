"""The interface every sampler backend implements, and its config."""

from __future__ import annotations

import abc
import dataclasses
import json
import pathlib
from collections.abc import AsyncIterator
from typing import Protocol

import numpy as np

from ..wire import safetensors_io as st
from ..wire.types import Rollout, SamplingParams


@dataclasses.dataclass
class BackendConfig:
    """Engine settings shared by the backends (each ignores knobs it does not have): `quantization`
    is vLLM's name, or "int8" / "fp8_e4m3" (JAX); `weight_noise`: sigma relative to tensor rms."""

    model_dir: str
    dtype: str = "float32"
    quantization: str | None = None
    tensor_parallel_size: int = 1
    max_model_len: int = 512
    max_n: int = 64
    max_head_k: int = 20
    max_num_seqs: int = 64
    seed: int = 0
    initial_version: int = 0
    enforce_eager: bool = True
    weight_noise: float = 0.0
    weight_noise_seed: int = 0
    max_batch: int = 32  # JAX backend: sequences decoded together (static shape)
    # vLLM KV cache size; None = 1 GiB on CPU (unless VLLM_CPU_KVCACHE_SPACE), vLLM default on GPU
    kv_cache_gib: float | None = None
    # the largest LoRA adapter rank served; 0 = none (vLLM: LoRA off; JAX: ignored, any rank)
    max_lora_rank: int = 0

    def __post_init__(self):
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(
                f"BackendConfig.dtype must be 'float32' or 'bfloat16', got {self.dtype!r}"
            )
        for k in ("max_model_len", "max_n", "max_num_seqs", "tensor_parallel_size", "max_batch"):
            if getattr(self, k) < 1:
                raise ValueError(f"BackendConfig.{k} must be >= 1, got {getattr(self, k)!r}")
        for k in ("max_lora_rank", "weight_noise"):
            if getattr(self, k) < 0:
                raise ValueError(f"BackendConfig.{k} must be >= 0, got {getattr(self, k)!r}")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


def read_model_config(model_dir: str) -> dict:
    path = pathlib.Path(model_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"model directory {model_dir} has no config.json")
    return json.loads(path.read_text())


class WeightLoad(Protocol):
    """A push loaded into the engine tensor by tensor: `add` once per verified tensor, from one
    thread (the array is valid only during the call); served only after `apply_load`."""

    def add(self, name: str, array: np.ndarray) -> None: ...


class SamplerBackend(abc.ABC):
    """A generation engine with versioned, atomically swappable weights: `generate` yields one
    Rollout per (prompt, sample); tokens after a swap come from the new weights only."""

    name: str = "base"

    def __init__(self, cfg: BackendConfig):
        self.cfg = cfg
        self.model_config = read_model_config(cfg.model_dir)
        self.vocab_size = int(self.model_config["vocab_size"])
        self.version = int(cfg.initial_version)
        self._expected = st.read_specs(cfg.model_dir)
        self._base_fp: str | None = None  # `base_fingerprint`, once computed

    def limits(self) -> dict[str, int]:
        """The request limits Info reports and Generate enforces."""
        names = ("max_model_len", "max_n", "max_head_k")
        return {"vocab_size": self.vocab_size, **{k: getattr(self.cfg, k) for k in names}}

    def expected_tensors(self) -> st.Specs:
        """{hf_name: (shape, dtype)} that a full weight push must provide."""
        return dict(self._expected)

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    def generate(
        self, request_id: str, prompts: list[tuple[int, list[int]]], params: SamplingParams
    ) -> AsyncIterator[Rollout]:
        """prompts: [(slot_id, token_ids)]. Yields rollouts in completion order."""

    @abc.abstractmethod
    async def apply_weights(self, weights_dir: str, version: int) -> None: ...

    def begin_load(self) -> WeightLoad | None:
        """A tensor-by-tensor load of the next push, or None (`apply_weights` at commit)."""
        return None

    async def apply_load(self, load: WeightLoad, version: int) -> None:
        """Serve the weights of a completed `begin_load()` as `version`, atomically."""
        raise NotImplementedError(f"{self.name} backend has no in-memory load")

    # -- LoRA adapter pushes (`dlc_jax.sampler.push.adapter`) ---------------------------------
    def adapter_base(self, rank: int) -> str:
        """The fingerprint of the base an adapter of ``rank`` is merged into, or ValueError."""
        raise ValueError(f"the {self.name} backend does not serve LoRA adapter pushes")

    def base_fingerprint(self) -> str:
        """`adapter_push.base_fingerprint` of the model directory (computed once)."""
        if self._base_fp is None:
            from ..push.adapter import base_fingerprint

            self._base_fp = base_fingerprint(st.iter_tensors(self.cfg.model_dir))
        return self._base_fp

    async def apply_adapter(self, adapter_dir: str, version: int, meta) -> None:
        """Serve base + the adapter in ``adapter_dir`` as ``version`` (atomically)."""
        raise NotImplementedError(f"{self.name} backend serves no adapters")

    @abc.abstractmethod
    async def close(self) -> None: ...
