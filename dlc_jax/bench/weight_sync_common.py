"""What the weight-sync benchmark's parts share: its config and columns, a push server in its own
process (`ServerProcess`) and the raw loopback socket copy every push is compared with."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

from dlc_jax.bench import common
from dlc_jax.sampler.service.malloc_env import with_huge_pages


@dataclasses.dataclass(frozen=True)
class WeightSyncBenchConfig(common.BenchShape):
    """Pushed model shapes (Qwen3-0.6B by default, random weights), push dtype, chunk, repeats."""

    push_dtype: str = "bfloat16"
    chunk_mb: int = 16
    repeats: int = 3
    engines: tuple[str, ...] = ("jax",)  # push + load into these engines (`weight_sync_engines`)
    relay_samplers: int = 4  # a relay chain to this many samplers vs a push to one (0 = none)
    multihost: bool = True  # push from 2 processes x 4 CPU devices (`weight_sync_multihost`)
    stages: bool = True  # CPU seconds per GB of each push stage (`weight_sync_stages`)


COLUMNS = [
    "path",
    "seconds",
    "MB_per_s",
    "ratio_vs_raw_socket",
    "cpu_s",
    "cpu_bound_s",
    "egress_MB",
]


def raw_socket_copy(arrays: list[np.ndarray], out_path: pathlib.Path, chunk: int) -> float:
    """Send the arrays' bytes over loopback TCP to a `common.raw_receiver` writing them to
    ``out_path`` -> seconds from connect until it has written every byte and acked."""
    srv, th, errors = common.raw_receiver(sum(a.nbytes for a in arrays), out_path, chunk)
    try:
        dt = common.raw_send(srv.getsockname(), arrays)
        th.join(timeout=60)
    finally:
        srv.close()
    if errors:
        raise RuntimeError(f"raw socket copy failed: {errors[0]}")
    return dt


def serve(spec: dict) -> None:
    """Server-process side: a gRPC sampler service with the backend `spec["backend"]`: "jax" |
    "vllm" on `spec["model_dir"]`, or "transport" (`TransportOnlyBackend` of the model of
    `spec["config"]` or `spec["model_dir"]`); prints its address, serves until stdin closes."""
    from dlc_jax.sampler.backends.base import SamplerBackend
    from dlc_jax.sampler.service.server import ServerConfig, ServerThread

    backend: SamplerBackend
    if spec["backend"] != "transport":
        from dlc_jax.sampler.backends import BackendConfig, make_backend

        cfg = BackendConfig(model_dir=spec["model_dir"], max_model_len=256)
        backend = make_backend(spec["backend"], cfg)
    else:
        from dlc_jax.bench.sampler_bench import TransportOnlyBackend
        from dlc_jax.sampler.wire import safetensors_io as st

        if "config" in spec:
            mcfg = WeightSyncBenchConfig(**spec["config"]).model_config()
            backend = TransportOnlyBackend.of_model(mcfg)
        else:
            backend = TransportOnlyBackend(st.read_specs(spec["model_dir"]), 0)
    staging = spec.get("push_staging", "memory")
    srv = ServerThread(
        backend, ServerConfig(staging_root=spec["staging_root"], data_port=0, push_staging=staging)
    ).start()
    print(srv.address, flush=True)
    sys.stdin.read()
    srv.stop()


class ServerProcess:
    """A push server (`serve(spec)`) in its own Python process, as a sampler always is."""

    def __init__(self, spec: dict, what: str, start_timeout: float = 900.0):
        code = (
            "import json; from dlc_jax.bench.weight_sync_common import serve; "
            f"serve(json.loads({json.dumps(json.dumps(spec))}))"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=with_huge_pages(os.environ),  # as `SamplerProcess` starts a sampler
        )
        assert self.proc.stdout is not None  # stdout=PIPE
        self.address = ""
        t0 = time.monotonic()
        while not self.address and time.monotonic() - t0 < start_timeout:
            line = self.proc.stdout.readline()
            if not line:
                break
            line = line.strip()
            if line.count(":") == 1 and line.rsplit(":", 1)[1].isdigit():
                self.address = line
        if not self.address:
            self.proc.kill()
            raise RuntimeError(f"{what} exited with {self.proc.wait()} before listening")

    @classmethod
    def transport_only(cls, cfg: WeightSyncBenchConfig, staging_root: str) -> ServerProcess:
        """The transport-only server of ``cfg``'s model in its own process."""
        spec = {"backend": "transport", "config": dataclasses.asdict(cfg)}
        return cls(spec | {"staging_root": staging_root}, "weight_sync bench server")

    def stop(self) -> None:
        assert self.proc.stdin is not None  # stdin=PIPE
        self.proc.stdin.close()
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
