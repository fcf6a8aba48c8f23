"""gRPC sampler server (grpc.aio) in front of a `SamplerBackend`: `SamplerServer` (binding, TLS,
the push data plane, start/stop; stale staging of dead samplers removed at start) and
`ServerThread` (one in a background thread). The RPCs: service.py; the settings: server_config.py.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import shutil
import threading

import grpc

from ..backends.base import SamplerBackend
from ..push import data_plane
from ..push.staging_dirs import clean_stale_staging, staging_roots
from ..wire import sampler_pb2_grpc as pb_grpc
from .server_config import ServerConfig
from .service import SamplerService

log = logging.getLogger(__name__)

__all__ = ["SamplerServer", "ServerConfig", "ServerThread"]


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
        pb_grpc.add_service(self.service, self.server)
        bind = f"{self.cfg.host}:{self.cfg.port}"
        if self.cfg.tls_cert:
            key, cert = (
                pathlib.Path(str(f)).read_bytes() for f in (self.cfg.tls_key, self.cfg.tls_cert)
            )
            creds = grpc.ssl_server_credentials([(key, cert)])
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
        if self.service.warm_staging is not None:
            self.service.warm_staging.close()

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
