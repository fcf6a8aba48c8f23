"""Concurrent calls over a pool's samplers, each failure reported per sampler."""

from __future__ import annotations

import concurrent.futures as cf
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeVar

import grpc

from ..push.weight_stream import put_unless
from ..wire.types import PushResult

C = TypeVar("C")
_END = object()


def describe(e: BaseException) -> tuple[str, str]:
    """(status code name, one-line message) of a failed call."""
    if isinstance(e, grpc.RpcError) and isinstance(e, grpc.Call):
        return e.code().name, f"{e.code().name}: {e.details()}"
    return type(e).__name__, f"{type(e).__name__}: {e}"


def _results(futs: Mapping[int, cf.Future]) -> dict[int, PushResult]:
    res = {}
    for i, f in futs.items():
        try:
            res[i] = f.result()
        except Exception as e:  # a failed sampler is reported, not fatal
            code, msg = describe(e)
            res[i] = PushResult(False, -1, msg, code=code)
    return res


def run_each(clients: Mapping[int, C], fn: Callable[[C], PushResult]) -> dict[int, PushResult]:
    """``fn(client)`` for every client concurrently; exceptions become failed PushResults."""
    with cf.ThreadPoolExecutor(len(clients)) as ex:
        return _results({i: ex.submit(fn, c) for i, c in clients.items()})


def fan_out(
    clients: Mapping[int, C],
    source: Iterable,
    push: Callable[[C, Iterator], PushResult],
    queue_depth: int,
) -> dict[int, PushResult]:
    """``push(client, items)`` for every client concurrently, fed by one pass over ``source``
    through bounded queues (a failed consumer stops receiving; the source is read to its end)."""
    queues: dict[int, queue.Queue] = {i: queue.Queue(maxsize=queue_depth) for i in clients}
    finished = {i: threading.Event() for i in clients}

    def consume(i: int, c: C) -> PushResult:
        try:
            return push(c, iter(queues[i].get, _END))
        finally:
            finished[i].set()

    with cf.ThreadPoolExecutor(len(clients)) as ex:
        futs = {i: ex.submit(consume, i, c) for i, c in clients.items()}
        try:
            for item in source:  # read every item once, whatever happens to the consumers
                for i in clients:
                    put_unless(queues[i], item, finished[i])
        finally:
            for i in clients:
                put_unless(queues[i], _END, finished[i])
        return _results(futs)
