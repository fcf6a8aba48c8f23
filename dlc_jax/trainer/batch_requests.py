"""`BatchCollector`: opens the trainer's batches, requests their (slot, sample) cells from the
sampler (`RolloutFeeder`: one thread per Generate call) and waits until every cell is filled.

A failed stream leaves its cells open; the sampler is recovered (reconnect + resync) and they are
requested again. INVALID_ARGUMENT is a data problem, not a reason to reconnect: the slots are asked
for one per request, a slot refused alone is dropped (filler rows), all refused is fatal.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from dlc_jax.data.prompts import PromptPipeline, PromptRecord
from dlc_jax.env.runner import env_row
from dlc_jax.errors import UserError
from dlc_jax.sampler.client.retry import RetryPolicy, call_with_retry
from dlc_jax.sampler.wire.types import SamplingParams, mix_seed
from dlc_jax.trainer import distributed as dist
from dlc_jax.trainer.batching import BatchAssembler
from dlc_jax.trainer.sampler_link import SamplerLink, SamplerUnavailable
from dlc_jax.trainer.state import TrainState
from dlc_jax.trainer.step_inputs import filler_rollouts

logger = logging.getLogger(__name__)

# a batch whose rollout streams keep failing: recover the sampler up to 5 times
STREAM_RECOVERIES = RetryPolicy(max_retries=5, backoff=0.0, max_backoff=0.0)

# backends that take a per-request seed (vLLM-CPU crashes with them under chunked prefill)
SEEDED_BACKENDS = ("jax", "inprocess")


class RolloutFeeder:
    """Issues Generate calls for batch cells and fills ``assembler`` from background threads.

    client_fn / version_fn: () -> the sampler / the weight version; params_fn: ``(batch, attempt,
    sample_index) -> SamplingParams``; accept_fn: rollouts it refuses are counted and re-requested.
    """

    def __init__(self, assembler: BatchAssembler, client_fn, version_fn, params_fn, accept_fn=None):
        self.asm = assembler
        self.accept_fn = accept_fn or (lambda r: True)
        self.rejected_unknown_version = 0
        self.client_fn = client_fn
        self.version_fn = version_fn
        self.params_fn = params_fn
        self.cond = threading.Condition()
        self.outstanding: dict[int, int] = {}
        self.failures: list[BaseException] = []
        self.refused: list[tuple[int, list[int], BaseException]] = []  # INVALID_ARGUMENT answers
        self.attempts: dict[int, int] = {}

    def request_missing(self, batch: int, prompt_ids: dict, alone=frozenset()) -> int:
        """Request the open cells of ``batch`` (none while some are being generated); how many.

        One Generate call (n = 1) per sample index g over the slots missing g; slots in ``alone``
        get a request of their own. ``prompt_ids``: slot -> int32 [P]."""
        with self.cond:
            if self.outstanding.get(batch, 0):
                return 0
            missing = self.asm.batches[batch].missing()
            if not missing:
                return 0
            attempt = self.attempts.get(batch, 0)
            self.attempts[batch] = attempt + 1
            by_req: dict[tuple[int, int], list[int]] = {}  # (g, own slot or -1) -> slots
            for s, g in missing:
                by_req.setdefault((g, s if s in alone else -1), []).append(s)
            self.outstanding[batch] = len(by_req)
        for (g, _), slots in sorted(by_req.items()):
            params = self.params_fn(batch, attempt, g)
            args = (batch, g, slots, [prompt_ids[s] for s in slots], params)
            threading.Thread(
                target=self._run, args=args, daemon=True, name=f"rollouts-b{batch}-g{g}"
            ).start()
        return len(missing)

    def _run(self, batch, g, slots, prompts, params):
        try:
            for r in self.client_fn().generate(
                [np.asarray(p).tolist() for p in prompts], params, slot_ids=slots
            ):
                r.sample_index = g
                with self.cond:
                    if not self.accept_fn(r):
                        self.rejected_unknown_version += 1
                        continue
                    self.asm.add(r, self.version_fn())
                    self.cond.notify_all()
        except BaseException as e:  # handed to the trainer thread
            with self.cond:
                if _invalid_argument(e):
                    self.refused.append((batch, list(slots), e))
                else:
                    self.failures.append(e)
                self.cond.notify_all()
        finally:
            with self.cond:
                self.outstanding[batch] -= 1
                self.cond.notify_all()

    def take_refused(self, batch: int) -> list[tuple[list[int], BaseException]]:
        """The refused requests of ``batch`` (slots, error), removed (hold cond)."""
        mine = [(slots, e) for b, slots, e in self.refused if b == batch]
        self.refused = [x for x in self.refused if x[0] != batch]
        return mine

    def idle(self, batch: int) -> bool:
        return self.outstanding.get(batch, 0) == 0


def _invalid_argument(e: BaseException) -> bool:
    """gRPC INVALID_ARGUMENT or an in-process `RequestError`: the request is at fault."""
    import grpc

    from dlc_jax.sampler.service.request_checks import RequestError

    invalid = isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.INVALID_ARGUMENT
    return isinstance(e, RequestError) or invalid


class _StreamsFailed(Exception):
    """Rollout streams failed and none is still running (carries the first error)."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


