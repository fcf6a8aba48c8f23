"""Trainer-side gRPC client for the sampler service (`SamplerClient`). Calls failing with
UNAVAILABLE are retried (`retry`): `generate` only before its first rollout (no duplicates),
`push_weights` only with a re-iterable source."""

from __future__ import annotations

import collections.abc as cabc
import contextlib
import dataclasses
import json
import pathlib
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc

from ..push import data_plane
from ..push.weight_stream import TensorSource, prefetched, tensor_source, weight_messages
from ..wire import sampler_pb2 as pb
from ..wire import sampler_pb2_grpc as pb_grpc
from ..wire.types import PushResult, Rollout
from .protocol import SingleSampler, check_transport, generate_request
from .retry import NO_RETRY, RetryPolicy, call_with_retry

__all__ = ["SamplerClient", "REJECT_CODES", "prefetched"]

REJECT_CODES = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.INTERNAL,
)


class SamplerClient(SingleSampler):
    """One sampler server over gRPC: `timeout` is a call's default deadline (s); `retry` (or
    max_retries / backoff / max_backoff) the `RetryPolicy` for UNAVAILABLE."""

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls_root_cert: str | bytes | None = None,
        timeout: float = 600.0,
        max_retries: int = 5,
        backoff: float = 0.25,
        max_backoff: float = 8.0,
        retry: RetryPolicy | None = None,
        max_message_bytes: int = 64 << 20,
        tls_server_name: str | None = None,
    ):
        self.address = address
        self.token = token
        self.timeout = timeout
        self.retry = retry or RetryPolicy(
            max_retries=max_retries, backoff=backoff, max_backoff=max_backoff
        )
        self.max_message_bytes = max_message_bytes
        self.tls = tls_root_cert is not None
        opts: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        if tls_server_name:
            opts.append(("grpc.ssl_target_name_override", tls_server_name))
        if tls_root_cert is not None:
            pem = tls_root_cert
            pem = pem if isinstance(pem, bytes) else pathlib.Path(pem).read_bytes()
            self.channel = grpc.secure_channel(
                address, grpc.ssl_channel_credentials(root_certificates=pem), options=opts
            )
        else:
            self.channel = grpc.insecure_channel(address, options=opts)
        self.stub = pb_grpc.SamplerStub(self.channel)

    def _md(self):
        return (("authorization", f"Bearer {self.token}"),) if self.token else None

    def close(self) -> None:
        self.channel.close()

    def _info_proto(
        self, timeout: float | None = None, retry: RetryPolicy | None = None
    ) -> pb.InfoResponse:
        t = self.timeout if timeout is None else timeout
        return call_with_retry(
            lambda: self.stub.Info(pb.InfoRequest(), timeout=t, metadata=self._md()),
            self.retry if retry is None else retry,
        )

    def info(self, *, timeout: float | None = None, retry: RetryPolicy | None = None) -> dict:
        """The server's Info as a dict (`x_json` fields decoded, as `x`)."""
        r = self._info_proto(timeout, retry)
        out = {f.name: getattr(r, f.name) for f in r.DESCRIPTOR.fields}
        return {
            k.removesuffix("_json"): json.loads(v or "{}") if k.endswith("_json") else v
            for k, v in out.items()
        }

    def wait_ready(self, timeout: float = 120.0) -> dict:
        """Poll Info every 0.2 s until it answers (raises TimeoutError; UNAUTHENTICATED at once)."""
        poll = RetryPolicy(max_retries=None, backoff=0.2, max_backoff=0.2, deadline_s=timeout)

        def not_auth(e: BaseException) -> bool:
            return isinstance(e, grpc.RpcError) and e.code() != grpc.StatusCode.UNAUTHENTICATED

        try:
            return call_with_retry(lambda: self.info(retry=NO_RETRY), poll, retryable=not_auth)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise
            raise TimeoutError(f"sampler at {self.address} not ready after {timeout}s: {e}") from e

    def _generate(self, prompts, params, slot_ids, request_id) -> Iterator[Rollout]:
        req = generate_request(prompts, params, slot_ids, request_id)

        def open_stream():  # retried until the first message arrives; never after (no duplicates)
            stream = self.stub.Generate(req, timeout=self.timeout, metadata=self._md())
            return next(stream, None), stream

        first, stream = call_with_retry(open_stream, self.retry)
        try:
            if first is None:
                return
            yield Rollout.from_proto(first)
            for m in stream:
                yield Rollout.from_proto(m)
        finally:
            stream.cancel()  # a consumer that stops early ends the call (no-op once it completed)

    def push_messages(self, messages: Iterable[pb.WeightMessage | bytes]) -> PushResult:
        """Send a raw stream of WeightMessages or their bytes (no retry); rejections: ok=False."""
        return self._answer(
            lambda: self.stub.PushWeights(iter(messages), timeout=self.timeout, metadata=self._md())
        )

    def _answer(self, call: Callable[[], pb.PushResult]) -> PushResult:
        """`call()`'s PushResult; a rejection (`REJECT_CODES`) comes back as ok=False with the
        version the server still serves (-1 when it does not answer Info either)."""
        try:
            return PushResult.from_proto(call())
        except grpc.RpcError as e:
            if e.code() not in REJECT_CODES:
                raise
            try:
                v = self.info(retry=NO_RETRY)["version"]
            except grpc.RpcError:
                v = -1
            return PushResult(False, v, e.details() or "", code=e.code().name)

    def push_with_data(
        self, messages: Callable[[Callable[[int, memoryview], None], str], Iterable]
    ) -> PushResult:
        """A push over the socket data plane: the stream ``messages(send_data, push_id)``, whose
        ``send_data(tensor_index, bytes)`` writes to a data connection under a fresh push id."""
        if self.tls:
            raise ValueError(
                "push transport 'socket' is plaintext raw TCP and is refused on a TLS channel; "
                "use transport='grpc' (or no TLS on loopback / a trusted network)"
            )
        push_id = uuid.uuid4().hex
        sock = self._open_data(push_id)
        try:
            return self.push_messages(
                messages(lambda i, buf: self._send_data(sock, i, buf), push_id)
            )
        finally:
            with contextlib.suppress(OSError):  # also wakes a sendall blocked on a server gone
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def push_weights(
        self,
        named_tensors,
        version: int,
        *,
        dtype: str = "float32",
        chunk_bytes: int = 16 << 20,
        specs: cabc.Mapping[str, tuple[int, ...]] | None = None,
        checksum: str = "crc32c",
        transport: str = "grpc",
        relay_to: cabc.Sequence[str] = (),
        relay_fanout: int = 1,
    ) -> PushResult:
        """Stream a full set of HF-named tensors (a `weight_stream.tensor_source`) as `version`,
        converted to `dtype` one at a time; `transport` one of `protocol.TRANSPORTS`; `relay_to` /
        `relay_fanout`: samplers the receiver forwards the push to (`PushResult.relayed`)."""
        if check_transport(transport) == "auto":
            transport = self.push_transport()
        if not 0 < chunk_bytes <= self.max_message_bytes - 64:
            raise ValueError(
                f"chunk_bytes = {chunk_bytes} must be in (0, max_message_bytes - 64 = "
                f"{self.max_message_bytes - 64}] (a chunk message carries ~30 bytes of framing)"
            )
        if checksum not in ("crc32c", "sha256"):
            raise ValueError(f"push checksum must be 'crc32c' or 'sha256', got {checksum!r}")
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"push dtype must be float32, bfloat16 or float16, got {dtype!r}")
        if relay_fanout < 1:
            raise ValueError(f"relay_fanout must be >= 1, got {relay_fanout}")
        src = tensor_source(named_tensors, specs)
        relay = (tuple(relay_to), int(relay_fanout))
        result = call_with_retry(
            lambda: self._push_once(src, version, dtype, chunk_bytes, checksum, transport, relay),
            self.retry if src.reiterable else NO_RETRY,
        )
        return dataclasses.replace(result, transport=transport)

    def push_transport(self) -> str:
        """'socket' when the server offers a data port and the channel is plaintext, else 'grpc'."""
        if self.tls:
            return "grpc"
        return "socket" if self._info_proto().data_port else "grpc"

    # socket data plane hooks (tests override them to corrupt / cut / mislabel the data connection)
    def _data_preamble(self, push_id: str) -> bytes:
        return data_plane.preamble(push_id, self.token)

    def _send_data(self, sock: socket.socket, tensor_index: int, buf: memoryview) -> None:
        sock.sendall(buf)

    def _open_data(self, push_id: str) -> socket.socket:
        port = self._info_proto().data_port
        if not port:
            raise ValueError(
                f"sampler at {self.address} offers no push data port (start it with "
                "--push-data-port; never offered with TLS); use transport='grpc'"
            )
        host = self.address.rsplit(":", 1)[0].strip("[]")
        if host.startswith("ipv4:") or host.startswith("ipv6:"):
            host = host.split(":", 1)[1].strip("[]")
        sock = socket.create_connection((host, port), timeout=self.timeout)
        try:
            sock.sendall(self._data_preamble(push_id))
        except BaseException:
            sock.close()
            raise
        return sock

    def _push_once(
        self, src: TensorSource, version: int, dtype: str, chunk_bytes: int, checksum: str,
        transport: str, relay: tuple[tuple[str, ...], int] = ((), 1),
    ) -> PushResult:  # fmt: skip
        sent: list[int] = []  # tensor bytes handed to the transport by this attempt (egress)

        def stream(send_data=None, push_id: str = ""):
            return weight_messages(
                src.open(), src.names_shapes, version, dtype, chunk_bytes, checksum,
                send_data=send_data, push_id=push_id, relay_to=relay[0], relay_fanout=relay[1],
                on_sent=sent.append,
            )  # fmt: skip

        r = self.push_with_data(stream) if transport == "socket" else self.push_messages(stream())
        return dataclasses.replace(r, egress_bytes=sum(sent))

    def load_weights(self, path: str, version: int) -> PushResult:
        """Ask the server to load an HF safetensors directory it can read (shared storage)."""
        req = pb.LoadWeightsRequest(path=str(path), version=int(version))
        return self._answer(
            lambda: call_with_retry(
                lambda: self.stub.LoadWeights(req, timeout=self.timeout, metadata=self._md()),
                self.retry,
            )
        )
