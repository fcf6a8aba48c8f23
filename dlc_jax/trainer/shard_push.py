"""The multi-host weight push (`push_shards`, a collective): every process streams the shards on its
own devices with `replica_id` 0 (each element sent once, no tensor gathered) as one part of a push
group; process 0 commits the group where every part was accepted and broadcasts the outcome. With
a relay every process sends to the first target only, which forwards along the others.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from collections.abc import Iterator

import grpc
import jax
import numpy as np

from dlc_jax.sampler.client.client import SamplerClient
from dlc_jax.sampler.client.fanout import fan_out, run_each
from dlc_jax.sampler.client.pool import SamplerPool, relay_mode
from dlc_jax.sampler.client.pool_relay import fanout_of
from dlc_jax.sampler.client.protocol import check_transport
from dlc_jax.sampler.client.retry import NO_RETRY
from dlc_jax.sampler.push.slice_stream import Slice, commit_messages, part_messages
from dlc_jax.sampler.wire.safetensors_io import NP_DTYPES
from dlc_jax.sampler.wire.types import PushResult


def _box(index: tuple, shape: tuple[int, ...]) -> tuple[list[int], list[int]]:
    start = [0 if s.start is None else int(s.start) for s in index]
    stop = [d if s.stop is None else int(s.stop) for s, d in zip(index, shape)]
    return start, stop


def local_slices(model, dtype: str = "float32") -> Iterator[Slice]:
    """(HF name, start, stop, values) of every shard this process sends, in `hf_param_shapes`
    order. Every process must iterate it to the end in step (multi-process computations)."""
    from dlc_jax.model.hf_io import hf_device_tensors

    # kernels transposed on the devices: each shard is sent as it lies there, in HF layout
    for name, x, _ in hf_device_tensors(model, dtype=NP_DTYPES[dtype], host_transpose=False):
        for sh in x.addressable_shards:
            if sh.replica_id == 0:
                start, stop = _box(sh.index, tuple(x.shape))
                yield name, start, stop, np.asarray(sh.data)


def push_shards(
    sampler,
    model,
    version: int,
    *,
    dtype: str = "float32",
    chunk_bytes: int = 16 << 20,
    transport: str = "grpc",
    relay: str | None = None,
    targets: list[int],
) -> PushResult:
    """Push `model` as weight `version` (module doc). `targets`: the pool's sampler indices ([0]
    for a client); `relay`: None = the pool's. `egress_bytes` / `transport`: this process's."""
    from jax.experimental import multihost_utils

    check_transport(transport)
    pool = sampler if isinstance(sampler, SamplerPool) else None
    if pool is None and not isinstance(sampler, SamplerClient):
        raise TypeError(
            f"sampler.backend: a multi-host push needs gRPC samplers, not {type(sampler).__name__}"
        )
    relay = relay_mode(relay, pool.relay if pool is not None else "off")
    clients = list(pool.clients) if pool is not None else [sampler]
    gid = np.asarray(secrets.randbits(62), np.int64)
    group = f"{int(np.asarray(multihost_utils.broadcast_one_to_all(gid))):016x}-v{version}"
    rounds = _Rounds(clients, model, version, dtype, chunk_bytes, transport)
    t0 = time.monotonic()
    if relay != "off" and len(targets) > 1:
        assert pool is not None  # several targets: a pool
        fanout = fanout_of(relay, len(targets))
        results = _relayed(rounds, targets, group, fanout, pool.probe_timeout)
    else:
        results = rounds.run(targets, group)
    planes = "+".join(sorted(rounds.planes))
    return settle(pool, results, version, t0, egress_bytes=rounds.sent, transport=planes)


def settle(pool, results: dict[int, PushResult], version: int, t0: float, **fields) -> PushResult:
    """The result of a push begun at ``t0`` (a pool settles its rotation), ``fields`` set."""
    seconds = time.monotonic() - t0
    if pool is None:
        return dataclasses.replace(results[0], seconds=seconds, **fields)
    return dataclasses.replace(pool.rot.settle(results, version, seconds), **fields)


class _Rounds:
    """Sliced push rounds of one model version, each a collective (`push_shards`)."""

    def __init__(self, clients, model, version, dtype, chunk_bytes, transport):
        self.clients, self.model, self.version = clients, model, version
        self.dtype, self.chunk_bytes, self.transport = dtype, chunk_bytes, transport
        from dlc_jax.model import hf_param_shapes

        self.names_shapes = list(hf_param_shapes(model.config).items())
        self.sent = 0  # tensor bytes this process handed to a transport, every round
        self.planes: set[str] = set()
        self._lock = threading.Lock()
        self.commits: dict[int, PushResult] = {}  # process 0: the last round's commit results

    def _count(self, n: int) -> None:
        with self._lock:
            self.sent += n

    def run(
        self, targets: list[int], group: str, relay_to: list[str] | None = None, fanout: int = 1
    ) -> dict[int, PushResult]:
        """One round to `targets`; per target, the same result on every process."""
        from jax.experimental import multihost_utils

        nproc, me = jax.process_count(), jax.process_index()

        def push(c, items) -> PushResult:
            def stream(send_data=None, push_id=""):
                return part_messages(
                    items,
                    self.names_shapes,
                    self.version,
                    self.dtype,
                    group=group,
                    part=me,
                    parts=nproc,
                    chunk_bytes=self.chunk_bytes,
                    on_sent=self._count,
                    send_data=send_data,
                    push_id=push_id,
                    relay_to=relay_to or (),
                    relay_fanout=fanout,
                )

            plane = c.push_transport() if self.transport == "auto" else self.transport
            self.planes.add(plane)
            return c.push_with_data(stream) if plane == "socket" else c.push_messages(stream())

        clients = {i: self.clients[i] for i in targets}
        parts = fan_out(clients, local_slices(self.model, self.dtype), push, 2)
        accepted = np.asarray([int(parts[i].ok) for i in targets], np.int32)
        every = np.asarray(multihost_utils.process_allgather(accepted)).reshape(nproc, len(targets))
        commits: dict[int, PushResult] = {}
        if me == 0:
            if ready := {i: clients[i] for i, a in zip(targets, every.min(axis=0)) if a}:
                commits = run_each(
                    ready,
                    lambda c: c.push_messages(commit_messages(self.version, group, nproc)),
                )
        self.commits = commits
        rows = [
            [int(c.ok), c.version] if (c := commits.get(i)) is not None else [0, -1]
            for i in targets
        ]
        outcome = np.asarray(rows, np.int64)
        outcome = np.asarray(multihost_utils.broadcast_one_to_all(outcome)).reshape(len(targets), 2)
        results: dict[int, PushResult] = {}
        for k, i in enumerate(targets):
            ok, ver = bool(outcome[k, 0]), int(outcome[k, 1])
            if failed := [p for p in range(nproc) if not every[p, k]]:
                why = f"parts of processes {failed} were refused"
                own = parts[i].message if me in failed else ""
                msg = f"{why}{': ' + own if own else ''}; group not committed"
            elif i in commits:
                msg = commits[i].message
            else:
                msg = f"committed by process 0: {'ok' if ok else 'refused'}"
            results[i] = PushResult(
                ok, ver if ok else -1, msg, bytes=parts[i].bytes, code="OK" if ok else "ABORTED"
            )
        return results


def _relayed(
    rounds: _Rounds, targets: list[int], group: str, fanout: int, probe_timeout: float
) -> dict[int, PushResult]:
    """A round relayed by the first target; those it missed get a direct round."""
    from jax.experimental import multihost_utils

    head, rest = targets[0], targets[1:]
    addrs = [rounds.clients[i].address for i in rest]
    results = rounds.run([head], group, relay_to=addrs, fanout=fanout)
    rows = np.zeros((len(rest), 2), np.int64)
    if jax.process_index() == 0:  # process 0 holds the group commit's relay outcomes
        commit = rounds.commits.get(head)
        relayed = commit.relayed if commit is not None else {}
        for k, (i, a) in enumerate(zip(rest, addrs)):
            sub = relayed.get(a)
            if sub is not None and sub.ok:
                rows[k] = (1, sub.version)
                continue
            try:  # e.g. the head failed its own swap after its children committed
                v = rounds.clients[i].info(timeout=probe_timeout, retry=NO_RETRY)["version"]
            except grpc.RpcError:
                v = -1
            rows[k] = (1, v) if v == rounds.version else (0, -1)
    rows = np.asarray(multihost_utils.broadcast_one_to_all(rows)).reshape(len(rest), 2)
    for k, i in enumerate(rest):
        if rows[k, 0]:
            results[i] = PushResult(
                True, int(rows[k, 1]), "took the relayed push", code="OK", transport="relay"
            )
    missed = [i for k, i in enumerate(rest) if not rows[k, 0]]
    if missed:  # a failed hop: its subtree gets a direct round (every process sends again)
        results.update(rounds.run(missed, f"{group}-direct"))
    return results
