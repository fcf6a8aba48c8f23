"""CPU seconds per pushed GB of each stage of a weight push (load-independent): each stage alone,
fastest of `repeats`, on the thread's CPU clock (the JAX load: the process's). ``recv`` goes into a
fresh staging map (a page fault per first-written 4 KiB) or a warm one; ``device load`` reads
tensors 8 bytes off alignment (XLA copies each input) or 64-byte aligned (read in place).
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
import resource
import socket
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np

from dlc_jax.bench import common
from dlc_jax.bench.weight_sync_common import WeightSyncBenchConfig
from dlc_jax.sampler.service.malloc_env import with_huge_pages

RECV_PIECE = 8 << 20  # as `staging.WeightStager.read_socket`


def _thread_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return r.ru_utime + r.ru_stime


def _fastest(fn: Callable[[], object], repeats: int, clock: Callable[[], float] = _thread_cpu):
    """The least CPU seconds (on ``clock``) of ``repeats`` calls of ``fn``."""
    times = []
    for _ in range(repeats):
        c0 = clock()
        fn()
        times.append(clock() - c0)
    return min(times)


def _send_recv(arrays: list[np.ndarray], into: mmap.mmap) -> tuple[float, float]:
    """Send `arrays` over a loopback socket pair into `into`: (sender CPU s, receiver CPU s)."""
    a, b = socket.socketpair()
    sent: list[float] = []

    def send() -> None:
        c0 = _thread_cpu()
        with a:
            for x in arrays:
                a.sendall(x.reshape(-1).view(np.uint8).data)
        sent.append(_thread_cpu() - c0)

    t = threading.Thread(target=send, daemon=True)
    t.start()
    view = memoryview(into)
    total = sum(x.nbytes for x in arrays)
    c0 = _thread_cpu()
    got = 0
    with b:
        while got < total:
            want = min(RECV_PIECE, total - got)
            k = b.recv_into(view[got : got + want], want, socket.MSG_WAITALL)
            if k == 0:
                raise ConnectionError(f"stage bench: socket closed after {got} of {total} bytes")
            got += k
    recv = _thread_cpu() - c0
    t.join()
    view.release()
    return sent[0], recv


def _shm_map(nbytes: int) -> mmap.mmap:
    """A fresh shared mapping of a new RAM-filesystem file (as a staging file), file unlinked."""
    root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    fd, path = tempfile.mkstemp(prefix="dlc_stage_bench_", dir=root)
    try:
        os.unlink(path)
        os.ftruncate(fd, nbytes)
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


def _views(arrays: dict[str, np.ndarray], skew: int) -> tuple[mmap.mmap, dict[str, np.ndarray]]:
    """The arrays copied into one map at offsets 64-aligned + `skew`, as read-only views."""
    sizes = [(a.nbytes + 63) // 64 * 64 for a in arrays.values()]
    mm = mmap.mmap(-1, sum(sizes) + 64)
    out, at = {}, skew
    for (name, a), size in zip(arrays.items(), sizes):
        v = np.frombuffer(mm, a.dtype, a.size, at).reshape(a.shape)
        v[...] = a
        v.flags.writeable = False
        out[name] = v
        at += size
    return mm, out


def stage_cpu(exported: dict[str, np.ndarray], model=None, repeats: int = 3) -> dict[str, float]:
    """{stage: CPU s per GB pushed}; `model`: for the JAX load stages (None: left out)."""
    import crc32c

    from dlc_jax.sampler.push.weight_checks import FiniteCheck

    arrays = [np.ascontiguousarray(a) for a in exported.values()]
    total = sum(a.nbytes for a in arrays)
    gb = total / 1e9
    cpu: dict[str, float] = {}

    cpu["send: CRC-32C"] = _fastest(
        lambda: [crc32c.crc32c(a.reshape(-1).view(np.uint8).data) for a in arrays], repeats
    )
    fresh_send, fresh_recv, warm_recv = [], [], []
    warm = _shm_map(total)
    _send_recv(arrays, warm)  # maps every page once
    for _ in range(repeats):
        mm = _shm_map(total)
        s, r = _send_recv(arrays, mm)
        mm.close()
        fresh_send.append(s)
        fresh_recv.append(r)
        s, r = _send_recv(arrays, warm)
        fresh_send.append(s)
        warm_recv.append(r)
    cpu["send: socket"] = min(fresh_send)
    cpu["recv: fresh staging map"] = min(fresh_recv)
    cpu["recv: warm staging map"] = min(warm_recv)
    raw = memoryview(warm)

    def finite() -> None:
        at = 0
        for a in arrays:
            f = FiniteCheck(str(a.dtype))
            for off in range(0, a.nbytes, RECV_PIECE):
                f.update(raw[at + off : at + min(off + RECV_PIECE, a.nbytes)])
            at += a.nbytes

    def crc() -> None:
        for off in range(0, total, RECV_PIECE):
            crc32c.crc32c(raw[off : off + RECV_PIECE])

    cpu["CRC-32C"] = _fastest(crc, repeats)
    cpu["finite check"] = _fastest(finite, repeats)
    raw.release()
    warm.close()
    if model is not None:
        cpu.update(_load_cpu(exported, model, repeats))
    return {k: v / gb for k, v in cpu.items()}


def _load_cpu(exported: dict[str, np.ndarray], model, repeats: int) -> dict[str, float]:
    import jax
    from flax import nnx

    from dlc_jax.sampler.backends.jax_weights import JaxWeightLoad

    _, state = nnx.split(model)
    layers = int(model.config.num_hidden_layers)
    out = {}
    for label, skew in (("device load (8-byte aligned)", 8), ("device load (64-byte aligned)", 0)):
        mm, views = _views(exported, skew)

        def load(views=views) -> None:
            w = JaxWeightLoad(state, layers)
            for name, v in views.items():
                w.add(name, v)
            jax.block_until_ready(jax.tree.leaves(w.state()))

        load()  # compiles the converters
        out[label] = _fastest(load, repeats, time.process_time)
        del views
        with contextlib.suppress(BufferError):  # a view still referenced by a live array
            mm.close()
    return out


BEFORE_NOW = [  # (row, stage measured before, stage measured now)
    ("send: CRC-32C (trainer)", "send: CRC-32C", "send: CRC-32C"),
    ("send: socket (trainer)", "send: socket", "send: socket"),
    ("recv into the staging map", "recv: fresh staging map", "recv: warm staging map"),
    ("CRC-32C (sampler)", "CRC-32C", "CRC-32C"),
    ("finite check (sampler)", "finite check", "finite check"),
    ("device load, JAX engine", "device load (8-byte aligned)", "device load (64-byte aligned)"),
]
RECEIVE_ROWS = BEFORE_NOW[2:]


def child(cfg, huge: bool) -> dict[str, float]:
    """`model_stage_cpu` of `cfg` in a fresh process, with (`huge`) or without huge-page malloc."""
    env = dict(os.environ)
    env["GLIBC_TUNABLES"] = ":".join(
        t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and "malloc.hugetlb" not in t
    )
    env = with_huge_pages(env) if huge else env
    module, cfg_dict = "dlc_jax.bench.weight_sync_stages", dataclasses.asdict(cfg)
    return common.call_in_child(module, "model_stage_cpu", cfg_dict, env=env, timeout=1800)


def stage_part(cfg) -> tuple[list[dict], dict[str, float]]:
    """Rows {stage, before, now} (CPU-s/GB) and the sampler's receive + load totals."""
    before, now = child(cfg, False), child(cfg, True)
    rows = [
        {"stage": row, "before_CPU_s_per_GB": before.get(b), "now_CPU_s_per_GB": now.get(n)}
        for row, b, n in BEFORE_NOW
        if b in before and n in now
    ]
    totals = {
        "sampler_receive_load_before": sum(before[b] for _, b, _ in RECEIVE_ROWS if b in before),
        "sampler_receive_load_now": sum(now[n] for _, _, n in RECEIVE_ROWS if n in now),
    }
    return rows, totals


