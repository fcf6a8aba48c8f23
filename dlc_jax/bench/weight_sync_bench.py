"""Weight sync: export + push of a Qwen3-sized model (`SamplerClient.push_model`) and push only
(from exported host arrays), over gRPC and the socket data plane, to a sampler process with a
`TransportOnlyBackend`, against a raw loopback socket copy of the same bytes into a file.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import tempfile
import time
from typing import Any

from dlc_jax.bench import common
from dlc_jax.bench.weight_sync_common import (
    COLUMNS,
    ServerProcess,
    WeightSyncBenchConfig,
    raw_socket_copy,
)
from dlc_jax.bench.weight_sync_engines import engine_and_relay_rows
from dlc_jax.bench.weight_sync_multihost import add_multihost_part, multihost_rows
from dlc_jax.bench.weight_sync_stages import stage_lines, stage_part

# transport -> its rows (export + push, push only)
PUSH_ROWS = {
    "grpc": ("export + push (gRPC)", "push only (gRPC)"),
    "socket": ("export + push (socket data plane)", "push only (gRPC, socket data plane)"),
}
SIZES = {
    "default": WeightSyncBenchConfig(**common.shape("qwen3_0p6b")),
    "small": WeightSyncBenchConfig(
        **common.shape("qwen3_0p6b", vocab_size=32768, num_hidden_layers=4)
    ),
    "tiny": WeightSyncBenchConfig(
        **common.shape("tiny"),
        chunk_mb=1,
        engines=(),
        relay_samplers=0,
        multihost=False,
        stages=False,
    ),
}


def run(cfg: WeightSyncBenchConfig = SIZES["default"]) -> dict:
    from flax import nnx

    from dlc_jax.model import Qwen3ForCausalLM, iter_hf_tensors
    from dlc_jax.sampler.client.client import SamplerClient
    from dlc_jax.sampler.wire import safetensors_io as st

    res = common.new_result(
        "weight_sync", "Weight sync: export + gRPC push vs raw loopback socket", COLUMNS, cfg
    )
    mcfg = cfg.model_config()
    model = Qwen3ForCausalLM(mcfg, rngs=nnx.Rngs(0))
    np_dtype = st.NP_DTYPES[cfg.push_dtype]
    exported = dict(iter_hf_tensors(model, dtype=np_dtype))  # also compiles the export
    total = sum(a.nbytes for a in exported.values())
    chunk = cfg.chunk_mb << 20
    versions = itertools.count(1)
    with tempfile.TemporaryDirectory(prefix="dlc_weight_sync_bench_") as d:
        tmp = pathlib.Path(d)
        srv = ServerProcess.transport_only(cfg, str(tmp / "stage"))
        client = SamplerClient(srv.address, timeout=3600)
        client.wait_ready(120)

        def push(src, transport: str) -> None:
            """Push the model (export + push) or its exported arrays (push only)."""
            send = client.push_model if src is model else client.push_weights
            kw: dict[str, Any] = dict(dtype=cfg.push_dtype, chunk_bytes=chunk, transport=transport)
            common.accepted(send(src, next(versions), **kw), "the sampler")

        def raw():
            p = tmp / "raw_copy.bin"
            dt = raw_socket_copy(list(exported.values()), p, chunk)
            p.unlink()
            return dt

        times: dict[str, list[float]] = {k: [] for rows in PUSH_ROWS.values() for k in rows}
        times["raw socket"] = []
        # CPU seconds of a repeat: this process (export, send; the raw copy's receiver thread)
        # plus the server process (receive, stage, verify); load-independent, unlike wall time
        cpu: dict[str, list[float]] = {k: [] for k in times}

        def timed(row: str, fn) -> None:
            """Run `fn` once; wall time: the float it returns (the raw copy's), else measured."""
            dt, wall, me, server = common.measure(fn, [srv.proc.pid])
            times[row].append(dt if isinstance(dt, float) else wall)
            if server is not None:
                cpu[row].append(me + server)

        try:
            # export alone, CPU seconds (after the warm-up above: no compiles): as pushed (kernels
            # transposed on host on CPU devices) and with XLA transposing them on device
            export_cpu: dict[str, float] = {}
            for label, host_t in (("host transpose", None), ("device transpose", False)):
                list(iter_hf_tensors(model, dtype=np_dtype, host_transpose=host_t))  # compile
                c0 = time.process_time()
                for _ in iter_hf_tensors(model, dtype=np_dtype, host_transpose=host_t):
                    pass
                export_cpu[label] = time.process_time() - c0
            for _ in range(cfg.repeats):
                for transport, (ep_row, po_row) in PUSH_ROWS.items():
                    timed(ep_row, lambda t=transport: push(model, t))
                    timed(po_row, lambda t=transport: push(exported, t))
                timed("raw socket", raw)
        finally:
            client.close()
            srv.stop()
        extra: dict[str, Any] = {"times": {}, "cpu": {}, "egress": {}, "notes": []}
        if cfg.engines or cfg.relay_samplers:
            extra = engine_and_relay_rows(
                cfg, model, exported, tmp, lambda: timed("raw socket", raw)
            )
            times.update(extra["times"])
            cpu.update(extra["cpu"])
        multihost = multihost_rows(cfg, tmp) if cfg.multihost else None
        stages = stage_part(cfg) if cfg.stages else None
    mb = total / 1e6
    ncpu = os.cpu_count() or 1
    med = common.best_times(res, times)
    for k, s in med.items():
        res["rows"].append(
            {
                "path": k,
                "seconds": s,
                "MB_per_s": mb / s,
                "ratio_vs_raw_socket": med["raw socket"] / s,
                "cpu_s": common.median(cpu[k]) if cpu[k] else None,
                "cpu_bound_s": common.median(cpu[k]) / ncpu if cpu[k] else None,
                "egress_MB": extra["egress"][k] / 1e6 if k in extra["egress"] else None,
            }
        )
    res["cpu_s"], res["export_only_cpu_s"] = cpu, export_cpu
    res["config"].update(push_bytes=total, push_tensors=len(exported))
    ep, po = (min(rows, key=med.__getitem__) for rows in zip(*PUSH_ROWS.values()))
    res["summary"] = {
        "export_push_vs_raw": med["raw socket"] / med[ep],
        "export_push_best": ep,
        "push_only_vs_raw": med["raw socket"] / med[po],
        "push_only_best": po,
        "export_push_grpc_vs_raw": med["raw socket"] / med["export + push (gRPC)"],
        "push_only_grpc_vs_raw": med["raw socket"] / med["push only (gRPC)"],
    }
    for what, best, key in (("export + push", ep, "export_push"), ("push only", po, "push_only")):
        name = f"{what} / raw socket throughput (best: {best})"
        res["targets"].append(common.target(name, res["summary"][f"{key}_vs_raw"], 0.5, ">="))
    _engine_targets(res, med, extra["egress"], total)
    if multihost is not None:
        add_multihost_part(res, multihost)
    res["notes"] += extra["notes"]
    if stages is not None:
        res["stage_cpu_s_per_GB"], res["stage_totals"] = stages
        res["summary"].update(stages[1])
        res.setdefault("sections", []).extend(stage_lines(*stages))
    res["notes"] += [
        f"{len(exported)} tensors, {mb:.0f} MB {cfg.push_dtype} (Qwen3 shapes: "
        f"{mcfg.num_hidden_layers} layers, D={mcfg.hidden_size}, V={mcfg.vocab_size}, tied, "
        f"random weights); chunk {cfg.chunk_mb} MiB; server = real gRPC service in its own "
        "process with a transport-only backend (staging + CRC-32C verify, no engine reload); best "
        f"of {cfg.repeats} interleaved repeats",
        "cpu_s: median CPU seconds of a repeat, this process (export, send; the raw copy's "
        f"receiver thread) + the server process; cpu_bound_s = cpu_s / {ncpu} CPUs, the wall time "
        "no overlap can beat on this machine. Export alone (iter_hf_tensors to "
        f"{cfg.push_dtype}, no send): {export_cpu['host transpose']:.3f} CPU s as pushed "
        f"(kernels transposed on host), {export_cpu['device transpose']:.3f} CPU s with XLA "
        "transposing them on device",
    ]
    return common.finish(res)


def _engine_targets(res: dict, med: dict, egress: dict, total: int) -> None:
    """Targets of the engine / relay rows present in `med` (seconds) and `egress` (bytes)."""
    raw, one = med["raw socket"], "push to 1 sampler (memory staging)"
    for k, s in med.items():  # the engine rows come before the relay rows
        if k.startswith("push + load into") and "memory" in k:
            res["targets"].append(common.target(f"{k} / raw socket throughput", raw / s, 0.8, ">="))
        elif k.startswith("relay chain"):
            res["targets"] += [
                common.target(f"{k}: trainer egress / model bytes", egress[k] / total, 1.1, "<="),
                common.target(f"{k}: time / {one}", s / med[one], 1.5, "<="),
            ]


def _engines(arg: str) -> tuple[str, ...]:
    names = tuple(e for e in arg.split(",") if e and e != "none")
    bad = [e for e in names if e not in ("jax", "vllm")]
    if bad:
        raise ValueError(f"--engines: unknown engine {bad[0]!r} (jax, vllm or none)")
    return names


def _switch(flag: str, what: str) -> tuple:
    """An on/off option of the config field ``flag``."""
    kw = {"choices": ["on", "off"], "help": f"{what} (default: on, off for tiny)"}
    return (f"--{flag}", flag, kw, lambda arg: arg == "on")


ARGS = common.Options(
    "weight_sync",
    SIZES,
    ("--repeats", "repeats", {"type": int}),
    ("--push-dtype", "push_dtype", {"choices": ["float32", "bfloat16"]}),
    (
        "--engines",
        "engines",
        {
            "help": "comma-separated serving engines to push + load into: jax, vllm ('none': no "
            "engine rows; default jax)"
        },
        _engines,
    ),
    ("--relay-samplers", "relay_samplers", {"type": int, "help": "relay chain length (0: none)"}),
    _switch("multihost", "the push from 2 trainer processes x 4 fake CPU devices"),
    _switch("stages", "CPU seconds per GB of each push stage, before / now"),
)
add_args, from_args = ARGS.add_args, ARGS.from_args
