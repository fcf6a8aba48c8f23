"""Multi-host weight sync: N trainer processes x D fake CPU devices (`jax.distributed` on loopback)
push one model with `distributed.push_weights`, each sending its own deduplicated shards, once per
transport; the figure is each process's bytes out against the model's (load-independent).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

from dlc_jax.bench import common
from dlc_jax.bench.weight_sync_common import COLUMNS, ServerProcess


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
    transports: tuple[str, ...] = ("grpc",),
    relay_to: tuple[str, ...] = (),
) -> list[dict]:
    """Push from `processes` JAX processes of `devices` CPU devices each, once per entry of
    `transports` ("grpc" | "socket" | "auto" to `address`; suffixed ":relay", to the pool `address`
    + `relay_to` relayed along a chain; ":pool", to that pool with every process sending to every
    sampler) as versions `version`, `version` + 1, ... -> each process's results (`pushes`: one
    per entry). Model: the HF dir `model_dir`, else random Qwen3 `dims`; times `scale`."""
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
        args = [address, version, dtype, scale, model_dir, dims or {}, transports, relay_to]
        cmd = [sys.executable, "-m", "dlc_jax.bench.weight_sync_multihost"]
        cmd.append(json.dumps([*args, str(out_dir / f"p{p}.json")]))
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


def _worker(address, version, dtype, scale, model_dir, dims, transports, relay_to, out) -> None:
    """One pushing process of `launch` (its arguments, then the file for its results)."""
    import jax
    from flax import nnx

    from dlc_jax.model import MeshConfig, hf_param_shapes, load_hf, make_mesh
    from dlc_jax.sampler.client.client import SamplerClient
    from dlc_jax.sampler.client.pool import SamplerPool
    from dlc_jax.sampler.wire import safetensors_io as st
    from dlc_jax.trainer import distributed as dist
    from dlc_jax.trainer.config_sections import DistributedSection

    info = dist.initialize(DistributedSection())
    mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=2), jax.devices())
    model = load_hf(model_dir, mesh=mesh) if model_dir else _random_model(dims, mesh)
    if scale != 1.0:
        is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
        params = nnx.state(model, nnx.Param)
        scaled = jax.tree.map(lambda v: v.replace(v.get_value() * scale), params, is_leaf=is_var)
        nnx.update(model, scaled)
    itemsize = st.NP_DTYPES[dtype].itemsize
    model_bytes = sum(itemsize * math.prod(s) for s in hf_param_shapes(model.config).values())
    pushes = []
    pool = SamplerPool([address, *relay_to], relay="chain", timeout=600) if relay_to else None
    with SamplerClient(address, timeout=600) as client:
        for c in [client, *(pool.clients if pool is not None else [])]:
            c.wait_ready(120)
        for k, name in enumerate(transports):
            transport, _, mode = name.partition(":")
            target = pool if mode in ("relay", "pool") else client
            if target is None:
                raise SystemExit(f"transport {name}: a pool push needs relay_to")
            relay = "chain" if mode == "relay" else "off"
            t0 = time.monotonic()
            r = dist.push_weights(
                target, model, version + k, dtype=dtype, transport=transport, relay=relay
            )
            pushes.append(
                {
                    "transport": r.transport + (f" + {mode}" if mode else ""),
                    "samplers": 1 + len(relay_to) if mode else 1,
                    "ok": r.ok,
                    "version": r.version,
                    "message": r.message,
                    "egress_bytes": r.egress_bytes,
                    "seconds": time.monotonic() - t0,
                }
            )
    if pool is not None:
        pool.close()
    result = {
        "process": info.process_index,
        "processes": info.process_count,
        "local_devices": info.local_devices,
        "model_bytes": model_bytes,
        "pushes": pushes,
    }
    pathlib.Path(out).write_text(json.dumps(result))


def multihost_rows(cfg, tmp: pathlib.Path, processes: int = 2, devices: int = 4) -> dict:
    """The bench rows: one push per transport (gRPC, socket) of a random model of the bench's
    shapes, plus (with `cfg.relay_samplers` >= 2) one relayed along that many samplers -> {"rows",
    "results", "load": the larger 1-min load average of before and after}."""
    load0 = os.getloadavg()[0]
    n = max(1, int(cfg.relay_samplers))
    transports = ("grpc", "socket", "socket:relay") if n > 1 else ("grpc", "socket")
    servers: list = []
    try:
        for k in range(n):
            servers.append(ServerProcess.transport_only(cfg, str(tmp / f"stage_multihost{k}")))
        dims = {k: getattr(cfg, k) for k in common.QWEN3_DIMS}
        results = launch(
            servers[0].address,
            tmp / "multihost",
            processes=processes,
            devices=devices,
            dtype=cfg.push_dtype,
            dims=dims,
            transports=transports,
            relay_to=tuple(s.address for s in servers[1:]),
        )
    finally:
        for srv in servers:
            srv.stop()
    rows = [
        {
            "path": f"multihost push ({push['transport']}, {push['samplers']} sampler"
            f"{'s' if push['samplers'] > 1 else ''}): process {r['process']} of "
            f"{processes} ({devices} devices)",
            "transport": push["transport"],
            "samplers": push["samplers"],
            "message": push["message"],
            "seconds": push["seconds"],
            "egress_MB": push["egress_bytes"] / 1e6,
            "egress_vs_model": push["egress_bytes"] / r["model_bytes"],
        }
        for k in range(len(transports))
        for r in results
        for push in [r["pushes"][k]]
    ]
    return {"rows": rows, "results": results, "load": max(load0, os.getloadavg()[0])}


def add_multihost_part(res: dict, mh: dict) -> None:
    """Add `multihost_rows`' rows, summary, targets and note to the weight_sync result `res`."""
    unreliable = mh["load"] > 2
    for r in mh["rows"]:
        row = {k: r.get(k) for k in COLUMNS}
        if unreliable:  # a wall time measured on a loaded machine is not a result
            row["seconds"] = None
        res["rows"].append(row)
    res["multihost"] = mh
    processes = len(mh["results"])
    transports = list(dict.fromkeys(r["transport"] for r in mh["rows"]))
    res["summary"]["multihost_max_egress_vs_model"] = max(r["egress_vs_model"] for r in mh["rows"])
    per_transport, relayed = [], ""  # the note's bytes out per process; relays' messages
    for t in transports:
        rows = [r for r in mh["rows"] if r["transport"] == t]
        shares = [r["egress_vs_model"] for r in rows]
        per_transport.append(f"{t} " + ", ".join(f"{x:.3f}" for x in shares))
        key = t.replace(" + ", "_")
        res["summary"][f"multihost_{key}_max_egress_vs_model"] = max(shares)
        name = f"multihost push over {t} ({processes} processes): max bytes out of one process"
        res["targets"].append(common.target(f"{name} / model bytes", max(shares), 0.6, "<="))
        if rows[0]["samplers"] > 1:  # relayed: the trainer's egress is one model for N samplers
            res["summary"][f"multihost_{key}_egress_vs_model"] = sum(shares)
            name = f"multihost push over {t} to {rows[0]['samplers']} samplers: trainer egress"
            res["targets"].append(
                common.target(f"{name} (all processes) / model bytes", sum(shares), 1.1, "<=")
            )
            relayed += f"; {t} (process 0): {rows[0]['message']}"
    loaded = "seconds left out (unreliable above load 2); " if unreliable else ""
    res["notes"].append(
        f"multihost push: {processes} trainer processes x 4 fake CPU devices "
        "(jax.distributed on loopback, mesh fsdp x tensor=2), each sends only the shards it holds "
        "(replica 0), process 0 commits; bytes out per process of the model: "
        f"{'; '.join(per_transport)}{relayed}. Load {mh['load']:.2f}: {loaded}bytes are "
        "load-independent"
    )


def multihost_result(cfg) -> dict:
    """The multi-host part alone as a result (`docs/bench/weight_sync_multihost.*`)."""
    res = common.new_result(
        "weight_sync_multihost",
        "Weight sync: multi-host push, bytes out of each trainer process (gRPC / socket plane)",
        COLUMNS,
        cfg,
    )
    res["summary"] = {}
    with tempfile.TemporaryDirectory(prefix="dlc_weight_sync_multihost_") as d:
        add_multihost_part(res, multihost_rows(cfg, pathlib.Path(d)))
    res["notes"].append(
        f"model: Qwen3 shapes, {cfg.num_hidden_layers} layers, D={cfg.hidden_size}, "
        f"V={cfg.vocab_size}, tied, random weights, pushed as {cfg.push_dtype} to a transport-only "
        "sampler (staging + CRC-32C verify) in its own process"
    )
    return common.finish(res)


if __name__ == "__main__":  # python -m dlc_jax.bench.weight_sync_multihost SPEC_JSON (`launch`)
    _worker(*json.loads(sys.argv[1]))
