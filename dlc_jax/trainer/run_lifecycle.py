"""The start and end of a `Trainer` run: connecting the sampler and opening the metrics, the
checkpoint and summary on exit, periodic checkpoints and resuming from one, and the summary of a
run that had already finished.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from pathlib import Path
from typing import Any

from dlc_jax.lora.base_check import base_meta, check_base
from dlc_jax.trainer.checkpoint import (
    CheckpointError,
    restore_train_state,
    save_train_state,
)
from dlc_jax.trainer.config import to_dict
from dlc_jax.trainer.metrics_log import MetricsLogger
from dlc_jax.trainer.run_dir import check_resume_config, fingerprint, prepare_fresh_start
from dlc_jax.trainer.trainer_fields import TrainerFields

logger = logging.getLogger(__name__)


class RunLifecycle(TrainerFields):
    """The `Trainer`'s start, finish, checkpoints and resume (a mixin: it works on the trainer's
    attributes, `TrainerFields`)."""

    def _start(self) -> MetricsLogger:
        """Connect the sampler (giving it the resumed weights) and open the metrics outputs."""
        cfg, lead = self.cfg, self.proc.is_leader
        try:
            self.link.connect()
            if self.resumed:
                v = self.state.synced_version
                served = lambda: self.serve(self.state.model_at(v))  # noqa: E731
                self.link.push_retrying(v, served, reason="resume")
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

    def _model_names(self) -> dict:
        """The model the user gave (``model``) and, when the SFT warm-up ran, its copy (``sft``)."""
        cfg = self.cfg
        out: dict[str, Any] = {"model": cfg.model.path or f"tiny model (preset {cfg.model.preset})"}
        if cfg.sft.enabled:
            out["sft"] = {"model_dir": str(self.model_dir), "steps": cfg.sft.steps}
        return out

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
            **base_meta(self.base_fingerprint),
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
        where = str(self.ckpt.directory)

        def check_meta(m: dict) -> None:
            check_resume_config(m, current, allow_change=c.allow_config_change, where=where)
            check_base(m, self.base_fingerprint, where)  # LoRA: adapters of this very base

        meta = restore_train_state(self.ckpt, self.state, check_meta=check_meta)
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