def stage_lines(rows: list[dict], totals: dict[str, float]) -> list[str]:
    """The markdown section of `stage_part`'s result."""
    return [
        "### CPU seconds per pushed GB, by stage (load-independent)",
        "",
        common.markdown_table(["stage", "before_CPU_s_per_GB", "now_CPU_s_per_GB"], rows),
        "",
        f"Sampler receive + checks + JAX load: before {totals['sampler_receive_load_before']:.3f}, "
        f"now {totals['sampler_receive_load_now']:.3f} CPU-s/GB. Each stage run alone, fastest of "
        "the repeats, per-thread CPU clock (the JAX load: the process clock); before = a fresh "
        "staging map per push, tensors 8 bytes off 64-byte alignment, 4 KiB pages; now = the warm "
        "staging map (`sampler/push/warm_staging.py`), 64-byte-aligned tensors "
        "(`safetensors_io.layout`), huge-page malloc (`sampler/service/malloc_env.py`).",
    ]


def model_stage_cpu(cfg_dict: dict) -> dict[str, float]:
    """`stage_cpu` of the `WeightSyncBenchConfig` `cfg_dict`'s model (random weights)."""
    from flax import nnx

    from dlc_jax.model import Qwen3ForCausalLM, iter_hf_tensors
    from dlc_jax.sampler.wire import safetensors_io as st

    cfg = WeightSyncBenchConfig(**cfg_dict)
    model = Qwen3ForCausalLM(cfg.model_config(), rngs=nnx.Rngs(0))
    exported = dict(iter_hf_tensors(model, dtype=st.NP_DTYPES[cfg.push_dtype]))
    return stage_cpu(exported, model, cfg.repeats)
