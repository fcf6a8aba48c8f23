"""Multi-host JAX for the trainer: start-up (`initialize`, before any other JAX call), collectives
that keep control flow identical on every process (`leader_json`, `allgather`, `global_versions`),
per-host batch shards and the collective weight push (`push_weights`). Each process owns the batch
rows on its devices (`local_row_range`; whole groups of G = sampler.n: `local_slots`), requests,
scores and packs those alone; `global_batch` assembles the global arrays, no host funnels them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from dlc_jax.sampler.client.protocol import Sampler
from dlc_jax.sampler.wire.types import PushResult

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


class DistributedError(RuntimeError):
    """A multi-host setting or layout that cannot work (the message names the key or quantity)."""


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """Where this process stands: index/count of processes, local/global device counts."""

    process_index: int
    process_count: int
    local_devices: int
    global_devices: int

    @property
    def is_leader(self) -> bool:
        return self.process_index == 0


def init_kwargs(section, environ: Mapping[str, str] | None = None) -> dict | None:
    """`jax.distributed.initialize` arguments (section, else ``JAX_*``); None: one process."""
    env = os.environ if environ is None else environ
    if section.mode == "never":
        return None

    def env_int(name: str) -> int | None:
        raw = env.get(name, "").strip()
        try:
            return int(raw) if raw else None
        except ValueError:
            raise DistributedError(f"environment {name}={raw!r} is not an integer") from None

    coord = section.coordinator_address or env.get(ENV_COORDINATOR, "").strip() or None
    num = section.num_processes if section.num_processes != -1 else env_int(ENV_NUM_PROCESSES)
    pid = section.process_id if section.process_id != -1 else env_int(ENV_PROCESS_ID)
    if section.mode == "auto" and coord is None and (num is None or num <= 1):
        return None
    given = {
        "coordinator_address": (coord, ENV_COORDINATOR),
        "num_processes": (num, ENV_NUM_PROCESSES),
        "process_id": (pid, ENV_PROCESS_ID),
    }
    missing = [(k, e) for k, (v, e) in given.items() if v is None]
    if section.mode == "auto" and missing:
        raise DistributedError(
            f"distributed.{missing[0][0]}: needed with the other distributed settings "
            f"(set it in the config or ${missing[0][1]})"
        )
    if num is not None and pid is not None and not 0 <= pid < num:
        raise DistributedError(f"distributed.process_id: {pid} is not in [0, num_processes={num})")
    kw: dict[str, Any] = {k: v for k, (v, _) in given.items() if v is not None}
    return {"initialization_timeout": int(section.initialization_timeout_s), **kw}


def initialize(section, environ: Mapping[str, str] | None = None) -> ProcessInfo:
    """`jax.distributed.initialize` when several processes are asked for (idempotent)."""
    kw = init_kwargs(section, environ)
    if kw is not None and not jax.distributed.is_initialized():
        jax.distributed.initialize(**kw)
    return process_info()


def process_info() -> ProcessInfo:
    return ProcessInfo(
        jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count()
    )


def leader_bool(value: bool) -> bool:
    """``value`` as decided by process 0 (identical on every process; a collective)."""
    return bool(leader_json(bool(value)))


def leader_json(value: Any) -> Any:
    """``value`` (JSON-able) as process 0 has it, on every process (a collective)."""
    if jax.process_count() == 1:
        return value
    import json

    from jax.experimental import multihost_utils

    raw = json.dumps(value).encode() if jax.process_index() == 0 else b""
    n = int(np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(len(raw), np.int32))))
    buf = np.frombuffer(raw, np.uint8).copy() if raw else np.zeros(n, np.uint8)
    return json.loads(np.asarray(multihost_utils.broadcast_one_to_all(buf), np.uint8).tobytes())


def leader_push_targets(pool) -> list[int]:
    """The sampler indices of ``pool`` a push goes to, as process 0 chose them."""
    from dlc_jax.sampler.client.rotation import NoActiveSamplerError

    mine = sorted(pool.push_targets()) if jax.process_index() == 0 else []
    targets = [int(i) for i in leader_json(mine)]
    if not targets:
        raise NoActiveSamplerError(pool.rot.why_none())
    return targets


def allgather(x) -> np.ndarray:
    """[P, ...] stack of ``x`` from every process ([1, ...] in a single process)."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x[None]
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x))


