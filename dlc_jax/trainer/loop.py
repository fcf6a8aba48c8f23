"""The async RL loop: rollouts stream in for upcoming batches while the trainer computes.

Per step: wait for the batch, score, pack, theta_s forwards, the jitted step, the resync policy,
then the hooks (evaluation, metrics row, checkpoint). Multi-host: each process handles its own
slots; whatever decides control flow is agreed by a collective; metrics come from process 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from dlc_jax.data.prompts import PromptPipeline
from dlc_jax.data.reward_runner import RewardRunner
from dlc_jax.data.tokenize import load_tokenizer
from dlc_jax.env.runner import make_env_sampler
from dlc_jax.errors import UserError
from dlc_jax.sampler.client.protocol import Sampler
from dlc_jax.trainer import distributed as dist
from dlc_jax.trainer.batch_requests import BatchCollector
from dlc_jax.trainer.config import TrainConfig
from dlc_jax.trainer.eval import Evaluator
from dlc_jax.trainer.guards import NonFiniteGuard, NonFiniteTrainingError, SigintLatch
from dlc_jax.trainer.hooks import Hook, Hooks, StepInfo
from dlc_jax.trainer.lora_push import adapter_pusher, choose_lora_push, started_sampler_info
from dlc_jax.trainer.metrics_log import MetricsLogger
from dlc_jax.trainer.resync import Resyncer, make_policy
from dlc_jax.trainer.run_dir import RunCheckpoints, complete_summary, model_names, open_metrics
from dlc_jax.trainer.sampler_link import SamplerLink, SamplerUnavailable
from dlc_jax.trainer.step import STEP_KEYS
from dlc_jax.trainer.step_inputs import StepInputs, decode
from dlc_jax.trainer.train_setup import load_train_model, make_train_setup
from dlc_jax.trainer.writers import sample_records

logger = logging.getLogger(__name__)

__all__ = ["Trainer", "SamplerUnavailable", "NonFiniteTrainingError", "load_train_model"]


COUNTERS = (  # run totals, checkpointed
    "resync_count",
    "resync_ess",
    "resync_forced",
    "reconnects",
    "dropped_on_resync",
    "snapshot_forwards",
    "nonfinite_skipped",
    "dropped_invalid",
)


class Trainer:
    """One run over the parts given (`build.build_trainer` wires them): ``sampler`` (a `Sampler`
    the caller owns, or a `SamplerLink` closed with the trainer), ``rewards`` (closed with it),
    ``prompts``, ``model_dir`` (served as version 0), more ``hooks``. `run` trains."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        sampler: Sampler | SamplerLink,
        rewards: RewardRunner,
        prompts: PromptPipeline,
        model_dir: str | Path,
        tokenizer: Any = None,
        hooks: Iterable[Hook] = (),
    ):
        self.cfg = cfg
        self.proc = dist.process_info()
        self.multi = self.proc.process_count > 1
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.nonfinite = NonFiniteGuard(cfg.train.max_nonfinite_steps, self.counters)
        self.model_dir = Path(model_dir)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(str(model_dir))
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.mesh = dist.make_training_mesh(cfg.mesh)
        self.rows = dist.rows_sharding(self.mesh) if self.mesh is not None else None
        setup = make_train_setup(cfg, self.model_dir, self.mesh)
        self.state, self.schedule, self.train_step = setup.state, setup.schedule, setup.train_step
        self._full = setup.serve
        self.policy = make_policy(cfg.resync)
        self.rewards = rewards
        self.inputs = StepInputs(
            cfg, self.tokenizer, self.eos_id, self.mesh, self.rows, setup.snapshot_lp, self.rewards
        )
        self.evaluator = (
            Evaluator(cfg, self.tokenizer, self.eos_id, self.rewards)
            if cfg.eval.every and self.proc.is_leader
            else None
        )
        self._samples: list[dict] = []  # log.samples_every: this step's sample completions
        self._partial_row: dict | None = None  # the current step's metrics before its resync
        self.data = prompts
        s = cfg.sampler
        if isinstance(sampler, SamplerLink):
            self.link = sampler
        else:
            self.link = SamplerLink(
                s, model_dir=self.model_dir, log_dir=cfg.log.dir, multi=self.multi, sampler=sampler
            )
        self.link.on_reconnect = self._on_reconnect
        self._lora_push = setup.adapters  # lora.push to resolve (sampler.address: at connect)
        if setup.adapters and not isinstance(sampler, SamplerLink):  # as the sampler declares
            self._choose_lora_push(sampler.info(), started_here=False)
        elif setup.adapters and not s.address:  # the sampler the link starts (spawned/in process)
            own = started_sampler_info(s.backend, cfg.lora.rank)
            self._choose_lora_push(own, started_here=True)
        self.env = make_env_sampler(cfg, self.tokenizer, lambda: self.link.client)
        self.batches = BatchCollector(
            cfg,
            data=self.data,
            link=self.link,
            state=self.state,
            recover=lambda err: self.resyncer.recover(err),  # reconnect, then a resync
            counters=self.counters,
            eos_id=self.eos_id,
            rows=self.rows,
            multi=self.multi,
            allows_prefetch=self.policy.allows_prefetch,
            env=self.env,
        )
        self.resyncer = Resyncer(
            self.state, self.link, self.serve, self.batches, self.counters, cfg.resync
        )
        self.checkpoints = RunCheckpoints(
            cfg, self._checkpoint_meta, base_fingerprint=setup.base_fp
        )
        self._metrics: MetricsLogger | None = None
        self.hooks = Hooks()
        if self.evaluator is not None:
            self.hooks.add("eval", cfg.eval.every, lambda info: self._evaluate())
        self.hooks.add("metrics", 1, self._log_metrics)
        self.hooks.add("checkpoint", 1, self._periodic_save)
        for h in hooks:
            self.hooks.add(h.name, h.every, h.fn)
        self.resumed = self._resume()
        self.already_complete = self.resumed and self.state.step >= cfg.train.steps
        if self.multi:
            # set up the collective context while every process is here (its set-up waits only
            # 30 s for the peers; the first batch reaches hosts at very different times)
            dist.allgather([0.0])

    # ---- the run ---------------------------------------------------------------------------------
    def run(self) -> dict:
        """Train until ``train.steps``; returns the summary (also <log.dir>/summary.json)."""
        if self.already_complete:
            return complete_summary(self.cfg, self.checkpoints, self.model_dir)
        metrics = self._metrics = self._start()
        t0 = time.time()
        finished = interrupted = False
        sigint = SigintLatch().install()
        try:
            while self.state.step < self.cfg.train.steps:
                if sigint.caught:  # a Ctrl-C whose KeyboardInterrupt was swallowed (a gc callback)
                    raise KeyboardInterrupt
                index = self.state.step
                self.resyncer.if_too_stale()
                self.batches.open(index)
                self.batches.request(index)
                row = self._train_step(index)
                self.batches.close(index)
                if row is None:  # non-finite loss/gradient: not applied, next batch
                    continue
                self._partial_row = None
                self.hooks.run(StepInfo(self.state.step, row, self._samples))
            if sigint.caught:
                raise KeyboardInterrupt
            self._judge_short_run()
            finished = True
        except KeyboardInterrupt:
            interrupted = True
            if self._partial_row is not None:  # stepped, then interrupted before its row
                metrics.log(self.state.step, dict(self._partial_row, interrupted=1))
        finally:
            sigint.restore()
            summary = self._finish(metrics, finished, time.time() - t0)
        if interrupted:
            logger.warning(
                "interrupted at step %d: checkpoint %s (step %s); resume by running the same "
                "command again",
                self.state.step,
                self.checkpoints.ckpt.directory,
                self.checkpoints.ckpt.latest_step(),
            )
            raise KeyboardInterrupt
        return summary

    def _judge_short_run(self) -> None:
        """The reward failure budget judges a run shorter than ``reward.window`` (a collective)."""
        names = [s.name for s in self.rewards.specs]
        counts = dist.allgather(self.rewards.budget.short_run_counts(names)).sum(0)
        self.rewards.budget.judge_short_run(names, [s.fn for s in self.rewards.specs], counts)

    def _start(self) -> MetricsLogger:
        """Connect the sampler (giving it the resumed weights) and open the metrics outputs."""
        try:
            self.link.connect()
            if self._lora_push:  # sampler.address: by what the connected sampler declares
                self._choose_lora_push(self.link.client.info(), started_here=False)
            if self.resumed:
                v = self.state.synced_version
                self.link.push_retrying(v, lambda: self.serve(self.state.model_at(v)), "resume")
        except BaseException:
            self.link.close()
            raise
        return open_metrics(
            self.cfg, lead=self.proc.is_leader, step=self.state.step, append=self.resumed
        )

    def serve(self, model):
        """What a push sends: the adapted model for adapter pushes, else the full (merged) one."""
        return model if self.link.adapter is not None else self._full(model)

    def _choose_lora_push(self, info: dict, *, started_here: bool) -> None:
        """Resolve ``lora.push`` for the sampler that declares ``info`` (logged)."""
        choice, why = choose_lora_push(
            self.cfg, self.model_dir, info, started_here=started_here, multi=self.multi
        )
        logger.info("lora.push: %s pushes (%s)", choice, why)
        if choice == "adapter":
            self.link.adapter = adapter_pusher(self.cfg.lora, multi=self.multi, backend=None)
        self._lora_push = False

    def _finish(self, metrics: MetricsLogger, finished: bool, seconds: float) -> dict:
        """Checkpoint on exit, write the summary (process 0), close everything; the summary."""
        self.checkpoints.save_on_exit(self.state)
        extra = {
            "finished": finished,
            "seconds": seconds,
            "checkpoint_dir": str(self.checkpoints.ckpt.directory),
            "checkpoint_step": self.checkpoints.ckpt.latest_step(),
            "metrics_dir": str(Path(self.cfg.log.dir).absolute()),
            "model_dir": str(self.model_dir),
            **model_names(self.cfg, self.model_dir),
            **self.counters,
        }
        summary = metrics.summary()
        if self.proc.is_leader:
            metrics.write_summary(extra)
        metrics.close()
        self.close()
        return dict(summary, **extra)

    # ---- hooks and checkpoints -------------------------------------------------------------------
    def _log_metrics(self, info: StepInfo) -> None:
        assert self._metrics is not None
        self._metrics.log(info.step, info.row)
        self._metrics.log_samples(info.step, info.samples)

    def _periodic_save(self, info: StepInfo) -> None:
        if self.checkpoints.ckpt.should_save(info.step):
            self.checkpoints.save(self.state)

    def _checkpoint_meta(self) -> dict:
        # the data state before the next batch: a resumed run draws the same prompts
        return {
            "data_state": self.batches.data_state_before(self.state.step),
            "counters": self.counters,
            "dropped_stale": self.batches.assembler.dropped_stale,
        }

    def _resume(self) -> bool:
        if (meta := self.checkpoints.resume(self.state)) is None:
            return False
        self.data.set_state(meta["data_state"])
        self.counters.update(meta.get("counters", {}))
        self.batches.assembler.dropped_stale = int(meta.get("dropped_stale", 0))
        return True

    def close(self) -> None:
        self.link.close()
        self.rewards.close()

    # ---- one step --------------------------------------------------------------------------------
    def _train_step(self, index: int) -> dict | None:
        """One optimizer step on batch ``index``; None when skipped (non-finite)."""
        cfg, st = self.cfg, self.state
        t0 = time.time()
        rollouts = self.batches.collect(index)
        t_wait = time.time() - t0
        self.batches.prefetch_after(index)
        stats, arrays = self.inputs.score_and_pack(
            rollouts, self.batches.batches[index].prompts, st.version
        )
        dev, forwards = self.inputs.device_inputs(arrays, st)
        self.counters["snapshot_forwards"] += forwards
        lr = float(self.schedule(st.step))
        before = st.params, st.opt_state
        st.params, st.opt_state, out = self.train_step(
            st.params, st.opt_state, {k: dev[k] for k in STEP_KEYS if k in dev}
        )
        m = {k: float(v) for k, v in out.items()}
        if not self.nonfinite.check(st, index, m, before):
            return None
        st.step += 1
        self._partial_row = dict(m)
        self._samples = self._sample_log(rollouts, index, dev, before[0])
        reason = None
        if self.policy.should_resync(m, st.step - st.synced_version):
            reason = self.policy.name
            self.resyncer.resync(reason)
        m.update(self.link.rotation_metrics())  # pool/*: rotation, removals, re-requested slots
        m.update({k: stats[k] for k in ("reward_mean", "reward_std", "version_lag")})
        m.update(
            lr=lr,
            resync=1.0 if reason else 0.0,
            response_len=stats["response_len"],
            wait_s=t_wait,
            step_s=time.time() - t0,
            **self.batches.metrics(),
            weight_version=st.version,
            synced_version=st.synced_version,
            **self.counters,
        )
        m.update({k: v for k, v in stats.items() if k.startswith(("reward/", "env/"))})
        m["data/escaped_special_tokens"] = float(self.data.escaped_special_tokens)
        if self.env is not None:
            m.update({f"{k}_total": v for k, v in self.env.totals().items()})
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
        """``eval/*``; a failed evaluation is logged, not fatal, unless a user error."""
        assert self.evaluator is not None
        try:
            return self.evaluator.run(self.link.client, self.state.step)
        except UserError:
            raise
        except Exception as e:
            logger.warning("eval at step %d failed (%s); training goes on", self.state.step, e)
            return {}

    def _sample_log(self, rollouts: list, index: int, dev: dict, params) -> list[dict]:
        """``log.samples_every``: records of ``log.samples_n`` rollouts (one per group first)."""
        lg, step = self.cfg.log, self.state.step
        if not (lg.samples_every and step % lg.samples_every == 0 and self.proc.is_leader):
            return []
        prompts = self.batches.batches[index].prompts
        order = sorted(range(len(rollouts)), key=lambda i: (rollouts[i].sample_index, i))
        chosen = [rollouts[i] for i in order[: lg.samples_n]]
        rewards, _ = self.inputs._score(chosen, prompts)
        texts = [decode(self.tokenizer, r) for r in chosen]
        per_token = None
        if not (self.multi or self.cfg.train.pack):
            lp, _ = self.inputs.snapshot_lp(params, dev)
            rows = jnp.asarray(order[: lg.samples_n])
            lp_s = jnp.where(dev["self_mask"], lp, dev["lp_s"])
            arrays = {"lp": lp, "lp_s": lp_s, "lp_q": dev["lp_q"], "mask": dev["mask"]}
            per_token = {k: jax.device_get(v[rows]) for k, v in arrays.items()}
        return sample_records(chosen, prompts, texts, rewards, per_token)

    def _on_reconnect(self) -> None:
        self.batches.clear_failures()
        self.counters["reconnects"] += 1
