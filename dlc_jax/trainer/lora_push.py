"""What a LoRA run's pushes carry (`choose_lora_push`: ``lora.push`` against the sampler's
declaration) and the adapter pusher. Multi-host (`MultiHostAdapterPusher`, a collective): every
process gathers the adapters, process 0 alone pushes (a failure is a result, never an exception, so
no process is left waiting) and broadcasts the outcomes, so every process returns the same result.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import jax

from dlc_jax.lora.config import LoraConfig
from dlc_jax.lora.push import AdapterPusher, AdapterPushError, choose_push, push_one
from dlc_jax.sampler.wire.safetensors_io import NP_DTYPES
from dlc_jax.sampler.wire.types import PushResult
from dlc_jax.trainer.distributed import leader_bool, leader_json, leader_push_targets
from dlc_jax.trainer.shard_push import settle

logger = logging.getLogger(__name__)

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
        results = {i: PushResult(**rows[str(i)], transport="grpc") for i in targets}
        itemsize = NP_DTYPES[dtype].itemsize
        sent = sum(a.size for _, a in tensors) * itemsize * len(targets) if leader else 0
        return settle(pool, results, version, t0, egress_bytes=int(sent), transport="grpc")


def adapter_pusher(cfg: LoraConfig, *, multi: bool, backend: str | None) -> AdapterPusher:
    """The pusher of a ``lora.push=adapter`` run (multi-host: collective)."""
    return MultiHostAdapterPusher(cfg) if multi else AdapterPusher(cfg)


def started_sampler_info(backend: str, rank: int) -> dict:
    """What a sampler the trainer starts itself declares (``--max-lora-rank lora.rank``)."""
    return {"backend": backend, "backend_config": {"max_lora_rank": rank}}


def stored_dtype(model_dir) -> str:
    """The dtype of ``model_dir``'s weights as its ``config.json`` states it ('' if it does not)."""
    try:
        d = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return ""
    return str(d.get("torch_dtype") or d.get("dtype") or "")


def base_issue(cfg, model_dir, *, started_here: bool) -> str:
    """What would make the sampler's base (adapters merge into it) differ from ours, or ''."""
    pd, stored = cfg.model.param_dtype, stored_dtype(model_dir)
    if pd != "float32" and stored != pd:
        return (
            f"model.param_dtype {pd} rounds the base the sampler loads "
            f"({stored or 'dtype unstated'} in {model_dir})"
        )
    if cfg.sft.enabled and not started_here:
        return "the SFT-warmed base is not what a sampler started elsewhere serves"
    return ""


def choose_lora_push(
    cfg, model_dir, info: dict, *, started_here: bool, multi: bool = False
) -> tuple[str, str]:
    """('adapter' | 'merged', why) of ``lora.push`` for ``info``'s sampler (a collective)."""
    issue = base_issue(cfg, model_dir, started_here=started_here)
    choice, why = choose_push(cfg.lora.push, cfg.lora.rank, info, base_issue=issue)
    mine = choice == "adapter"
    if multi and cfg.lora.push == "auto" and leader_bool(mine) != mine:
        choice, why = ("merged" if mine else "adapter"), f"{why} (process 0's)"
    return choice, why
