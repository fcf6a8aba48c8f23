"""Sampler soak, load: concurrent Generate streams with a good push in the middle (rollouts must
name only the versions served), requests with distinct sampling values (time, RSS growth), and
idle data connections (server thread count)."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from .harness import perturbed, proc_status


def streams_with_push(client, weights: dict, v: int, n: int, vocab: int) -> dict:
    from dlc_jax.sampler.wire.types import SamplingParams

    done = threading.Semaphore(0)
    results: list = [None] * n

    def one(i: int):
        try:
            rng = np.random.default_rng(i)
            prompt = rng.integers(1, vocab, int(rng.integers(2, 12))).tolist()
            params = SamplingParams(max_tokens=12, temperature=1.0, seed=i)
            (results[i],) = list(client.generate([prompt], params))
        except grpc.RpcError as e:
            results[i] = e
        finally:
            done.release()

    with ThreadPoolExecutor(n) as ex:
        for i in range(n):
            ex.submit(one, i)
        for _ in range(n // 4):
            done.acquire()
        push = client.push_weights(perturbed(weights, 7), v + 1)
    errors = [r for r in results if not hasattr(r, "logprobs")]
    rolls = [r for r in results if hasattr(r, "logprobs")]

    def bad(r) -> bool:
        spans = r.version_spans
        return (
            not np.isfinite(r.logprobs).all()
            or any(ver not in (v, v + 1) for ver, _, _ in spans)
            or bool(spans and (spans[0][1] != 0 or spans[-1][2] != len(r.response_ids)))
        )

    versions = [{x[0] for x in r.version_spans} for r in rolls]
    return {
        "streams": n,
        "stream_errors": len(errors),
        "bad_rollouts": sum(map(bad, rolls)),
        "push_ok": bool(push.ok),
        "rollouts_with_new_version": sum(v + 1 in vs for vs in versions),
        "rollouts_spanning_two_versions": sum(len(vs) > 1 for vs in versions),
        "error_examples": [f"{e.code().name}: {e.details()}" for e in errors[:3]],
    }


def distinct_params(client, pid: int, n: int) -> dict:
    from dlc_jax.sampler.wire.types import SamplingParams

    rng = np.random.default_rng(1)
    warm = SamplingParams(max_tokens=4, temperature=0.7, top_p=0.9, top_k=5, head_k=2)
    list(client.generate([[1, 2, 3]], warm))
    rss0 = proc_status(pid)["VmRSS"]
    t0 = time.perf_counter()
    nonfinite = 0
    for i in range(n):
        p = SamplingParams(
            max_tokens=4,
            temperature=float(rng.uniform(0.05, 2.0)),
            top_p=float(rng.uniform(0.3, 0.99)),
            top_k=int(rng.integers(1, 300)),
            head_k=int(rng.integers(1, 9)),
            seed=i,
        )
        (r,) = list(client.generate([[1, 2, 3]], p))
        nonfinite += int(not np.isfinite(r.logprobs).all())
    return {
        "distinct_param_requests": n,
        "distinct_params_s": time.perf_counter() - t0,
        "distinct_params_rss_growth_mb": (proc_status(pid)["VmRSS"] - rss0) / 1024,
        "nonfinite": nonfinite,
    }


def idle_connections(pid: int, host: str, data_port: int, n: int) -> dict:
    th0 = proc_status(pid)["Threads"]
    socks = []
    for _ in range(n):
        try:
            socks.append(socket.create_connection((host, data_port), timeout=5))
        except OSError:
            break
    time.sleep(0.3)
    th1 = proc_status(pid)["Threads"]
    for s in socks:
        s.close()
    return {
        "idle_data_connections": len(socks),
        "server_threads_before": th0,
        "server_threads_with_idle": th1,
    }