def global_versions(local: set[int], candidates: set[int]) -> list[int]:
    """Sorted union over processes of the weight versions ``local``, each in ``candidates``."""
    cands = sorted(candidates)
    if unknown := set(local) - set(cands):
        raise RuntimeError(
            f"rollouts of weight versions {sorted(unknown)} without a theta_s snapshot "
            f"(have {cands})"
        )
    anyp = allgather(np.asarray([v in local for v in cands], np.int32)).max(axis=0)
    return [v for v, f in zip(cands, anyp) if f]


def make_training_mesh(m):
    """The (data, fsdp, tensor) mesh of the `mesh` section (a `MeshConfig`); None for one device."""
    from dlc_jax.model import make_mesh

    devices = jax.devices()
    if -1 not in (m.data, m.fsdp, m.tensor):
        need = m.data * m.fsdp * m.tensor * m.expert
        if need > len(devices):
            raise ValueError(
                f"mesh: data*fsdp*tensor = {need} devices, only {len(devices)} available"
            )
        if jax.process_count() > 1 and need != len(devices):
            raise ValueError(
                f"mesh: data*fsdp*tensor = {need} but a multi-host run must use all "
                f"{len(devices)} devices of its {jax.process_count()} processes (use -1 for one "
                "axis)"
            )
        devices = devices[:need]
    try:
        shape = m.shape(len(devices))
    except ValueError as e:
        raise ValueError(f"mesh: {e}") from e
    return None if shape == (1, 1, 1) and m.expert == 1 else make_mesh(m, devices)


def rows_sharding(mesh):
    """The train step's batch rows over ('data', 'fsdp')."""
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec(("data", "fsdp")))


def local_row_range(sharding, global_rows: int) -> tuple[int, int]:
    """[start, stop) of the batch rows on this process's devices (DistributedError if split)."""
    idx = sharding.addressable_devices_indices_map((int(global_rows),))
    spans = sorted(
        {(s[0].start or 0, global_rows if s[0].stop is None else s[0].stop) for s in idx.values()}
    )
    start, stop = spans[0]
    for a, b in spans[1:]:
        if a > stop:
            raise DistributedError(
                f"this process's batch rows are not contiguous: {spans} of {global_rows} "
                f"(device order of the mesh interleaves hosts on the batch axes)"
            )
        stop = max(stop, b)
    return int(start), int(stop)


def local_slots(slots: list[int], group_size: int, sharding) -> list[int]:
    """The slots (of the global batch, in row order) whose G = `group_size` rows are local."""
    rows = len(slots) * int(group_size)
    start, stop = local_row_range(sharding, rows)
    if start % group_size or stop % group_size:
        raise DistributedError(
            f"train.batch_prompts: this process owns rows [{start}, {stop}) of {rows}, which "
            f"splits a group of sampler.n={group_size}; batch_prompts ({len(slots)}) must be a "
            "multiple of the number of row shards per process boundary (use batch_prompts "
            f"divisible by jax.process_count()={jax.process_count()} times the row shards)"
        )
    return list(slots[start // group_size : stop // group_size])


def global_batch(local: Mapping[str, np.ndarray], sharding, global_rows: int) -> dict:
    """Global `jax.Array`s from this process's rows (`local_row_range`) of each array."""
    start, stop = local_row_range(sharding, global_rows)
    out = {}
    for k, a in local.items():
        a = np.asarray(a)
        if a.shape[0] != stop - start:
            raise DistributedError(
                f"batch array {k!r}: {a.shape[0]} local rows, this process owns "
                f"{stop - start} (rows [{start}, {stop}) of {global_rows})"
            )
        out[k] = jax.make_array_from_process_local_data(
            sharding, a, (int(global_rows),) + a.shape[1:]
        )
    return out


def push_weights(
    sampler: Sampler, model, version: int, *, relay: str | None = None, **options: Any
) -> PushResult:
    """Push `model` as weight `version`: `push_model` in one process, else the collective
    `shard_push.push_shards` (`relay`: None = the pool's). `options`: dtype, chunk_bytes, ..."""
    if jax.process_count() == 1:
        return sampler.push_model(model, version, **options)
    from dlc_jax.sampler.client.pool import SamplerPool

    from .shard_push import push_shards

    targets = leader_push_targets(sampler) if isinstance(sampler, SamplerPool) else [0]
    return push_shards(sampler, model, version, relay=relay, targets=targets, **options)