class InvalidRequestError(UserError):
    """The sampler refused every prompt of a batch as INVALID_ARGUMENT: a config problem."""


@dataclasses.dataclass
class BatchInFlight:
    """One open batch: ``prompts`` (slot -> record), the data state before it, this process's
    slots, those asked for alone after a refusal and those ``dropped`` (filler rows)."""

    index: int
    prompts: dict[int, PromptRecord]
    data_state: Any
    local_slots: list[int]
    alone: set[int] = dataclasses.field(default_factory=set)
    dropped: set[int] = dataclasses.field(default_factory=set)


@dataclasses.dataclass(eq=False)
class BatchCollector:
    """Opens, requests and collects the trainer's batches. recover: ``(error) -> None`` brings the
    sampler back; rows: the multi-host batch-row sharding; env: ``env.fn``'s `EnvSampler`."""

    cfg: Any
    _: dataclasses.KW_ONLY
    data: PromptPipeline
    link: SamplerLink
    state: TrainState
    recover: Callable[[BaseException], None]
    counters: dict[str, int]
    eos_id: int
    rows: Any = None
    multi: bool = False
    allows_prefetch: bool = True
    env: Any = None

    def __post_init__(self) -> None:
        cfg, env = self.cfg, self.env
        max_staleness = 10**9 if cfg.resync.policy == "never" else cfg.async_.max_staleness
        self.assembler = BatchAssembler(cfg.sampler.n, max_staleness)
        self.feeder = RolloutFeeder(
            self.assembler,
            (lambda: env) if env is not None else (lambda: self.link.client),
            lambda: self.state.version,
            self.sampling_params,
            accept_fn=self._known_versions,
        )
        self.batches: dict[int, BatchInFlight] = {}

    # ---- one batch -------------------------------------------------------------------------------
    def open(self, index: int) -> BatchInFlight:
        """Batch ``index``: drawn from the prompt stream the first time, then the same record."""
        if index in self.batches:
            return self.batches[index]
        state_before = self.data.get_state()
        recs = next(self.data)
        prompts = {r.slot: r for r in recs}
        if self.env is not None:  # env.fn: the rows the episodes of these slots reset with
            self.env.add_rows({r.slot: env_row(r) for r in recs})
        slots = [r.slot for r in recs]
        local = dist.local_slots(slots, self.cfg.sampler.n, self.rows) if self.multi else slots
        b = self.batches[index] = BatchInFlight(index, prompts, state_before, local)
        with self.feeder.cond:
            self.assembler.open(index, local, {s: prompts[s] for s in local})
        return b

    def request(self, index: int) -> None:
        """Ask for the missing cells of batch ``index`` (recovering a restarted sampler first)."""
        if (err := self.link.restart_detected(self.state.synced_version)) is not None:
            self.recover(err)
        b = self.batches[index]
        self.feeder.request_missing(
            index, {s: r.prompt_ids for s, r in b.prompts.items()}, alone=b.alone
        )

    def prefetch_after(self, index: int) -> None:
        """Open and request the next ``async.prefetch`` batches (if the policy allows)."""
        ahead = self.cfg.async_.prefetch if self.allows_prefetch else 0
        for i in range(index + 1, min(index + ahead, self.cfg.train.steps - 1) + 1):
            self.open(i)
            self.request(i)

    def collect(self, index: int) -> list:
        """The rollouts of batch ``index`` once complete (filler rows for dropped slots)."""
        try:
            rollouts = call_with_retry(
                lambda: self._collect(index),
                STREAM_RECOVERIES,
                retryable=lambda e: isinstance(e, _StreamsFailed),
                on_retry=lambda e, attempt, wait: self.recover(getattr(e, "cause", e)),
            )
        except _StreamsFailed as e:
            n = (STREAM_RECOVERIES.max_retries or 0) + 1
            raise SamplerUnavailable(
                f"batch {index}: sampler failed {n} times in a row"
            ) from e.cause
        return self._with_fillers(index, rollouts)

    def close(self, index: int) -> None:
        """Batch ``index`` has been stepped on (or skipped): forget it."""
        self.batches.pop(index, None)

    def data_state_before(self, index: int) -> Any:
        """The prompt stream's state before batch ``index`` (now, when it is not open yet)."""
        b = self.batches.get(index)
        return b.data_state if b is not None else self.data.get_state()

    # ---- the sampler's requests ------------------------------------------------------------------
    def sampling_params(self, batch: int, attempt: int, g: int) -> SamplingParams:
        s = self.cfg.sampler
        seeded = s.backend in SEEDED_BACKENDS
        seed = mix_seed(self.cfg.train.seed, batch, attempt, g) if seeded else None
        return SamplingParams(
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            head_k=s.head_k,
            stop_token_ids=(self.eos_id,),
            seed=seed,
            return_routed_experts=self.cfg.moe.router_replay == "sampler",
        )

    def _known_versions(self, rollout) -> bool:
        """Whether the trainer holds theta_s for every version that sampled ``rollout``."""
        snaps = self.state.snapshots
        return all(v in snaps or v == self.state.version for v, _, _ in rollout.version_spans)

    # ---- after a resync / reconnect --------------------------------------------------------------
    def versions_in_flight(self) -> set[int]:
        """Every weight version that sampled a token of a filled cell of an open batch."""
        return {
            v
            for b in self.assembler.batches.values()
            for r in b.cells.values()
            for v, _, _ in r.version_spans
        }

    def drop_versions_below(self, version: int) -> int:
        """Empty and refuse from now on the cells sampled in part before ``version``."""
        asm = self.assembler
        with self.feeder.cond:
            n = sum(len(asm.drop_versions_below(bi, version)) for bi in list(asm.batches))
            asm.min_version = version
        return n

    def clear_failures(self) -> None:
        """A reconnected sampler: the failed streams' cells are requested again."""
        with self.feeder.cond:
            self.feeder.failures.clear()

    def metrics(self) -> dict[str, int]:
        """The rollouts turned away so far (step metrics)."""
        return {
            "dropped_stale": self.assembler.dropped_stale,
            "dropped_old_version": self.assembler.dropped_old,
            "rejected_unknown_version": self.feeder.rejected_unknown_version,
        }

    # ---- internals -------------------------------------------------------------------------------
    def _collect(self, index: int) -> list:
        """`collect` without recovery: _StreamsFailed once streams failed and none still runs."""
        f = self.feeder
        while True:
            with f.cond:
                if f.failures and all(f.idle(b) for b in self.assembler.batches):
                    raise _StreamsFailed(f.failures[0])
                if (out := self.assembler.release(index, self.state.version)) is not None:
                    return out
                if not f.idle(index):
                    f.cond.wait(timeout=1.0)
                    continue
                refused = f.take_refused(index)
            for slots, err in refused:
                self._refused(index, slots, err)
            self.request(index)

    def _refused(self, index: int, slots: list[int], err: BaseException) -> None:
        """A request refused as invalid: its slots are asked for alone; refused alone: dropped."""
        b = self.batches[index]
        why = getattr(err, "details", lambda: None)() or str(err)
        if len(slots) > 1:
            b.alone.update(slots)
            return
        s = slots[0]
        if s in b.dropped:  # its other samples' requests were refused as well
            return
        b.dropped.add(s)
        self.counters["dropped_invalid"] += 1
        logger.warning(
            "batch %d: the sampler refused prompt slot %d (data row %d) as invalid (%s); dropped, "
            "not trained on (%d dropped so far)",
            index,
            s,
            b.prompts[s].row,
            why,
            self.counters["dropped_invalid"],
        )
        if b.dropped >= set(b.local_slots):
            raise InvalidRequestError(
                f"batch {index}: the sampler refused a request as invalid for every prompt of the "
                f"batch (last: {why}); a config problem, not data; not retried"
            )
        with self.feeder.cond:  # the batch completes without it
            self.assembler.drop_slot(index, s)

    def _with_fillers(self, index: int, rollouts: list) -> list:
        """``rollouts`` of batch ``index`` with filler rows for its dropped slots, in slot order."""
        b, n = self.batches[index], self.cfg.sampler.n
        if not b.dropped:
            return rollouts
        out, it = [], iter(rollouts)
        for s in b.local_slots:
            if s in b.dropped:
                out += filler_rollouts(s, n, self.eos_id, self.cfg.sampler.head_k)
            else:
                out += [next(it) for _ in range(n)]
        return out
