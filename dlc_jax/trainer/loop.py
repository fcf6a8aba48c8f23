"""The async RL loop: sampler rollouts stream in for upcoming batches while the trainer computes.

Per step b (`Trainer.run`, then `_train_step`): wait until every (slot, sample) cell of batch b is
filled (slot-based, never by arrival order), score the responses, group advantages, pack, theta_s
forwards per weight version present (none when every token is current), the jitted step, metrics,
then the resync policy; a resync pushes theta_t to the sampler and snapshots it as theta_s.

Split by concern: batch collection (open, request, wait; a dead sampler reconnected and the
missing cells requested again; INVALID_ARGUMENT refusals dropped and replaced by filler rows) is
`batch_requests.BatchRequests`; start, finish, checkpoints and resume are
`run_lifecycle.RunLifecycle`; this module keeps the step itself, the resync and the recovery.
Collaborators, one job each: `SamplerLink` (spawn / connect / reconnect / push,
`sampler_link.py`), `RolloutFeeder` + `BatchAssembler` (background Generate streams filling batch
cells), the checkpoint helpers (`checkpoint.py`), and the multi-host agreement helpers
(`distributed.py`).
``sampler.address`` = "h1:p,h2:p" drives a :class:`~dlc_jax.sampler.pool.SamplerPool`: a failed
sampler leaves rotation inside the pool and training goes on with the others (``pool/*`` metrics).

Multi-host (``jax.distributed`` initialized by the CLI first): every process builds the same prompt
stream, requests only its own slots (``local_slots``: the rows on its devices), scores and packs
them, and the global batch is assembled with ``global_batch``. Everything that decides control flow
is global: the resync policy reads replicated step metrics, the staleness resync is checked at a
fixed point of every step from (version, synced_version) -- the same on every process --, the
snapshot versions a batch needs and the packed length are agreed by an allgather, pushes are
collective (only process 0 streams) and checkpoints are saved by all processes (orbax coordinates
them); metrics and the progress bar come from process 0 only (the CLI also silences the other
processes' logs).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import jax
import jax.numpy as jnp

from dlc_jax.data.prompts import PromptPipeline
from dlc_jax.data.reward_runner import RewardRunner
from dlc_jax.data.tokenize import load_tokenizer
from dlc_jax.errors import UserError, require_dir
from dlc_jax.lora import (
    adapter_parameter_count,
    apply_lora,
    base_fingerprint,
    merged_model,
    trainable_filter,
)
from dlc_jax.trainer import distributed as dist
from dlc_jax.trainer.batch_requests import BatchRequests
from dlc_jax.trainer.batching import BatchAssembler
from dlc_jax.trainer.checkpoint import Checkpointer
from dlc_jax.trainer.compile_cache import enable_compile_cache
from dlc_jax.trainer.config import TrainConfig, make_loss_config
from dlc_jax.trainer.eval import Evaluator
from dlc_jax.trainer.resync import make_policy
from dlc_jax.trainer.rollouts import RolloutFeeder
from dlc_jax.trainer.run_lifecycle import RunLifecycle
from dlc_jax.trainer.sampler_link import SamplerLink, SamplerUnavailable
from dlc_jax.trainer.samples import sample_records
from dlc_jax.trainer.state import TrainState, make_optimizer, make_schedule, update_count
from dlc_jax.trainer.step import STEP_KEYS, StepConfig, make_snapshot_logprobs, make_train_step
from dlc_jax.trainer.step_inputs import StepInputs

logger = logging.getLogger(__name__)

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

__all__ = ["Trainer", "SamplerUnavailable"]


def load_train_model(cfg: TrainConfig, model_dir, mesh):
    """The model the trainer trains: ``model_dir`` loaded with the ``model`` section's dtypes and
    run options (attention kernel, scanned layers, remat policy), sharded over ``mesh`` when
    given."""
    from dlc_jax.model import load_hf

    m = cfg.model
    return load_hf(
        str(model_dir),
        mesh=mesh,
        param_dtype=_DTYPES[m.param_dtype],
        compute_dtype=_DTYPES[m.compute_dtype],
        remat=m.remat_policy_name(),
        scan_layers=m.scan_layers,
        attention_impl=m.attention_impl,
    )


class NonFiniteTrainingError(UserError):
    """Too many consecutive steps with a non-finite loss or gradient."""


class Trainer(BatchRequests, RunLifecycle):
    """Owns the model, optimizer, data, sampler link, checkpoints and metrics of one run.

    Construction loads the model (after the SFT warm-up when enabled), builds the jitted step and
    restores the latest checkpoint when ``checkpoint.resume``; `run` connects the sampler and
    trains.
    """

    def __init__(self, cfg: TrainConfig):
        from dlc_jax.trainer.sft import base_model_dir, ensure_sft_model

        self.cfg = cfg
        enable_compile_cache(cfg.train.compile_cache_dir)
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
        model = load_train_model(cfg, self.model_dir, self.mesh)
        adapted = apply_lora(model, cfg.lora)  # lora.rank > 0: adapters, the only trainable part
        self.tx = make_optimizer(cfg.optim, cfg.train.steps)
        self.schedule = make_schedule(cfg.optim, cfg.train.steps)
        self.state = TrainState.create(
            model,
            self.tx,
            max_snapshots=cfg.resync.max_snapshots,
            mesh=self.mesh,
            trainable=trainable_filter(cfg.lora),
        )
        self.serve = merged_model if adapted else (lambda m: m)
        self.base_fingerprint = base_fingerprint(self.state.params) if adapted else None
        if adapted:
            logger.info(
                "lora: rank %d adapters on %d projections (%s parameters trained)",
                cfg.lora.rank,
                len(adapted),
                f"{adapter_parameter_count(model):,}",
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
        self.train_step = make_train_step(
            self.state.graphdef, self.tx, self.step_cfg, trainable=self.state.trainable, **shard
        )
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
        self.batches: dict[int, dict] = {}  # index -> batch record (`BatchRequests._open_batch`)
        self.ckpt = Checkpointer(
            cfg.checkpoint.dir, keep=cfg.checkpoint.keep, every=cfg.checkpoint.every
        )
        self.resumed = self._resume()
        # a finished run re-invoked: nothing to train, no sampler, metrics files left as they are
        self.already_complete = self.resumed and self.state.step >= cfg.train.steps
        if self.multi:
            # Set up the cross-process collective context now, while every process stands at the
            # same point: its set-up waits only 30 s for the peers, and the first batch reaches
            # different hosts at very different times (sampler start-up, first compiles).
            dist.allgather([0.0])

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

    # ---- resync and recovery --------------------------------------------------------------------
    def _resync(self, reason: str) -> None:
        """Push theta_t as a new sampler version and snapshot it as theta_s."""
        st = self.state
        self.link.push_retrying(st.version, lambda: self.serve(st.model()), reason)
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
