"""Run `python -m dlc_jax.sampler.service.cli serve ...` as a subprocess on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings

from ..client.client import SamplerClient
from ..push.staging_dirs import clean_stale_staging, staging_roots
from .malloc_env import with_huge_pages


def _die_with_parent() -> None:
    """Linux: SIGTERM the server when the thread that started it dies (no orphaned samplers)."""
    with contextlib.suppress(OSError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class SamplerProcess:
    """A sampler server subprocess; `start` waits for its 'LISTENING host:port' log line and Info.
    extra_args: more `serve` flags; token / tls_*: how `client()` connects."""

    def __init__(
        self,
        backend: str,
        model_dir: str,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        log_file: str | None = None,
        token: str | None = None,
        tls_root_cert: str | None = None,
        tls_server_name: str | None = None,
        startup_timeout: float = 300.0,
        die_with_parent: bool = True,
    ):
        self.backend, self.model_dir, self.host, self.port = backend, model_dir, host, port
        self.extra_args, self.env = list(extra_args or []), dict(env or {})
        self.log_file, self.token = log_file, token
        self.tls_root_cert, self.tls_server_name = tls_root_cert, tls_server_name
        self.startup_timeout, self.die_with_parent = startup_timeout, die_with_parent
        self.proc: subprocess.Popen | None = None
        self.address: str | None = None

    def start(self) -> SamplerProcess:
        if self.log_file is None:
            fd, self.log_file = tempfile.mkstemp(prefix="dlc_sampler_", suffix=".log")
            os.close(fd)
        cmd = [sys.executable, "-m", "dlc_jax.sampler.service.cli", "serve"]
        cmd += ["--backend", self.backend, "--model", self.model_dir, "--host", self.host]
        cmd += ["--port", str(self.port), *self.extra_args]
        if self.token:
            cmd += ["--token", self.token]
        env = with_huge_pages({**os.environ, **self.env})  # malloc_env: faster weight loads
        self._log = open(self.log_file, "wb")
        # own process group: kill() also takes down engine children (vLLM's EngineCore process)
        with warnings.catch_warnings():  # JAX's fork warning: the child runs only prctl, then exec
            warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
            self.proc = subprocess.Popen(
                cmd,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        deadline = time.monotonic() + self.startup_timeout
        while self.address is None:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"sampler exited with {self.proc.returncode} during startup; log "
                    f"{self.log_file}:\n" + self.log_tail()
                )
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(
                    f"sampler did not start in {self.startup_timeout}s; log {self.log_file}"
                )
            for line in open(self.log_file, errors="replace"):
                if line.startswith("LISTENING "):
                    self.address = line.split()[1]
            time.sleep(0.2)
        with self.client() as c:
            c.wait_ready(max(1.0, deadline - time.monotonic()))
        return self

    def log_tail(self, n: int = 4000) -> str:
        try:
            return open(str(self.log_file), errors="replace").read()[-n:]
        except OSError:
            return ""

    def client(self, **kw) -> SamplerClient:
        assert self.address is not None, "client() before start()"
        tls = {"tls_root_cert": self.tls_root_cert, "tls_server_name": self.tls_server_name}
        return SamplerClient(self.address, **{"token": self.token, **tls, **kw})

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (graceful: engine down, staging deleted), wait `timeout` s, then `kill`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        self.kill()  # leftovers in the group, if any
        return self.proc.returncode if self.proc else None

    def _staging_root(self) -> str | None:
        args = self.extra_args
        for i, a in enumerate(args):
            if a == "--staging-root" and i + 1 < len(args):
                return args[i + 1]
            if a.startswith("--staging-root="):
                return a.split("=", 1)[1]
        return None

    def kill(self) -> None:
        """SIGKILL the server's process group, then delete the staging directories it owned."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        clean_stale_staging(staging_roots(self._staging_root()), pid=self.proc.pid)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
