"""gRPC sampler server (grpc.aio) in front of a `SamplerBackend`.

Security/limits: binds 127.0.0.1 unless told otherwise; optional TLS (server cert + key); optional
shared token checked on every call (`authorization: Bearer <token>` metadata, else UNAUTHENTICATED);
bounded message sizes; every Generate request validated (INVALID_ARGUMENT with a message; the server
stays up; 0 < temperature < `min_temperature` is refused; a rollout with NaN log-probs is never
sent, the call fails INTERNAL). Weight pushes are serialized by a lock taken only once a header
arrived, bounded by an idle timeout and a maximum duration, staged to disk and verified (names,
shapes, dtypes, checksums, finite values, size vs free space: see staging.py), and applied only on
Commit; any failure or disconnect discards the staging and keeps the old weights. LoadWeights is off
unless `load_root` is set, reads only under it, never the directory being served, and applies the
same checks. Staging directories of dead samplers are removed at start.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hmac
import json
import logging
import pathlib
import shutil
import threading
import time

import grpc
import numpy as np

from . import chunk_wire, data_plane, push_session
from . import sampler_pb2 as pb
from . import sampler_pb2_grpc as pb_grpc
from .backends.base import SamplerBackend
from .load_checks import check_load_files, check_load_path
from .request_checks import RequestError, validate_generate
from .staging import PushError, WeightStager, clean_stale_staging, staging_roots

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0 = pick a free port
    token: str | None = None
    tls_cert: str | None = None  # PEM paths; both or neither
    tls_key: str | None = None
    max_message_bytes: int = 64 << 20
    max_prompts: int = 4096
    staging_root: str | None = None
    # Socket data plane for pushes (see data_plane.py): None = off (default), 0 = pick a free port.
    # Plaintext: loopback / trusted networks only, so it cannot be combined with TLS.
    data_port: int | None = None
    data_wait_s: float = 10.0  # how long a socket-plane push waits for its data connection
    data_auth_timeout_s: float = 5.0  # a data connection must send its full preamble within this
    data_max_pending: int = 64  # data connections awaiting their preamble or their push, at most
    # A push is discarded when its stream is silent for push_idle_timeout_s (also a stalled data
    # socket) or when it takes longer than push_max_s in all (lock wait included).
    push_idle_timeout_s: float = 60.0
    push_max_s: float = 900.0
    staging_reserve_bytes: int = 64 << 20  # free space a staged push must leave on its filesystem
    # LoadWeights reads only directories under load_root; None = LoadWeights disabled.
    load_root: str | None = None
    # 0 < temperature < min_temperature is refused (INVALID_ARGUMENT): vLLM silently raises such
    # temperatures to 0.01, and logits / T overflow float32 for tiny T.
    min_temperature: float = 0.01

    def __post_init__(self):
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("ServerConfig: tls_cert and tls_key must be given together")
        for k in ("push_idle_timeout_s", "push_max_s", "data_auth_timeout_s", "data_wait_s"):
            if not getattr(self, k) > 0:
                raise ValueError(f"ServerConfig.{k} must be > 0, got {getattr(self, k)!r}")
        if self.data_max_pending < 1:
            raise ValueError(
                f"ServerConfig.data_max_pending must be >= 1, got {self.data_max_pending!r}"
            )
        if self.data_port is not None and self.tls_cert is not None:
            raise ValueError(
                "ServerConfig: the push data port (raw TCP, unencrypted) cannot be used with TLS; "
                "use it only on loopback / trusted networks without TLS, or leave data_port off"
            )


class SamplerService(pb_grpc.SamplerServicer):
    def __init__(self, backend: SamplerBackend, cfg: ServerConfig):
        self.backend = backend
        self.cfg = cfg
        self._push_lock = asyncio.Lock()
        self._io_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="push-io")
        self._current_dir = pathlib.Path(backend.cfg.model_dir)
        self._owned_dir: pathlib.Path | None = None  # staged dir now serving (deleted on next swap)
        self.counters = {"tokens_generated": 0, "requests": 0, "pushes": 0, "rejected_pushes": 0}
        self.queue_depth = 0
        self.last_push_message = ""
        self.data_listener: data_plane.DataPlaneListener | None = None  # set by SamplerServer.start

    async def _auth(self, context) -> None:
        if self.cfg.token is None:
            return
        md = dict(context.invocation_metadata() or ())
        got = md.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {self.cfg.token}".encode()):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or wrong bearer token in 'authorization' metadata",
            )

    # -- Generate ---------------------------------------------------------------------------
    async def Generate(self, request, context):
        await self._auth(context)
        b = self.backend
        try:
            prompts, params = validate_generate(
                request,
                vocab_size=b.vocab_size,
                max_model_len=b.cfg.max_model_len,
                max_n=b.cfg.max_n,
                max_head_k=b.cfg.max_head_k,
                max_prompts=self.cfg.max_prompts,
                min_temperature=self.cfg.min_temperature,
            )
        except RequestError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        self.counters["requests"] += 1
        pending = len(prompts) * params.n
        self.queue_depth += pending
        rollouts = b.generate(request.request_id, prompts, params)
        try:
            async for r in rollouts:
                if np.isnan(r.logprobs).any() or np.isnan(r.head_logprobs).any():
                    log.error(
                        "engine returned NaN log-probs for request %r slot %s; answering INTERNAL",
                        request.request_id,
                        r.slot_id,
                    )
                    await context.abort(
                        grpc.StatusCode.INTERNAL,
                        f"engine returned NaN log-probs (request {request.request_id!r}, slot "
                        f"{r.slot_id}); "
                        "rollout withheld",
                    )
                self.counters["tokens_generated"] += len(r.response_ids)
                self.queue_depth -= 1
                pending -= 1
                yield r.to_proto()
        finally:  # also on client disconnect: stop the engine work for this request now
            self.queue_depth -= pending
            await rollouts.aclose()

    # -- weights ----------------------------------------------------------------------------
    async def _swap(self, path: pathlib.Path, version: int, owned: bool) -> None:
        old_dir, old_version = self._current_dir, self.backend.version
        try:
            await self.backend.apply_weights(str(path), version)
        except Exception as e:
            log.exception("applying weights v%s failed; restoring v%s", version, old_version)
            try:
                await self.backend.apply_weights(str(old_dir), old_version)
            except Exception:
                log.exception("restoring the previous weights failed too")
            raise PushError(
                grpc.StatusCode.INTERNAL,
                f"backend failed to apply version {version}: {e!r}; previous weights restored",
            ) from e
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
        self._current_dir = path
        self._owned_dir = path if owned else None

    async def _reject(self, context, e: PushError):
        self.counters["rejected_pushes"] += 1
        self.last_push_message = e.message
        log.warning("weight push rejected: %s", e.message)
        await context.abort(e.code, e.message)

    async def PushWeights(self, request_iterator, context):
        await self._auth(context)
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.push_max_s
        it = request_iterator.__aiter__()
        # The push lock is taken only once a header arrived: a stream that sends nothing (or junk)
        # never blocks the pushes behind it.
        try:
            first = await push_session.next_message(it, deadline, self.cfg, "the header")
            if (
                first is None
                or isinstance(first, chunk_wire.RawChunk)
                or first.WhichOneof("kind") != "header"
            ):
                raise PushError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "a push must start with a WeightHeader message",
                )
            try:
                await asyncio.wait_for(
                    self._push_lock.acquire(), max(deadline - loop.time(), 0.001)
                )
            except TimeoutError:
                raise PushError(
                    grpc.StatusCode.ABORTED,
                    f"another push held the push lock for the whole {self.cfg.push_max_s:g}s "
                    "push duration",
                ) from None
        except PushError as e:
            await self._reject(context, e)
        try:
            return await self._push_locked(first.header, it, deadline, context, t0)
        finally:
            self._push_lock.release()

    async def _push_locked(self, header, it, deadline: float, context, t0: float):
        stager = WeightStager(
            self.backend.expected_tensors(),
            self.backend.version,
            self.cfg.staging_root,
            reserve_bytes=self.cfg.staging_reserve_bytes,
        )
        applied = False
        error: PushError | None = None
        try:
            path = await push_session.receive(
                stager, header, it, deadline, self.cfg, self._io_pool, self.data_listener
            )
            assert stager.version is not None
            swap = asyncio.ensure_future(self._swap(path, stager.version, owned=True))
            try:
                await asyncio.shield(swap)
            except asyncio.CancelledError:  # client went away during the swap: finish it anyway
                await swap
                applied = True
                raise
            applied = True
        except PushError as e:
            error = e
        finally:
            if not applied:
                stager.discard()
                if error is None:  # cancelled / disconnected mid-push
                    self.counters["rejected_pushes"] += 1
                    self.last_push_message = "client disconnected before Commit; push discarded"
                    log.warning(self.last_push_message)
        if error is not None:
            await self._reject(context, error)
        self.counters["pushes"] += 1
        dt = time.perf_counter() - t0
        self.last_push_message = f"version {stager.version} applied"
        return pb.PushResult(
            ok=True,
            version=self.backend.version,
            message=self.last_push_message,
            bytes=stager.bytes_received,
            seconds=dt,
        )

    async def LoadWeights(self, request, context):
        await self._auth(context)
        t0 = time.perf_counter()
        async with self._push_lock:
            try:
                serving = [self._current_dir] + ([self._owned_dir] if self._owned_dir else [])
                path = check_load_path(request.path, self.cfg.load_root, serving)
                if request.version <= self.backend.version:
                    raise PushError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"stale version {request.version}: server already serves version "
                        f"{self.backend.version}",
                    )
                expected = self.backend.expected_tensors()
                await asyncio.get_running_loop().run_in_executor(
                    self._io_pool, check_load_files, path, expected
                )
                await self._swap(path, int(request.version), owned=False)
            except PushError as e:
                await self._reject(context, e)
            self.counters["pushes"] += 1
            return pb.PushResult(
                ok=True,
                version=self.backend.version,
                message=f"loaded {path}",
                seconds=time.perf_counter() - t0,
            )

    async def Info(self, request, context):
        await self._auth(context)
        b = self.backend
        return pb.InfoResponse(
            model_config_json=json.dumps(b.model_config),
            version=b.version,
            backend=b.name,
            queue_depth=max(self.queue_depth, 0),
            tokens_generated=self.counters["tokens_generated"],
            requests=self.counters["requests"],
            pushes=self.counters["pushes"],
            rejected_pushes=self.counters["rejected_pushes"],
            vocab_size=b.vocab_size,
            max_model_len=b.cfg.max_model_len,
            max_n=b.cfg.max_n,
            max_head_k=b.cfg.max_head_k,
            backend_config_json=b.cfg.to_json(),
            data_port=self.data_listener.port if self.data_listener is not None else 0,
        )


def add_sampler_service(servicer: SamplerService, server) -> None:
    """Register the Sampler service like `pb_grpc.add_SamplerServicer_to_server`, except that
    PushWeights requests are decoded by `chunk_wire.decode_weight_message` (chunk bytes not
    copied)."""
    rpc_method_handlers = {
        "Generate": grpc.unary_stream_rpc_method_handler(
            servicer.Generate,
            request_deserializer=pb.GenerateRequest.FromString,
            response_serializer=pb.Rollout.SerializeToString,
        ),
        "PushWeights": grpc.stream_unary_rpc_method_handler(
            servicer.PushWeights,
            request_deserializer=chunk_wire.decode_weight_message,
            response_serializer=pb.PushResult.SerializeToString,
        ),
        "LoadWeights": grpc.unary_unary_rpc_method_handler(
            servicer.LoadWeights,
            request_deserializer=pb.LoadWeightsRequest.FromString,
            response_serializer=pb.PushResult.SerializeToString,
        ),
        "Info": grpc.unary_unary_rpc_method_handler(
            servicer.Info,
            request_deserializer=pb.InfoRequest.FromString,
            response_serializer=pb.InfoResponse.SerializeToString,
        ),
    }
    service = "dlc_jax.sampler.v1.Sampler"
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, rpc_method_handlers),)
    )
    server.add_registered_method_handlers(service, rpc_method_handlers)


class SamplerServer:
    """Owns the backend and the grpc.aio server. Use `await start()` / `await stop()` inside an
    event loop, or `ServerThread` to run it in a background thread."""

    def __init__(self, backend: SamplerBackend, cfg: ServerConfig | None = None):
        self.backend = backend
        self.cfg = cfg or ServerConfig()
        self.service = SamplerService(backend, self.cfg)
        self.server: grpc.aio.Server | None = None
        self.port: int | None = None

    @property
    def address(self) -> str:
        return f"{self.cfg.host}:{self.port}"

    async def start(self) -> int:
        clean_stale_staging(staging_roots(self.cfg.staging_root))  # copies left by killed samplers
        await self.backend.start()
        opts = [
            ("grpc.max_receive_message_length", self.cfg.max_message_bytes),
            ("grpc.max_send_message_length", self.cfg.max_message_bytes),
        ]
        self.server = grpc.aio.server(options=opts)
        add_sampler_service(self.service, self.server)
        bind = f"{self.cfg.host}:{self.cfg.port}"
        if self.cfg.tls_cert:
            creds = grpc.ssl_server_credentials(
                [
                    (
                        pathlib.Path(str(self.cfg.tls_key)).read_bytes(),
                        pathlib.Path(str(self.cfg.tls_cert)).read_bytes(),
                    )
                ]
            )
            self.port = self.server.add_secure_port(bind, creds)
        else:
            self.port = self.server.add_insecure_port(bind)
        if not self.port:
            raise OSError(f"could not bind {bind}")
        if self.cfg.data_port is not None:
            self.service.data_listener = data_plane.DataPlaneListener(
                self.cfg.host,
                self.cfg.data_port,
                self.cfg.token,
                preamble_timeout=self.cfg.data_auth_timeout_s,
                max_pending=self.cfg.data_max_pending,
            )
            log.info(
                "push data plane (raw TCP, plaintext) on %s:%s",
                self.cfg.host,
                self.service.data_listener.port,
            )
        await self.server.start()
        log.info("sampler (%s) listening on %s", self.backend.name, self.address)
        return self.port

    async def stop(self, grace: float = 1.0) -> None:
        if self.server is not None:
            await self.server.stop(grace)
        if self.service.data_listener is not None:
            self.service.data_listener.close()
            self.service.data_listener = None
        await self.backend.close()
        if self.service._owned_dir is not None:
            shutil.rmtree(self.service._owned_dir, ignore_errors=True)

    async def wait(self) -> None:
        assert self.server is not None, "wait() before start()"
        await self.server.wait_for_termination()


class ServerThread:
    """Run a SamplerServer on its own event loop in a daemon thread (tests, embedding).
    `.loop` lets callers run coroutines against the backend on the server's loop."""

    def __init__(self, backend: SamplerBackend, cfg: ServerConfig | None = None):
        self.server = SamplerServer(backend, cfg)
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="sampler-server")

    def _run(self):
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.start())
        except BaseException as e:  # reported to start()
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    def start(self, timeout: float = 300) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("sampler server did not start")
        if self._error is not None:
            raise RuntimeError(f"sampler server failed to start: {self._error!r}") from self._error
        return self

    @property
    def address(self) -> str:
        return self.server.address

    def run(self, coro, timeout: float | None = None):
        """Run a coroutine on the server loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self._thread.is_alive():
            self.run(self.server.stop())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
