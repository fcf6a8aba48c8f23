"""`SamplerPool`: N sampler servers behind the `Sampler` interface. Each prompt slot goes to one
in-rotation sampler (round robin by slot id), seeded `slot_seed(seed, slot)`. A sampler whose
Generate or push fails leaves rotation (its slots are re-requested elsewhere) and rejoins only
through a successful full push, so every sampler in rotation holds the latest version."""

from __future__ import annotations

import collections.abc as cabc
import concurrent.futures as cf
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from ..wire.types import PushResult, Rollout, mix_seed
from .client import SamplerClient
from .fanout import describe, fan_out, run_each
from .pool_relay import relayed_push
from .protocol import SamplerBase
from .retry import NO_RETRY, RetryPolicy
from .rotation import NoActiveSamplerError, Rotation

RELAY_MODES = ("off", "chain", "tree", "auto")
_CLIENT_OPTIONS = ("timeout", "max_retries", "backoff", "max_backoff", "retry")  # not the pool's


def relay_mode(relay: str | None, default: str = "off") -> str:
    """`relay` (`default` when None), one of `RELAY_MODES` (ValueError otherwise)."""
    relay = default if relay is None else relay
    if relay not in RELAY_MODES:
        raise ValueError(f"push relay must be one of {RELAY_MODES}, got {relay!r}")
    return relay


def slot_seed(seed: int, slot: int) -> int:
    """Per-slot request seed in [0, 2**31): depends only on (seed, slot)."""
    return mix_seed(seed, slot)


