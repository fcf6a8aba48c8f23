"""Multi-host JAX for the trainer: process start-up, per-host batch shards, agreement between
processes, and the weight push of a resync.

Start-up (`initialize`): `jax.distributed.initialize` from the `distributed` section, else the
environment (`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`; on a TPU pod slice
JAX detects all three); before any other JAX call. Mesh: one (data, fsdp, tensor) mesh over every
device of every host; the jitted step is the same program on every process.

Agreement (`leader_bool`, `leader_json`, `allgather`, `global_versions`): everything that decides
control flow must be the same on every process; these collectives make it so.

Batches -- CHOICE: rollouts are split by slot. Rows are ordered by (slot, sample) and sharded over
('data', 'fsdp'); each process owns the rows on its own devices (`local_row_range`), whole groups
of G = sampler.n rows (`local_slots`), asks the samplers for those slots only, scores and packs
them, and the global arrays are assembled with `jax.make_array_from_process_local_data`
(`global_batch`): no host holds the full batch. (Process 0 receiving and broadcasting everything
was rejected: one host's funnel, a variable-length broadcast every step.)

Resync push (`push_weights`): a collective; no tensor is gathered (`shard_push`).
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
    initialized: bool

    @property
    def is_leader(self) -> bool:
        return self.process_index == 0


def init_kwargs(section, environ: Mapping[str, str] | None = None) -> dict | None:
    """Arguments for `jax.distributed.initialize` from the `distributed` section + environment
    (config values win), or None for a single-process run."""
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
    """Call `jax.distributed.initialize` when the config/environment asks for several processes
    (idempotent). Must come before any other JAX call of the process."""
    kw = init_kwargs(section, environ)
    if kw is not None and not jax.distributed.is_initialized():
        jax.distributed.initialize(**kw)
    return process_info()


def process_info() -> ProcessInfo:
    counts = (
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return ProcessInfo(*counts, bool(jax.distributed.is_initialized()))


def leader_bool(value: bool) -> bool:
    """``value`` as decided by process 0 (identical on every process; a collective)."""
    return bool(leader_json(bool(value)))


def leader_json(value: Any) -> Any:
    """``value`` (JSON-able) as process 0 has it, on every process (a collective; the others'
    ``value`` is ignored)."""
    if jax.process_count() == 1:
        return value
    import json

    from jax.experimental import multihost_utils

    raw = json.dumps(value).encode() if jax.process_index() == 0 else b""
    n = int(np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(len(raw), np.int32))))
    buf = np.zeros(n, np.uint8)
    if raw:
        buf[:] = np.frombuffer(raw, np.uint8)
    return json.loads(np.asarray(multihost_utils.broadcast_one_to_all(buf), np.uint8).tobytes())


def leader_push_targets(pool) -> list[int]:
    """The indices of ``pool``'s samplers a multi-host push goes to, as process 0 chose them (in
    rotation, plus reachable ones when the pool readmits); raises NoActiveSamplerError if none."""
    from dlc_jax.sampler.client.rotation import NoActiveSamplerError

    mine = sorted(pool._push_targets()) if jax.process_index() == 0 else []
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
    """Sorted union over processes of ``local`` (weight versions), each of which must be in
    ``candidates`` (the versions every process holds: snapshots + current)."""
    cands = sorted(candidates)
    unknown = set(local) - set(cands)
    if unknown:
        raise RuntimeError(
            f"rollouts of weight versions {sorted(unknown)} without a theta_s snapshot "
            f"(have {cands})"
        )
    flags = np.asarray([v in local for v in cands], np.int32)
    anyp = allgather(flags).max(axis=0)
    return [v for v, f in zip(cands, anyp) if f]


def make_training_mesh(mesh_section):
    """The (data, fsdp, tensor) training mesh from the `mesh` section, or None for a single device.

    Fixed axis sizes may use fewer devices than exist (first devices), except in a multi-host run,
    which must use all devices of all its processes."""
    from dlc_jax.model import MeshConfig, make_mesh

    m = mesh_section
    mc = MeshConfig(data=m.data, fsdp=m.fsdp, tensor=m.tensor, expert=m.expert)
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
        shape = mc.shape(len(devices))
    except ValueError as e:
        raise ValueError(f"mesh: {e}") from e
    return None if shape == (1, 1, 1) and m.expert == 1 else make_mesh(mc, devices)


def rows_sharding(mesh):
    """Batch-row sharding used by the train step: rows over ('data', 'fsdp')."""
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec(("data", "fsdp")))


def local_row_range(sharding, global_rows: int) -> tuple[int, int]:
    """[start, stop) of the batch rows (axis 0) on this process's devices under `sharding`;
    DistributedError when they are not one contiguous block."""
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
    """The prompt slots (in batch order) whose G = `group_size` rows live on this process.

    slots: the global batch's slots in row order (row r belongs to slots[r // G])."""
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
    """Global `jax.Array`s (rows sharded by `sharding`) from this process's rows of each array.

    local: name -> array [R_local, ...] holding rows `local_row_range(sharding, global_rows)`."""
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
    """Push `model` as weight `version` to `sampler` (`options`: dtype, chunk_bytes, transport):
    a plain `push_model` in a single process, else the collective `shard_push.push_shards`
    (`relay`: None = the pool's), the same result on every process."""
    if jax.process_count() == 1:
        return sampler.push_model(model, version, **options)
    from dlc_jax.sampler.client.pool import SamplerPool

    from .shard_push import push_shards

    targets = leader_push_targets(sampler) if isinstance(sampler, SamplerPool) else [0]
    return push_shards(sampler, model, version, relay=relay, targets=targets, **options)
