"""`Sampler`: what the trainer needs from a sampler service, one server (`SamplerClient`) or many
(`SamplerPool`). Both implement it; the trainer talks to this interface only.

generate: stream one `Rollout` per (prompt, sample) in completion order.
push_model / push_weights: a full weight version (atomic per sampler: swapped only on Commit).
info: the serving sampler's Info (version, backend, data_port, ...); `timeout`/`retry` per call.
wait_ready: block until it answers Info. metrics / report: numeric rotation metrics (`pool/*`; empty
for one server) and per-sampler status dicts. rotation / set_rotation: in-rotation flag per sampler
(empty for one server, which has no rotation) and imposing one decided elsewhere (multi-host).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

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
        self,
        model: Any,
        version: int,
        *,
        dtype: str = "float32",
        chunk_bytes: int = 16 << 20,
        transport: str = "grpc",
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


def generate_request(
    prompts: list[list[int]],
    params: SamplingParams,
    slot_ids: list[int] | None,
    request_id: str | None = None,
) -> pb.GenerateRequest:
    """The Generate request a sampler checks and serves (`service.request_checks`): the remote
    client sends it, the in-process sampler checks it as a server would."""
    return pb.GenerateRequest(
        request_id=request_id or "",
        prompts=[
            pb.Prompt(slot_id=int(s), token_ids=[int(t) for t in p])
            for s, p in zip(slot_list(prompts, slot_ids), prompts)
        ],
        params=params.to_proto(),
    )


class SingleSampler:
    """What one sampler (`SamplerClient`, `InProcessSampler`) answers to the rotation part of
    `Sampler`: no rotation, no `pool/*` metrics, one status row."""

    address: str

    def metrics(self) -> dict[str, float]:
        """Rotation metrics: none for a single sampler (a pool reports `pool/*`)."""
        return {}

    def report(self) -> list[dict]:
        """One status dict (address, active) in the shape of `SamplerPool.report`."""
        return [{"index": 0, "address": self.address, "active": self.active, "last_error": ""}]

    @property
    def active(self) -> bool:
        return True

    def rotation(self) -> list[bool]:
        """Empty: a single sampler has no rotation to agree on."""
        return []

    def set_rotation(
        self, active: list[bool], version: int | None = None, reason: str = "set by caller"
    ) -> None:
        if active:
            raise ValueError(
                f"set_rotation: a single sampler has no rotation, got {len(active)} flags"
            )