class SamplerPool(SamplerBase):
    """readmit: offer full pushes to out-of-rotation samplers that answer Info within
    probe_timeout; max_inflight: concurrent Generate requests per sampler; queue_depth: tensors
    buffered per sampler in a fanned-out push; relay: pushes' default relay mode."""

    def __init__(
        self,
        addresses,
        *,
        readmit: bool = True,
        probe_timeout: float = 5.0,
        max_inflight: int = 8,
        queue_depth: int = 2,
        relay: str = "off",
        **client_options: Any,
    ):
        self.relay = relay_mode(relay)
        if isinstance(addresses, str):
            addresses = [a.strip() for a in addresses.split(",") if a.strip()]
        addresses = list(addresses)
        if not addresses:
            raise ValueError("SamplerPool: no sampler addresses given")
        if len(set(addresses)) != len(addresses):
            raise ValueError(f"SamplerPool: duplicate sampler addresses in {addresses}")
        self.clients = [SamplerClient(a, **client_options) for a in addresses]
        self.rot = Rotation(addresses)
        self.readmit = readmit
        self.probe_timeout = probe_timeout
        self.max_inflight = max(1, int(max_inflight))
        self.queue_depth = max(1, int(queue_depth))

    # -- rotation (`rotation.Rotation`) ----------------------------------------------------------
    @property
    def address(self) -> str:
        return ",".join(self.addresses)

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.rot.status]

    def rotation(self) -> list[bool]:
        return self.rot.flags()

    def set_rotation(
        self, active: list[bool], version: int | None = None, reason: str = "set by caller"
    ) -> None:
        """Impose a rotation decided elsewhere (multi-host: process 0 pushed; the others follow)."""
        self.rot.impose(active, version, reason)

    def route(self, slot_ids: list[int]) -> dict[int, list[int]]:
        """Sampler index -> positions in `slot_ids` it serves."""
        active = self.rot.require_active()
        out: dict[int, list[int]] = {}
        for k, s in enumerate(slot_ids):
            out.setdefault(active[int(s) % len(active)], []).append(k)
        return out

    def metrics(self) -> dict[str, float]:
        return self.rot.metrics()

    def report(self) -> list[dict]:
        return self.rot.report()

    def info(self, *, timeout: float | None = None, retry: RetryPolicy | None = None) -> dict:
        """Info of the first in-rotation sampler, plus 'pool': the per-sampler report."""
        for i in self.rot.active_indices():
            try:
                d = self.clients[i].info(timeout=timeout, retry=retry)
            except grpc.RpcError as e:
                self.rot.take_out(i, f"info failed: {describe(e)[1]}")
                continue
            return dict(d, pool=self.report())
        raise NoActiveSamplerError(self.rot.why_none())

    def wait_ready(self, timeout: float = 120.0) -> dict:
        """Wait for every sampler; those not ready in `timeout` leave rotation."""
        with cf.ThreadPoolExecutor(len(self.clients)) as ex:
            futs = {i: ex.submit(c.wait_ready, timeout) for i, c in enumerate(self.clients)}
            infos = {}
            for i, f in futs.items():
                try:
                    infos[i] = f.result()
                    self.rot.set_version(i, infos[i]["version"])
                except (TimeoutError, grpc.RpcError) as e:
                    self.rot.take_out(i, f"not ready: {e}")
        active = set(self.rot.active_indices())
        ready = [i for i in sorted(infos) if i in active]
        if not ready:
            raise TimeoutError(self.rot.why_none())
        return dict(infos[ready[0]], pool=self.report())

    # -- generate ---------------------------------------------------------------------------
    def _generate(self, prompts, params, slot_ids, rid) -> Iterator[Rollout]:
        """A sampler failing mid-stream leaves rotation; its missing samples are re-requested."""
        if len(set(int(s) for s in slot_ids)) != len(slot_ids):
            raise ValueError(
                "SamplerPool.generate: slot_ids must be distinct (rollouts are keyed by slot)"
            )
        prompt_of = {int(s): list(p) for s, p in zip(slot_ids, prompts)}
        pending = {int(s): set(range(params.n)) for s in slot_ids}
        out: queue.Queue = queue.Queue()
        stop = threading.Event()
        workers = self.max_inflight * len(self.clients)
        ex = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pool-gen")
        outstanding = 0

        def job(i: int, slot: int, attempt: int):
            p = params
            if params.seed is not None:
                p = dataclasses.replace(params, seed=slot_seed(params.seed, slot))
            try:
                for r in self.clients[i].generate(
                    [prompt_of[slot]], p, [slot], request_id=f"{rid}-{slot}-{attempt}"
                ):
                    if stop.is_set():
                        break
                    out.put(("roll", i, slot, r))
                out.put(("done", i, slot, None))
            except Exception as e:  # reported to the consumer thread
                out.put(("err", i, slot, e))

        attempts: dict[int, int] = {}

        def submit(slot: int):
            nonlocal outstanding
            active = self.rot.require_active()
            attempts[slot] = attempts.get(slot, -1) + 1
            ex.submit(job, active[slot % len(active)], slot, attempts[slot])
            outstanding += 1

        try:
            for s in slot_ids:
                submit(int(s))
            while outstanding:
                kind, i, slot, payload = out.get()
                if kind == "roll":
                    if payload.sample_index in pending[slot]:
                        pending[slot].discard(payload.sample_index)
                        yield payload
                    continue
                outstanding -= 1
                if kind == "err" and not isinstance(payload, grpc.RpcError):
                    raise payload
                if kind == "err":
                    self.rot.generate_failed(i, f"generate failed: {describe(payload)[1]}")
                if pending[slot]:
                    if kind == "done":
                        raise RuntimeError(
                            f"sampler {self.addresses[i]} ended slot {slot} without samples "
                            f"{sorted(pending[slot])}"
                        )
                    self.rot.resubmitted()
                    submit(slot)
        finally:
            stop.set()
            ex.shutdown(wait=False, cancel_futures=True)

    # -- weights ----------------------------------------------------------------------------
    def push_targets(self) -> list[int]:
        targets = []
        for st in self.rot.status:
            if st.active:
                targets.append(st.index)
            elif self.readmit:
                try:  # a probe: its own timeout and no retries (the client's settings are shared)
                    self.clients[st.index].info(timeout=self.probe_timeout, retry=NO_RETRY)
                    targets.append(st.index)
                except grpc.RpcError:
                    pass
        return targets

    def push_weights(
        self,
        named_tensors,
        version: int,
        *,
        specs: cabc.Mapping[str, tuple[int, ...]] | None = None,
        relay: str | None = None,
        **options: Any,
    ) -> PushResult:
        """Push `version` to every in-rotation sampler (and, with readmit, reachable others);
        `options` as `SamplerClient.push_weights`. A callable or one-shot source needs `specs` and
        is read once. `relay` (None: the pool's): one of `RELAY_MODES` (`pool_relay`)."""
        relay = relay_mode(relay, self.relay)
        if not isinstance(named_tensors, (cabc.Mapping, cabc.Sequence)) and specs is None:
            raise TypeError(
                "SamplerPool.push_weights: a callable or iterator source needs specs={name: shape}"
            )

        def push(c: SamplerClient, tensors, **kw) -> PushResult:
            return c.push_weights(tensors, version, specs=specs, **options, **kw)

        def send(targets: list[int]) -> dict[int, PushResult]:
            if relay == "off" or len(targets) == 1:
                return self._push_direct(targets, named_tensors, push)
            return relayed_push(
                self.clients,
                targets,
                named_tensors,
                push,
                relay,
                version,
                self.probe_timeout,
                lambda idx: self._push_direct(idx, named_tensors, push),
            )

        return self.push_round(version, send)

    def push_round(
        self, version: int, push: Callable[[list[int]], dict[int, PushResult]]
    ) -> PushResult:
        """`push(targets)` of `version`, settled on the rotation (NoActiveSamplerError: none)."""
        targets = self.push_targets()
        if not targets:
            raise NoActiveSamplerError(self.rot.why_none())
        t0 = time.monotonic()
        results = push(targets)
        out = self.rot.settle(results, version, time.monotonic() - t0)
        return dataclasses.replace(out, egress_bytes=sum(r.egress_bytes for r in results.values()))

    def _push_direct(self, targets, named_tensors, push) -> dict[int, PushResult]:
        clients = {i: self.clients[i] for i in targets}
        if isinstance(named_tensors, (cabc.Mapping, cabc.Sequence)):
            return run_each(clients, lambda c: push(c, named_tensors))
        source = named_tensors() if callable(named_tensors) else iter(named_tensors)
        return fan_out(clients, source, push, self.queue_depth)

    def push_each(self, version: int, fn: Callable[[SamplerClient], PushResult]) -> PushResult:
        """`push_round` of `fn(client)` on every target concurrently."""
        return self.push_round(version, lambda ts: run_each({i: self.clients[i] for i in ts}, fn))

    def load_weights(self, path: str, version: int) -> PushResult:
        """Every target loads an HF directory from shared storage (concurrently)."""
        return self.push_each(version, lambda c: c.load_weights(path, version))

    def close(self) -> None:
        for c in self.clients:
            c.close()


def connect_samplers(
    address: str, *, token_file: str = "", tls_root_cert: str = "", tls_server_name: str = "", **kw
) -> SamplerClient | SamplerPool:
    """A `SamplerClient` for one address, a `SamplerPool` for a comma-separated list ('' = none)."""
    token = Path(token_file).read_text().strip() if token_file else None
    if token_file and not token:
        raise ValueError(f"sampler.token_file: {token_file!r} is empty")
    tls: dict[str, Any] = {
        "tls_root_cert": tls_root_cert or None,
        "tls_server_name": tls_server_name or None,
    }
    addrs = [a.strip() for a in address.split(",") if a.strip()]
    if not addrs:
        raise ValueError("sampler.address: no address given")
    if len(addrs) == 1:  # the client's own options only
        own = {k: v for k, v in kw.items() if k in _CLIENT_OPTIONS}
        return SamplerClient(addrs[0], token=token, **tls, **own)
    return SamplerPool(addrs, token=token, **tls, **kw)
