"""`Sampler`: what the trainer needs of a sampler (`SamplerClient`, `SamplerPool`, in process)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

from ..wire import safetensors_io as st
from ..wire import sampler_pb2 as pb
from ..wire.types import PushResult, Rollout, SamplingParams
from .retry import RetryPolicy

# "grpc": bytes in gRPC chunk messages; "socket": bytes over the server's raw TCP data port;
# "auto": socket when the server offers a data port (and the channel is not TLS), else grpc.
TRANSPORTS = ("grpc", "socket", "auto")


@runtime_checkable
class Sampler(Protocol):
    @property
    def address(self) -> str: ...

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        slot_ids: list[int] | None = None,
        request_id: str | None = None,
    ) -> Iterator[Rollout]: ...

    def push_weights(
        self,
        named_tensors: Any,
        version: int,
        *,
        dtype: str = "float32",
        chunk_bytes: int = 16 << 20,
        specs: Mapping[str, tuple[int, ...]] | None = None,
        transport: str = "grpc",
    ) -> PushResult: ...

    def push_model(
        self, model: Any, version: int, *, dtype: str = "float32", **options: Any
    ) -> PushResult: ...

    def info(self, *, timeout: float | None = None, retry: RetryPolicy | None = None) -> dict: ...

    def wait_ready(self, timeout: float = 120.0) -> dict: ...

    def metrics(self) -> dict[str, float]: ...

    def report(self) -> list[dict]: ...

    def rotation(self) -> list[bool]: ...

    def set_rotation(
        self, active: list[bool], version: int | None = None, reason: str = "set by caller"
    ) -> None: ...

    def close(self) -> None: ...


def slot_list(prompts: list[list[int]], slot_ids: list[int] | None) -> list[int]:
    """`slot_ids` (default 0..P-1), one per prompt (ValueError otherwise)."""
    if slot_ids is None:
        slot_ids = list(range(len(prompts)))
    if len(slot_ids) != len(prompts):
        raise ValueError(f"slot_ids has {len(slot_ids)} entries for {len(prompts)} prompts")
    return slot_ids


def check_transport(transport: str) -> str:
    """`transport` when it is one of `TRANSPORTS` (ValueError otherwise)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"push transport must be 'grpc', 'socket' or 'auto', got {transport!r}")
    return transport


def generate_request(
    prompts: list[list[int]],
    params: SamplingParams,
    slot_ids: list[int] | None,
    request_id: str | None = None,
) -> pb.GenerateRequest:
    """The Generate request (sent, or checked in process as a server would)."""
    return pb.GenerateRequest(
        request_id=request_id or "",
        prompts=[
            pb.Prompt(slot_id=int(s), token_ids=[int(t) for t in p])
            for s, p in zip(slot_list(prompts, slot_ids), prompts)
        ],
        params=params.to_proto(),
    )


class SamplerBase:
    """What every `Sampler` shares: `generate` (checked, then `_generate`) and `push_model`."""

    push_weights: Callable[..., PushResult]
    close: Callable[[], None]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        slot_ids: list[int] | None = None,
        request_id: str | None = None,
    ) -> Iterator[Rollout]:
        """One Rollout per (prompt, sample) in completion order; slot_ids one per prompt
        (default 0..P-1), request_id default a fresh one."""
        slots = slot_list(prompts, slot_ids)
        yield from self._generate(prompts, params, slots, request_id or uuid.uuid4().hex)

    def _generate(
        self, prompts: list[list[int]], params: SamplingParams, slot_ids: list[int], request_id: str
    ) -> Iterator[Rollout]:
        raise NotImplementedError

    def push_model(
        self, model: Any, version: int, *, dtype: str = "float32", **options: Any
    ) -> PushResult:
        """Push an NNX model with `push_weights` (``options``), one tensor at a time in `dtype`."""
        from dlc_jax.model import hf_param_shapes, iter_hf_tensors

        return self.push_weights(
            lambda: iter_hf_tensors(model, dtype=st.NP_DTYPES[dtype]),
            version,
            dtype=dtype,
            specs=hf_param_shapes(model.config),
            **options,
        )


class SingleSampler(SamplerBase):
    """The rotation part of `Sampler` for one sampler: no rotation or metrics, one status row."""

    address: str

    def metrics(self) -> dict[str, float]:
        return {}

    def report(self) -> list[dict]:
        return [{"index": 0, "address": self.address, "active": self.active, "last_error": ""}]

    @property
    def active(self) -> bool:
        return True

    def rotation(self) -> list[bool]:
        return []

    def set_rotation(
        self, active: list[bool], version: int | None = None, reason: str = "set by caller"
    ) -> None:
        if active:
            raise ValueError(
                f"set_rotation: a single sampler has no rotation, got {len(active)} flags"
            )
