"""``lora.push: adapter`` in a multi-host run: a collective, called by every trainer process at the
same point of the resync (as the full push, `trainer.distributed.push_weights`).

1. Every process gathers the adapter factors (`export.peft_tensors`: one all-gather of every
   factor, which may be sharded over other processes' devices; adapters are small, a rank-8
   adapter of Qwen3-8B is 0.27% of the model) and, at the first push only, the base's fingerprint
   (`push.hf_base_fingerprint`: the frozen base, gathered one tensor at a time).
2. The target samplers are process 0's choice (one `SamplerClient`, or a `SamplerPool`'s
   rotation / readmission targets), broadcast.
3. Process 0 alone pushes the adapter to each target (`push.push_one`: gRPC, the same
   checksummed stream and checks as a single-host adapter push); a sampler that fails or refuses
   is a failed result, never an exception (so no process is left waiting in a collective).
4. Process 0 broadcasts each target's outcome (ok, version, code, message, bytes); every process
   returns the same `PushResult` and a pool settles the same rotation everywhere, so every process
   takes the same snapshot / resync decision and routes rollouts to the same samplers.

The other processes send no bytes (``egress_bytes`` 0); process 0 sends the adapter once per
sampler.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax

from dlc_jax.lora.push import AdapterPusher, AdapterPushError, push_one
from dlc_jax.sampler.wire.safetensors_io import NP_DTYPES
from dlc_jax.sampler.wire.types import PushResult
from dlc_jax.trainer.distributed import leader_json, leader_push_targets

MESSAGE_CHARS = 2000  # a sampler's message as broadcast to the other processes (the rest cut)


def _row(r: PushResult) -> dict:
    return {
        "ok": bool(r.ok),
        "version": int(r.version),
        "message": r.message[:MESSAGE_CHARS],
        "code": r.code,
        "bytes": int(r.bytes),
    }


class MultiHostAdapterPusher(AdapterPusher):
    """`AdapterPusher` of a multi-host run (module docstring); `push` is a collective."""

    def push(self, sampler: Any, model, version: int, *, dtype: str = "float32") -> PushResult:
        from dlc_jax.sampler.client.client import SamplerClient
        from dlc_jax.sampler.client.fanout import run_each
        from dlc_jax.sampler.client.pool import SamplerPool

        pool = sampler if isinstance(sampler, SamplerPool) else None
        if pool is None and not isinstance(sampler, SamplerClient):
            raise AdapterPushError(
                "lora.push=adapter: a multi-host run pushes adapters to sampler servers "
                f"(sampler.address), not to {type(sampler).__name__}"
            )
        tensors, meta = self.payload(model)  # collective: every process gathers
        leader = jax.process_index() == 0
        clients = list(pool.clients) if pool is not None else [sampler]
        targets = leader_push_targets(pool) if pool is not None else [0]
        t0 = time.monotonic()
        rows: dict[str, dict] = {}
        if leader:
            done = run_each(
                {i: clients[i] for i in targets},
                lambda c: push_one(c, tensors, version, meta, dtype),
            )
            rows = {str(i): _row(r) for i, r in done.items()}
        rows = leader_json(rows)
        results = {
            i: PushResult(
                rows[str(i)]["ok"],
                rows[str(i)]["version"],
                rows[str(i)]["message"],
                bytes=rows[str(i)]["bytes"],
                code=rows[str(i)]["code"],
                transport="grpc",
            )
            for i in targets
        }
        seconds = time.monotonic() - t0
        itemsize = NP_DTYPES[dtype].itemsize
        sent = sum(a.size for _, a in tensors) * itemsize * len(targets) if leader else 0
        if pool is not None:
            out = pool.rot.settle(results, version, seconds)
        else:
            out = dataclasses.replace(results[0], seconds=seconds)
        return dataclasses.replace(out, egress_bytes=int(sent), transport="grpc")
