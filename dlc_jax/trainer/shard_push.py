"""The multi-host weight push: every trainer process sends the slices of the model it holds itself,
deduplicated across replicas, and process 0 only coordinates the commit.

Which bytes a process sends (`local_slices`): each HF tensor is computed in HF layout where its
parameter lives (the same jitted slice/transpose/cast as the single-host export, run by every
process in the same order), keeping the parameter's sharding; of its shards, a process sends those
on its own devices whose `replica_id` is 0 -- JAX gives exactly one replica 0 per distinct shard
over all devices, so every element of every tensor is sent once, by one process, and no tensor is
ever gathered. A process's bytes out are its devices' share of the model (replicated tensors, e.g.
norms, come from the process holding their replica 0).

The push (`push_shards`), a collective: every process streams its slices as one part of a push
group (`dlc_jax.sampler.slice_stream`) to every in-rotation sampler, concurrently (one pass over its
slices, `fanout.fan_out`); the part outcomes are all-gathered; process 0 then commits the group on
the samplers where every part was accepted (the sampler applies it only if all parts arrived and
every tensor's slices tile it exactly, `dlc_jax.sampler.sliced_push`) and broadcasts the outcome,
so every process returns the same result and a pool settles the same rotation everywhere. Sliced
pushes go directly to each sampler (no relay), as gRPC chunks or over the socket data plane
(`transport`: "socket", or "auto" where the sampler offers a data port and the channel is
plaintext; each process opens its own data connection per sampler and chooses its plane itself);
the target samplers are process 0's choice (a pool's rotation, plus reachable out-of-rotation
samplers when it readmits).
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from collections.abc import Iterator

import jax
import numpy as np

from dlc_jax.sampler.fanout import fan_out, run_each
from dlc_jax.sampler.pool import SamplerPool
from dlc_jax.sampler.rotation import NoActiveSamplerError
from dlc_jax.sampler.safetensors_io import NP_DTYPES
from dlc_jax.sampler.slice_stream import Slice, commit_messages, part_messages
from dlc_jax.sampler.types import PushResult


def _box(index: tuple, shape: tuple[int, ...]) -> tuple[list[int], list[int]]:
    start = [0 if s.start is None else int(s.start) for s in index]
    stop = [d if s.stop is None else int(s.stop) for s, d in zip(index, shape)]
    return start, stop


def local_slices(model, dtype: str = "float32") -> Iterator[Slice]:
    """(HF name, start, stop, values) of every shard this process sends (replica 0 on one of its
    devices), tensor by tensor in `hf_param_shapes` order. Every process must iterate it to the
    end, in step (the conversions are multi-process computations)."""
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
) -> PushResult:
    """Push `model` as weight `version` from every process's own shards (module docstring).
    Collective. `sampler`: a SamplerClient or SamplerPool; `transport`: "grpc", "socket" or
    "auto" (decided per sampler). The result's `egress_bytes`: tensor bytes this process sent
    (all samplers together); its `transport`: the plane(s) this process's parts used."""
    from jax.experimental import multihost_utils

    if transport not in ("grpc", "socket", "auto"):
        raise ValueError(f"push transport must be 'grpc', 'socket' or 'auto', got {transport!r}")

    from dlc_jax.model import hf_param_shapes

    pool = sampler if isinstance(sampler, SamplerPool) else None
    if pool is None and not hasattr(sampler, "push_messages"):
        raise TypeError(
            f"sampler.backend: a multi-host push needs gRPC samplers, not {type(sampler).__name__}"
        )
    clients = list(pool.clients) if pool is not None else [sampler]
    nproc, me = jax.process_count(), jax.process_index()
    targets = [0]
    if pool is not None:  # process 0's choice (in rotation, or reachable when the pool readmits)
        mine = set(pool._push_targets()) if me == 0 else set()
        mask = np.asarray([int(i in mine) for i in range(len(clients))], np.int32)
        mask = np.asarray(multihost_utils.broadcast_one_to_all(mask))
        targets = [i for i, a in enumerate(mask) if a]
        if not targets:
            raise NoActiveSamplerError(pool.rot.why_none())
    gid = np.asarray(secrets.randbits(62), np.int64)
    group = f"{int(np.asarray(multihost_utils.broadcast_one_to_all(gid))):016x}-v{version}"
    names_shapes = list(hf_param_shapes(model.config).items())
    lock, sent = threading.Lock(), [0]

    def count(n: int) -> None:
        with lock:
            sent[0] += n

    planes: set[str] = set()

    def push(c, items) -> PushResult:
        def stream(send_data=None, push_id=""):
            return part_messages(
                items,
                names_shapes,
                version,
                dtype,
                group=group,
                part=me,
                parts=nproc,
                chunk_bytes=chunk_bytes,
                on_sent=count,
                send_data=send_data,
                push_id=push_id,
            )

        plane = c.push_transport() if transport == "auto" else transport
        planes.add(plane)
        return c.push_with_data(stream) if plane == "socket" else c.push_messages(stream())

    t0 = time.monotonic()
    parts = fan_out({i: clients[i] for i in targets}, local_slices(model, dtype), push, 2)
    accepted = np.asarray([int(parts[i].ok) for i in targets], np.int32)
    every = np.asarray(multihost_utils.process_allgather(accepted)).reshape(nproc, len(targets))
    commits: dict[int, PushResult] = {}
    if me == 0:
        ready = {i: clients[i] for i, a in zip(targets, every.min(axis=0)) if a}
        if ready:
            commits = run_each(
                ready, lambda c: c.push_messages(commit_messages(version, group, nproc))
            )
    rows = [[int(commits[i].ok), commits[i].version] if i in commits else [0, -1] for i in targets]
    outcome = np.asarray(rows, np.int64)
    outcome = np.asarray(multihost_utils.broadcast_one_to_all(outcome)).reshape(len(targets), 2)
    results: dict[int, PushResult] = {}
    for k, i in enumerate(targets):
        ok, ver = bool(outcome[k, 0]), int(outcome[k, 1])
        failed = [p for p in range(nproc) if not every[p, k]]
        if failed:
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
    seconds = time.monotonic() - t0
    if pool is not None:
        out = pool.rot.settle(results, version, seconds)
    else:
        out = dataclasses.replace(results[0], seconds=seconds)
    return dataclasses.replace(out, egress_bytes=sent[0], transport="+".join(sorted(planes)))
