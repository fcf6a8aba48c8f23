"""Relay of a weight push between samplers (trainer egress: one model whatever the sampler count).
`relay_to` is split into `relay_fanout` contiguous groups (1: a chain, 2: a binary tree), each
group's first address getting the push with the rest of its group as its `relay_to`. Each tensor is
forwarded once verified here; a push that fails here is cut before Commit. The sampler answers once
its children did, with their outcomes (`PushResult.relayed`)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence

import numpy as np

from ..client.fanout import describe
from ..wire import sampler_pb2 as pb
from .weight_checks import PushError

MAX_RELAY = 256  # addresses one header may list
_END, _ABORT = object(), object()


def relay_groups(addresses: Sequence[str], fanout: int) -> list[list[str]]:
    """`addresses` split into min(fanout, n) contiguous groups of near-equal size."""
    n, k = len(addresses), max(1, min(int(fanout), len(addresses)))
    bounds = [i * (n // k) + min(i, n % k) for i in range(k + 1)]
    return [list(addresses[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]


def check_relay(header: pb.WeightHeader, memory: bool, tls: bool) -> None:
    """PushError when this server cannot relay the push `header` asks it to relay."""
    to = list(header.relay_to)
    if not memory:
        raise PushError.precondition(
            "header.relay_to: relaying needs push_staging='memory' on the relaying sampler"
        )
    if tls:
        raise PushError.precondition(
            "header.relay_to: a TLS sampler does not relay (onward pushes are plaintext)"
        )
    if len(to) > MAX_RELAY or len(set(to)) != len(to) or not all(to):
        raise PushError.invalid(
            f"header.relay_to: at most {MAX_RELAY} distinct non-empty addresses, got {len(to)}"
        )


def bearer_token(metadata) -> str | None:
    """The token of an incoming call's `authorization: Bearer ...` metadata, else None."""
    got = dict(metadata or ()).get("authorization", "")
    return got[len("Bearer ") :] if got.startswith("Bearer ") else None


class RelayAborted(Exception):
    """The push being relayed failed at this sampler: the onward pushes are cut before Commit."""


class RelayForward:
    """Forwards one push to its children as `verified(i)` is called (`tensor(i)`: its bytes)."""

    def __init__(
        self,
        header: pb.WeightHeader,
        tensor: Callable[[int], np.ndarray],
        token: str | None,
        timeout: float,
        chunk_bytes: int = 16 << 20,
    ):
        self.header = header
        self._tensor = tensor
        self._names = [(s.name, tuple(int(d) for d in s.shape)) for s in header.tensors]
        fanout = max(1, int(header.relay_fanout))
        groups = relay_groups(list(header.relay_to), fanout)
        self._queues: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in groups]
        self._outcomes: list[list[pb.RelayOutcome]] = [[] for _ in groups]
        self._threads = [
            threading.Thread(
                target=self._forward,
                args=(g, group, fanout, q, token, timeout, chunk_bytes),
                name=f"push-relay-{g}",
                daemon=True,
            )
            for g, (group, q) in enumerate(zip(groups, self._queues))
        ]
        for t in self._threads:
            t.start()

    def _source(self, q: queue.SimpleQueue):
        """Tensors in header order as they are verified; RelayAborted cuts the onward push."""
        ready: dict[int, np.ndarray] = {}
        nxt = 0
        while nxt < len(self._names):
            item = q.get()
            if item is _ABORT:
                raise RelayAborted("the push failed at the relaying sampler")
            if item is _END:
                return
            ready[item[0]] = item[1]
            while nxt in ready:
                yield self._names[nxt][0], ready.pop(nxt)
                nxt += 1

    def _forward(self, g, group, fanout, q, token, timeout, chunk_bytes) -> None:
        from ..client.client import SamplerClient
        from ..client.retry import NO_RETRY

        head, rest = group[0], group[1:]
        try:
            with SamplerClient(head, token=token, timeout=timeout, retry=NO_RETRY) as c:
                r = c.push_weights(
                    self._source(q),
                    int(self.header.version),
                    dtype=self.header.dtype or "float32",
                    chunk_bytes=chunk_bytes,
                    specs=dict(self._names),
                    checksum=self.header.checksum or "sha256",
                    transport="auto",
                    relay_to=rest,
                    relay_fanout=fanout,
                )
            out = [
                pb.RelayOutcome(
                    address=a, ok=x.ok, version=x.version, message=x.message, code=x.code,
                    bytes=x.bytes,
                )
                for a, x in [(head, r), *r.relayed.items()]
            ]  # fmt: skip
        except Exception as e:  # noqa: BLE001 - reported per sampler, never fatal here
            code, msg = describe(e)
            out = [pb.RelayOutcome(address=head, ok=False, version=-1, message=msg, code=code)]
        self._outcomes[g] = out

    def verified(self, i: int) -> None:
        """Tensor i is verified: its view (keeping the staging map alive) goes to every child."""
        arr = self._tensor(i)
        for q in self._queues:
            q.put((i, arr))

    def finish(self, ok: bool, timeout: float | None = None) -> list[pb.RelayOutcome]:
        """Blocking: let the children commit (`ok`) or cut them; -> every forwarded outcome."""
        for q in self._queues:
            q.put(_END if ok else _ABORT)
        for t in self._threads:
            t.join(timeout)
        return [o for outs in self._outcomes for o in outs]
