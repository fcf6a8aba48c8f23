"""The trainer side of a relayed pool push (`relay`): one copy to the first target; samplers the
relay missed get direct pushes when the source can be read again."""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
from collections.abc import Callable

import grpc

from ..wire.types import PushResult
from .fanout import describe
from .retry import NO_RETRY


def fanout_of(relay: str, targets: int) -> int:
    """Children per relaying sampler: 1 (chain) for "chain" and "auto" up to 4 targets, else 2."""
    return 1 if relay == "chain" or (relay == "auto" and targets <= 4) else 2


def relayed_push(
    clients: list,
    targets: list[int],
    named_tensors,
    push: Callable[..., PushResult],
    relay: str,
    version: int,
    probe_timeout: float,
    direct: Callable[[list[int]], dict[int, PushResult]],
) -> dict[int, PushResult]:
    """Per-target outcome of a relayed push (`push` to one sampler, `direct` to several)."""
    head, rest = targets[0], targets[1:]
    addrs = [clients[i].address for i in rest]
    try:
        r = push(
            clients[head],
            named_tensors,
            relay_to=addrs,
            relay_fanout=fanout_of(relay, len(targets)),
        )
    except Exception as e:  # a failed sampler is reported, not fatal
        code, msg = describe(e)
        r = PushResult(False, -1, msg, code=code)
    results = {head: r}
    for i, a in zip(rest, addrs):
        sub = r.relayed.get(a)
        if sub is not None and sub.ok:
            results[i] = dataclasses.replace(sub, transport="relay")
    missed = [i for i in rest if i not in results]
    for i in list(missed):  # e.g. the head failed its own swap after its children committed
        try:
            v = clients[i].info(timeout=probe_timeout, retry=NO_RETRY)["version"]
        except grpc.RpcError:
            continue
        if v == version:
            results[i] = PushResult(True, v, "took the relayed push", transport="relay")
            missed.remove(i)
    reiterable = isinstance(named_tensors, (cabc.Mapping, cabc.Sequence)) or callable(named_tensors)
    if missed and reiterable:  # a failed hop: its subtree gets direct pushes
        results.update(direct(missed))
    for i in missed:
        if i not in results:
            why = r.relayed.get(clients[i].address, r)
            results[i] = PushResult(
                False, -1, f"relay did not reach it: {why.message}", code=why.code
            )
    return results
