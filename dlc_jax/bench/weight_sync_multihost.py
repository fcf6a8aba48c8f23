"""Multi-host weight sync: N trainer processes x D fake CPU devices joined by `jax.distributed` on
loopback push one model to a sampler with `distributed.push_weights` (every process sends its own
deduplicated shards, process 0 commits: `trainer/shard_push.py`); the figure is each process's
bytes out against the model's bytes (load-independent).

`launch(...)` starts the processes (`python -m dlc_jax.bench.weight_sync_multihost ...`, one JSON
line of results each); `multihost_rows(cfg, tmp)` is the part of `dlc-jax bench weight_sync` that
runs them against a transport-only sampler (`weight_sync_bench._ServerProcess`) with a random model
of the bench's shapes; the e2e test runs them with a real model directory against a JAX sampler
and checks the sampler's log-probs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import socket
import subprocess
import sys
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    address: str,
    out_dir: pathlib.Path,
    *,
    processes: int = 2,
    devices: int = 4,
    version: int = 1,
    dtype: str = "float32",
    model_dir: str = "",
    dims: dict | None = None,
    scale: float = 1.0,
    timeout: float = 600.0,
) -> list[dict]:
    """Run the push from `processes` JAX processes of `devices` CPU devices each; -> their results
    (process order). Model: the HF directory `model_dir`, else random weights of Qwen3 `dims`
    (the bench config's model fields); every parameter is multiplied by `scale` before the push."""
    coord = f"127.0.0.1:{_free_port()}"
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for p in range(processes):
        env = {
            **os.environ,
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
            "JAX_PLATFORMS": "cpu",
            "JAX_COORDINATOR_ADDRESS": coord,
            "JAX_NUM_PROCESSES": str(processes),
            "JAX_PROCESS_ID": str(p),
        }
        cmd = [
            sys.executable,
            "-m",
            "dlc_jax.bench.weight_sync_multihost",
            f"--address={address}",
            f"--version={version}",
            f"--dtype={dtype}",
            f"--scale={scale}",
            f"--model-dir={model_dir}",
            f"--dims={json.dumps(dims or {})}",
            f"--out={out_dir / f'p{p}.json'}",
        ]
        log = open(out_dir / f"p{p}.log", "wb")
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    try:
        for p, proc in enumerate(procs):
            rc = proc.wait(max(1.0, deadline - time.monotonic()))
            if rc != 0:
                tail = (out_dir / f"p{p}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"multihost push process {p} exited with {rc}:\n{tail}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return [json.loads((out_dir / f"p{p}.json").read_text()) for p in range(processes)]


def _random_model(dims: dict, mesh):
    """A random Qwen3 of `dims` placed on `mesh` (the same values on every process)."""
    import jax
    import numpy as np
    from flax import nnx

    from dlc_jax.model import Qwen3Config, Qwen3ForCausalLM
    from dlc_jax.model.sharding import model_shardings

    model = Qwen3ForCausalLM(Qwen3Config(**dims, tie_word_embeddings=True), rngs=nnx.Rngs(0))
    shardings = model_shardings(model, mesh)

    def place(v, s):
        host = np.asarray(v.get_value())
        arr = jax.make_array_from_callback(host.shape, s.get_value(), lambda idx: host[idx])
        return v.replace(arr)

    is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    state = jax.tree.map(place, nnx.state(model, nnx.Param), shardings, is_leaf=is_var)
    nnx.update(model, state)
    return model


def _worker(args) -> None:
    import jax
    from flax import nnx

    from dlc_jax.model import MeshConfig, hf_param_shapes, load_hf, make_mesh
    from dlc_jax.sampler import safetensors_io as st
    from dlc_jax.sampler.client import SamplerClient
    from dlc_jax.trainer import distributed as dist
    from dlc_jax.trainer.config_sections import DistributedSection

    info = dist.initialize(DistributedSection())
    mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=2), jax.devices())
    if args.model_dir:
        model = load_hf(args.model_dir, mesh=mesh)
    else:
        model = _random_model(json.loads(args.dims), mesh)
    if args.scale != 1.0:
        is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
        scaled = jax.tree.map(
            lambda v: v.replace(v.get_value() * args.scale),
            nnx.state(model, nnx.Param),
            is_leaf=is_var,
        )
        nnx.update(model, scaled)
    itemsize = st.NP_DTYPES[args.dtype].itemsize
    model_bytes = sum(itemsize * math.prod(s) for s in hf_param_shapes(model.config).values())
    with SamplerClient(args.address, timeout=600) as client:
        client.wait_ready(120)
        t0 = time.monotonic()
        r = dist.push_weights(client, model, args.version, dtype=args.dtype)
        seconds = time.monotonic() - t0
    out = {
        "process": info.process_index,
        "processes": info.process_count,
        "local_devices": info.local_devices,
        "ok": r.ok,
        "version": r.version,
        "message": r.message,
        "egress_bytes": r.egress_bytes,
        "model_bytes": model_bytes,
        "seconds": seconds,
    }
    pathlib.Path(args.out).write_text(json.dumps(out))


def multihost_rows(cfg, tmp: pathlib.Path, processes: int = 2, devices: int = 4) -> dict:
    """The bench rows: one push of a random model of the bench's shapes from `processes` x
    `devices`; -> {"rows": [...], "results": [...], "load": 1-min load average}."""
    from dlc_jax.bench import common
    from dlc_jax.bench.weight_sync_bench import _ServerProcess

    srv = _ServerProcess(cfg, str(tmp / "stage_multihost"))
    try:
        dims = {k: getattr(cfg, k) for k in common.QWEN3_DIMS}
        results = launch(
            srv.address,
            tmp / "multihost",
            processes=processes,
            devices=devices,
            dtype=cfg.push_dtype,
            dims=dims,
        )
    finally:
        srv.stop()
    rows = [
        {
            "path": f"multihost push: process {r['process']} of {processes} ({devices} devices)",
            "seconds": r["seconds"],
            "egress_MB": r["egress_bytes"] / 1e6,
            "egress_vs_model": r["egress_bytes"] / r["model_bytes"],
        }
        for r in results
    ]
    return {"rows": rows, "results": results, "load": os.getloadavg()[0]}


def add_multihost_part(res: dict, mh: dict) -> None:
    """Add `multihost_rows`' rows, summary, target (max bytes out of one process / the model's
    bytes <= 0.6) and note to the weight_sync result `res`."""
    from dlc_jax.bench import common
    from dlc_jax.bench.weight_sync_bench import COLUMNS

    for r in mh["rows"]:
        res["rows"].append({k: r.get(k) for k in COLUMNS})
    res["multihost"] = mh
    worst = max(r["egress_vs_model"] for r in mh["rows"])
    res["summary"]["multihost_max_egress_vs_model"] = worst
    res["targets"].append(
        common.target(
            f"multihost push ({len(mh['rows'])} processes): max bytes out of one process / "
            "model bytes",
            worst,
            0.6,
            "<=",
        )
    )
    res["notes"].append(
        f"multihost push: {len(mh['rows'])} trainer processes x 4 fake CPU devices "
        "(jax.distributed on loopback, mesh fsdp x tensor=2), each sends only the shards it holds "
        "(replica 0), process 0 commits; bytes out per process "
        + ", ".join(f"{r['egress_vs_model']:.3f}" for r in mh["rows"])
        + f" of the model; its seconds ran at load {mh['load']:.2f} (bytes are load-independent)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--address", required=True)
    p.add_argument("--version", type=int, default=1)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--model-dir", default="")
    p.add_argument("--dims", default="{}")
    p.add_argument("--out", required=True)
    _worker(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
