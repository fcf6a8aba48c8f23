"""``lora.push: adapter``: a resync sends the adapters alone (PEFT names) in a push stream whose
header carries rank/alpha and the frozen base's fingerprint, checked by the sampler before it
merges or loads them (`dlc_jax.sampler.push.adapter`; multi-host: `dlc_jax.trainer.lora_push`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dlc_jax.errors import UserError
from dlc_jax.lora.config import LoraConfig
from dlc_jax.sampler.push.adapter import AdapterMeta, base_fingerprint
from dlc_jax.sampler.wire.types import PushResult


class AdapterPushError(UserError):
    """``lora.push=adapter`` cannot push to this sampler."""


def adapter_tensors(model) -> list[tuple[str, np.ndarray]]:
    """(PEFT name, float32 array) of every adapter factor of ``model``, gathered to host."""
    from dlc_jax.lora.export import peft_tensors

    return list(peft_tensors(model))


def hf_base_fingerprint(model) -> str:
    """`base_fingerprint` of ``model``'s HF tensors (the frozen base; adapters not among them)."""
    from dlc_jax.model import iter_hf_tensors

    return base_fingerprint(iter_hf_tensors(model, dtype=np.float32))


def adapter_messages(
    tensors: list[tuple[str, np.ndarray]],
    version: int,
    meta: AdapterMeta,
    *,
    dtype: str = "float32",
    chunk_bytes: int = 16 << 20,
):
    """The PushWeights stream of an adapter push (header marked by ``meta``; CRC-32C)."""
    from dlc_jax.sampler.push.weight_stream import weight_messages

    shapes = [(n, tuple(a.shape)) for n, a in tensors]
    stream = weight_messages(
        iter(tensors), shapes, version, dtype, chunk_bytes, "crc32c", prefetch=0
    )
    first = next(stream)
    meta.fill(first.header)
    yield first
    yield from stream


def push_one(
    client, tensors: list[tuple[str, np.ndarray]], version: int, meta: AdapterMeta, dtype: str
) -> PushResult:
    """One adapter push to one `SamplerClient` (gRPC); a refusal comes back as ok=False."""
    r = client.push_messages(adapter_messages(tensors, version, meta, dtype=dtype))
    return PushResult(r.ok, r.version, r.message, r.bytes, r.seconds, code=r.code, transport="grpc")


class AdapterPusher:
    """Pushes a LoRA model's adapters; the frozen base is fingerprinted once."""

    def __init__(self, cfg: LoraConfig):
        self.cfg = cfg
        self._base: str | None = None

    def meta(self, model) -> AdapterMeta:
        if self._base is None:
            self._base = hf_base_fingerprint(model)
        return AdapterMeta(self.cfg.rank, self.cfg.alpha, self._base)

    def payload(self, model) -> tuple[list[tuple[str, np.ndarray]], AdapterMeta]:
        """The adapter factors (PEFT name, float32 host array) and the header's meta."""
        tensors = adapter_tensors(model)
        if not tensors:
            raise AdapterPushError("lora.push=adapter: the model has no LoRA adapters to push")
        return tensors, self.meta(model)

    def push(self, sampler: Any, model, version: int, *, dtype: str = "float32") -> PushResult:
        """Push the adapters as ``version`` to a client, a pool or an in-process sampler."""
        from dlc_jax.sampler.client.client import SamplerClient
        from dlc_jax.sampler.client.inprocess import InProcessSampler
        from dlc_jax.sampler.client.pool import SamplerPool
        from dlc_jax.sampler.wire.safetensors_io import NP_DTYPES

        tensors, meta = self.payload(model)
        one = lambda c: push_one(c, tensors, version, meta, dtype)  # noqa: E731
        if isinstance(sampler, SamplerClient):
            return one(sampler)
        if isinstance(sampler, InProcessSampler):  # rounded to the push dtype, as on the wire
            np_dtype = NP_DTYPES[dtype]
            return sampler.push_adapter(
                [(n, a.astype(np_dtype).astype(np.float32)) for n, a in tensors], version, meta
            )
        if isinstance(sampler, SamplerPool):
            return sampler.push_each(version, one)
        raise AdapterPushError(
            "lora.push=adapter: pushes to sampler servers (sampler.backend=jax or vllm) or the "
            f"inprocess sampler; this sampler ({type(sampler).__name__}) takes full weights only: "
            "set lora.push=merged"
        )


# samplers that merge an adapter of any rank into the base they loaded (their Info's backend)
MERGING_BACKENDS = ("jax", "inprocess")


def serves_adapters(info: Mapping[str, Any], rank: int) -> tuple[bool, str]:
    """(yes, why): whether a sampler serves rank-``rank`` adapter pushes, judged by its Info."""
    backend = str(info.get("backend") or "")
    if backend in MERGING_BACKENDS:
        return True, f"the {backend} sampler serves adapter pushes"
    if backend == "vllm":
        max_rank = int((info.get("backend_config") or {}).get("max_lora_rank") or 0)
        if max_rank >= rank:
            return True, f"the vllm sampler serves adapters up to rank {max_rank}"
        return False, (
            f"the vllm sampler serves no rank-{rank} adapter (started with --max-lora-rank "
            f"{max_rank})"
        )
    return False, f"the {backend or 'given'} sampler declares no adapter serving"


def choose_push(
    mode: str, rank: int, info: Mapping[str, Any] | None, *, base_issue: str = ""
) -> tuple[str, str]:
    """('adapter' | 'merged', why) of ``lora.push = mode``: 'auto' is 'adapter' when the sampler
    serves adapters and no ``base_issue`` makes its base differ from the trainer's."""
    if mode != "auto":
        return mode, f"lora.push={mode}"
    if base_issue:
        return "merged", f"lora.push=auto: {base_issue}"
    ok, why = serves_adapters(info or {}, rank)
    return ("adapter" if ok else "merged"), f"lora.push=auto: {why}"
