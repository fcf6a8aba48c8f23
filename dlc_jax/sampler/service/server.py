"""gRPC sampler server (grpc.aio) in front of a `SamplerBackend`; the RPCs: service.py."""

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
    """Owns the backend and the grpc.aio server: `await start()` / `await stop()`."""

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
        cfg = self.cfg
        clean_stale_staging(staging_roots(cfg.staging_root))  # copies left by killed samplers
        await self.backend.start()
        opts = [
            ("grpc.max_receive_message_length", cfg.max_message_bytes),
            ("grpc.max_send_message_length", cfg.max_message_bytes),
        ]
        self.server = grpc.aio.server(options=opts)
        pb_grpc.add_service(self.service, self.server)
        bind = f"{cfg.host}:{cfg.port}"
        if cfg.tls_cert:
            key, cert = (pathlib.Path(str(f)).read_bytes() for f in (cfg.tls_key, cfg.tls_cert))
            creds = grpc.ssl_server_credentials([(key, cert)])
            self.port = self.server.add_secure_port(bind, creds)
        else:
            self.port = self.server.add_insecure_port(bind)
        if not self.port:
            raise OSError(f"could not bind {bind}")
        if cfg.data_port is not None:
            dl = self.service.data_listener = data_plane.DataPlaneListener(
                cfg.host,
                cfg.data_port,
                cfg.token,
                preamble_timeout=cfg.data_auth_timeout_s,
                max_pending=cfg.data_max_pending,
            )
            log.info("push data plane (raw TCP, plaintext) on %s:%s", cfg.host, dl.port)
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


class ServerThread:
    """A SamplerServer on its own event loop (`.loop`) in a daemon thread (tests, embedding)."""

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
        if self._error is None:
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
