"""The trainer's link to its sampler(s): spawn or connect, reconnect, push weights, watch rotation.

`SamplerLink.client`: a client of ``sampler.address`` (a pool for several), of a loopback sampler
spawned here, an `InProcessSampler`, or a `Sampler` handed in (never closed or replaced here). A
multi-host run never reconnects on its own (it must be collective): restart every process.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from dlc_jax.errors import UserError, one_line
from dlc_jax.sampler.client.protocol import Sampler
from dlc_jax.sampler.client.retry import RetryPolicy, call_with_retry
from dlc_jax.sampler.service.process import SamplerProcess
from dlc_jax.sampler.wire.types import PushResult
from dlc_jax.trainer import distributed as dist

logger = logging.getLogger(__name__)

# A push that fails after the client's own retries: reconnect and push again, 5 attempts in all.
PUSH_RECONNECTS = RetryPolicy(max_retries=4, backoff=0.0, max_backoff=0.0)


class SamplerUnavailable(UserError, RuntimeError):
    """The sampler could not be reached (or brought back) within the configured limits."""


class SamplerLink:
    """The sampler connection of one run. model_dir / log_dir: what a spawned sampler serves and
    where it logs; on_reconnect: called after each reconnect; sampler: one to use as it is."""

    def __init__(
        self,
        sampler_cfg: Any,
        *,
        model_dir: Path,
        log_dir: str,
        multi: bool,
        on_reconnect: Callable[[], None] | None = None,
        sampler: Sampler | None = None,
    ):
        if sampler_cfg.backend == "inprocess" and sampler_cfg.address and sampler is None:
            raise SamplerUnavailable(
                f"sampler.backend=inprocess runs the sampler inside the trainer: leave "
                f"sampler.address empty (got {sampler_cfg.address!r}) or pick the backend "
                f"the sampler there serves"
            )
        self.cfg = sampler_cfg
        self.model_dir = model_dir
        self.log_dir = Path(log_dir)
        self.multi = multi
        self.on_reconnect = on_reconnect
        self._client: Sampler | None = None
        self._given = sampler
        self.process: SamplerProcess | None = None
        self._last_rotation: list[bool] | None = None
        self._connected_once = False
        # lora.push=adapter: an `AdapterPusher`, set before connect() (a spawned sampler serves it)
        self.adapter: Any = None

    @property
    def client(self) -> Sampler:
        if self._client is None:
            raise SamplerUnavailable("sampler: not connected (SamplerLink.connect was not called)")
        return self._client

    @property
    def push_dtype(self) -> str:
        """Wire dtype of pushes: the serving dtype (a spawned float16 sampler serves bf16)."""
        d = self.cfg.dtype
        return "bfloat16" if (d == "float16" and not self.cfg.address) else d

    # ---- connect / reconnect -----------------------------------------------------------------
    def connect(self) -> None:
        """Connect to ``sampler.address`` (within ``connect_timeout_s`` the first time, else
        ``reconnect_timeout_s``) or (re)spawn a loopback sampler."""
        from dlc_jax.sampler.client.pool import connect_samplers

        s = self.cfg
        if self._given is not None:
            self._client = self._given
            return
        if self._client is not None:
            self._client.close()
            self._client = None
        if s.address:
            first = not self._connected_once
            limit = s.connect_timeout_s if first else s.reconnect_timeout_s
            client = self._client = connect_samplers(
                s.address,
                token_file=s.token_file,
                tls_root_cert=s.tls_root_cert,
                tls_server_name=s.tls_server_name,
                timeout=s.reconnect_timeout_s,
                relay=s.push_relay,
                **self._retry_kw(),
            )
            try:
                client.wait_ready(limit)
            except (TimeoutError, grpc.RpcError) as e:
                if not first:
                    raise
                raise SamplerUnavailable(self._connect_failure(e, limit)) from e
            self._connected_once = True
            self._check_limits()
            return
        if self.multi:
            raise ValueError(
                "sampler.address: a multi-host run needs running sampler servers "
                "(host:port[,host:port]); it cannot spawn a loopback sampler per process"
            )
        self._spawn()

    def _check_limits(self) -> None:
        """Refuse a sampler serving less than ``sampler.max_model_len`` (the data's limit)."""
        served = int(self.client.info().get("max_model_len") or 0)
        if 0 < served < self.cfg.max_model_len:
            raise SamplerUnavailable(
                f"sampler.address {self.cfg.address}: the sampler serves max_model_len {served} < "
                f"sampler.max_model_len {self.cfg.max_model_len}; set sampler.max_model_len="
                f"{served} (prompts longer than {served} - sampler.max_tokens are then dropped "
                f"at load) or restart the sampler with --max-model-len {self.cfg.max_model_len}"
            )

    def _connect_failure(self, e: BaseException, limit: float) -> str:
        s = self.cfg
        code = e.code() if isinstance(e, grpc.RpcError) else None
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return (
                f"sampler.address {s.address}: the sampler refused the token (UNAUTHENTICATED); "
                f"check sampler.token_file ({s.token_file or 'none given'})"
            )
        return one_line(
            f"sampler.address {s.address}: no sampler answered within {limit:g}s "
            f"(sampler.connect_timeout_s); start one there (`dlc-jax sampler serve ...`), fix "
            f"the address, or leave sampler.address empty to spawn one on loopback",
            400,
        )

    def _spawn(self) -> None:
        s = self.cfg
        if s.backend == "inprocess":  # the JAX backend in this process: nothing to spawn
            from dlc_jax.sampler.client.inprocess import InProcessSampler

            self._client = InProcessSampler.from_section(s, self.model_dir)
            logger.info("sampler: jax backend in process (%s)", self.model_dir)
            return
        if self.process is not None:
            self.process.kill()
        flags = {
            "--dtype": s.dtype if s.dtype != "float16" else "bfloat16",
            "--max-model-len": s.max_model_len,
            "--max-head-k": max(1, s.head_k),
            "--max-n": max(1, s.n),
            "--initial-version": 0,
            "--quantization": s.quantization or None,
            "--weight-noise": s.weight_noise or None,
            "--max-lora-rank": None if self.adapter is None else self.adapter.cfg.rank,
            # loopback: the raw socket data plane is safe and faster
            "--push-data-port": 0 if s.push_transport != "grpc" else None,
        }
        extra = [x for k, v in flags.items() if v is not None for x in (k, str(v))]
        log_file = str(self.log_dir / "sampler.log")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # vLLM-CPU defaults reserve ~90% of RAM for KV cache and fork workers: not next to a trainer
        env = {
            k: v
            for k, v in (("VLLM_CPU_KVCACHE_SPACE", "1"), ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"))
            if k not in os.environ
        }
        try:
            self.process = SamplerProcess(
                s.backend,
                str(self.model_dir),
                extra_args=extra,
                log_file=log_file,
                env=env,
                startup_timeout=s.startup_timeout_s,
            ).start()
        except (RuntimeError, TimeoutError) as e:  # exited or not listening: its log says why
            raise SamplerUnavailable(one_line(f"spawned sampler did not start: {e}", 500)) from e
        self._client = self.process.client(timeout=s.reconnect_timeout_s, **self._retry_kw())
        logger.info("sampler: %s on %s (log %s)", s.backend, self.process.address, log_file)

    def _retry_kw(self) -> dict[str, Any]:
        s = self.cfg
        return dict(
            max_retries=s.retries, backoff=s.retry_backoff_s, max_backoff=s.retry_max_backoff_s
        )

    def reconnect(self, err: BaseException) -> None:
        """Wait for the sampler to come back (or respawn it)."""
        if self.multi:
            raise SamplerUnavailable(
                f"process {dist.process_info().process_index}: sampler(s) {self.cfg.address} "
                f"failed ({type(err).__name__}: {str(err)[:200]}); a multi-host run does not "
                "reconnect on its own -- restart all processes (training resumes from the last "
                "checkpoint)"
            )
        logger.info("sampler failed (%s: %s); reconnecting", type(err).__name__, str(err)[:200])
        limit = self.cfg.reconnect_timeout_s
        poll = RetryPolicy(max_retries=None, backoff=1.0, max_backoff=1.0, deadline_s=limit)
        try:
            call_with_retry(self.connect, poll, retryable=lambda e: True)
        except Exception as e:
            raise SamplerUnavailable(f"sampler did not come back within {limit}s: {e}") from e
        if self.on_reconnect is not None:
            self.on_reconnect()

    def restart_detected(self, synced_version: int) -> BaseException | None:
        """Why the sampler must be recovered (no answer, or restarted), or None."""
        if self.multi:
            return None
        from dlc_jax.sampler.client.inprocess import SamplerClosed

        try:
            v = self.client.info()["version"]
        except (grpc.RpcError, SamplerClosed) as e:
            return e
        if v < synced_version:
            return RuntimeError(
                f"sampler serves version {v} < last pushed {synced_version} (restarted)"
            )
        return None

    # ---- weights -----------------------------------------------------------------------------
    def push(self, version: int, model_fn: Callable[[], Any], reason: str) -> PushResult | None:
        """Push ``model_fn()`` as weight ``version``; None when the sampler serves version 0."""
        if version == 0 and dist.leader_bool(self.client.info()["version"] == 0):
            return None
        t0 = time.time()
        whole = self.adapter is None
        push = dist.push_weights if whole else self.adapter.push
        kw = {"transport": self.cfg.push_transport} if whole else {}
        res = push(self.client, model_fn(), version, dtype=self.push_dtype, **kw)
        if not res.ok:
            raise RuntimeError(f"sampler rejected weight push v{version} ({reason}): {res.message}")
        logger.info(
            "push: version %d (%s) %s%.3f MB %s via %s in %.2fs%s",
            version,
            reason,
            "" if whole else "adapter ",
            res.bytes / 1e6,
            self.push_dtype,
            res.transport or "grpc",
            time.time() - t0,
            f"; {res.message}" if res.per_sampler else "",
        )
        if res.removed:
            out = list(res.removed)
            logger.info("samplers out of rotation after the push of version %d: %s", version, out)
        return res

    def push_retrying(
        self, version: int, model_fn: Callable[[], Any], reason: str
    ) -> PushResult | None:
        """`push`, reconnecting and pushing again after a gRPC error (PUSH_RECONNECTS)."""
        try:
            return call_with_retry(
                lambda: self.push(version, model_fn, reason),
                PUSH_RECONNECTS,
                retryable=lambda e: isinstance(e, grpc.RpcError),
                on_retry=lambda e, attempt, wait: self.reconnect(e),
            )
        except grpc.RpcError as e:
            n = (PUSH_RECONNECTS.max_retries or 0) + 1
            raise SamplerUnavailable(
                f"could not push weight version {version} ({reason}) after {n} attempts"
            ) from e

    # ---- rotation ----------------------------------------------------------------------------
    def rotation_metrics(self) -> dict[str, float]:
        """The sampler's `pool/*` metrics; logs rotation changes."""
        m = self.client.metrics()
        report = self.client.report()
        rot = [bool(r["active"]) for r in report]
        prev, self._last_rotation = self._last_rotation, rot
        if prev is not None and prev != rot:
            out = [
                f"{r['address']} ({r['last_error'][:160]})"
                for r, p in zip(report, prev)
                if p and not r["active"]
            ]
            back = [r["address"] for r, p in zip(report, prev) if r["active"] and not p]
            logger.info(
                "sampler pool: %d/%d in rotation%s%s",
                sum(rot),
                len(rot),
                f"; out of rotation: {out}" if out else "",
                f"; rejoined: {back}" if back else "",
            )
        return m

    def close(self) -> None:
        if self._client is not None and self._client is not self._given:
            self._client.close()
        if self.process is not None:
            self.process.stop()
            self.process = None
