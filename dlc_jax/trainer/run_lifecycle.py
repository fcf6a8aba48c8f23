"""The start and end of a training run, each part on its own: the metrics outputs
(`open_metrics`), checkpoints and resuming from one (`RunCheckpoints`), the summary of a run that
had already finished (`complete_summary`) and the model names of a summary (`model_names`)."""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlc_jax.lora.base_check import base_meta, check_base
from dlc_jax.trainer.checkpoint import (
    Checkpointer,
    CheckpointError,
    restore_train_state,
    save_train_state,
)
from dlc_jax.trainer.config import TrainConfig, to_dict
from dlc_jax.trainer.metrics_log import MetricsLogger
from dlc_jax.trainer.run_dir import check_resume_config, fingerprint, prepare_fresh_start
from dlc_jax.trainer.state import TrainState

logger = logging.getLogger(__name__)


def open_metrics(cfg: TrainConfig, *, lead: bool, step: int, append: bool) -> MetricsLogger:
    """The run's metrics outputs (JSONL, TensorBoard, progress bar, W&B: process 0 only), from
    ``step`` on; ``append`` keeps a resumed run's rows."""
    lg = cfg.log
    return MetricsLogger(
        lg.dir,
        jsonl=lg.jsonl and lead,
        tensorboard=lg.tensorboard and lead,
        progress=lg.progress and lead,
        total_steps=cfg.train.steps,
        initial_step=step,
        append=append,
        progress_every=lg.progress_every,
        config=to_dict(cfg),
        wandb={"project": lg.wandb_project, "run_name": lg.wandb_run_name}
        if lg.wandb and lead
        else None,
        quiet=not lead,
    )


class RunCheckpoints:
    """Checkpoints of one run: periodic and exit saves with the run's metadata (``meta_fn()``:
    data state, counters; plus the config and its fingerprint), and resuming from the latest."""

    def __init__(
        self, cfg: TrainConfig, meta_fn: Callable[[], dict], *, base_fingerprint: str | None = None
    ):
        c = cfg.checkpoint
        self.cfg = cfg
        self.base_fingerprint = base_fingerprint  # LoRA: checkpoints hold adapters of this base
        self.ckpt = Checkpointer(c.dir, keep=c.keep, every=c.every)
        self.meta_fn = meta_fn

    @property
    def directory(self) -> Any:
        """Where the checkpoints are (an ``etils.epath.Path``: gs:// too)."""
        return self.ckpt.directory

    def latest_step(self) -> int | None:
        return self.ckpt.latest_step()

    def save(self, state: TrainState, force: bool = False) -> bool:
        """Checkpoint ``state`` (periodic unless ``force``); a failed save is logged (the previous
        good checkpoints are still there)."""
        meta = {
            **self.meta_fn(),
            "seed": self.cfg.train.seed,
            "config": to_dict(self.cfg),
            "config_fingerprint": fingerprint(to_dict(self.cfg)),
            **base_meta(self.base_fingerprint),
        }
        try:
            return save_train_state(self.ckpt, state, meta, force=force)
        except CheckpointError as e:
            logger.warning("%s", e)
            return False

    def save_on_exit(self, state: TrainState) -> None:
        """The exit checkpoint; a second Ctrl-C does not cut it short."""
        main = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            self.save(state, force=True)
        except Exception as e:
            logger.warning("checkpoint on exit failed: %s", e)
        finally:
            if main:
                signal.signal(signal.SIGINT, old)

    def resume(self, state: TrainState) -> dict | None:
        """Restore the latest checkpoint into ``state`` (``checkpoint.resume``); its metadata, or
        None for a fresh start (a fresh start with ``checkpoint.overwrite`` clears the old
        outputs)."""
        c = self.cfg.checkpoint
        if not c.resume or c.overwrite:
            prepare_fresh_start(self.ckpt, self.cfg.log.dir, overwrite=c.overwrite)
            return None
        if self.ckpt.latest_step() is None:
            return None
        current = to_dict(self.cfg)
        where = str(self.ckpt.directory)

        def check_meta(m: dict) -> None:
            check_resume_config(m, current, allow_change=c.allow_config_change, where=where)
            check_base(m, self.base_fingerprint, where)  # LoRA: adapters of this very base

        meta = restore_train_state(self.ckpt, state, check_meta=check_meta)
        logger.info(
            "resumed from %s at step %d (sampler version %d)",
            self.ckpt.directory,
            state.step,
            state.synced_version,
        )
        return meta


def model_names(cfg: TrainConfig, model_dir: Path) -> dict:
    """The model the user gave (``model``) and, when the SFT warm-up ran, its copy (``sft``)."""
    out: dict[str, Any] = {"model": cfg.model.path or f"tiny model (preset {cfg.model.preset})"}
    if cfg.sft.enabled:
        out["sft"] = {"model_dir": str(model_dir), "steps": cfg.sft.steps}
    return out


def complete_summary(cfg: TrainConfig, checkpoints: RunCheckpoints, model_dir: Path) -> dict:
    """Summary of a run whose final step is already checkpointed (re-invoked after it finished):
    the saved summary.json when there is one, flagged ``already_complete``; nothing is trained or
    overwritten."""
    metrics_dir = Path(cfg.log.dir).absolute()
    try:
        saved = json.loads((metrics_dir / "summary.json").read_text())
    except (OSError, ValueError):
        saved = {}
    step = checkpoints.latest_step()
    logger.info(
        "run already complete: checkpoint step %s >= train.steps=%d in %s; metrics "
        "%s/metrics.jsonl, summary %s/summary.json; nothing was trained (raise train.steps to "
        "continue, or use checkpoint.resume=false checkpoint.overwrite=true / a new checkpoint.dir "
        "and log.dir to start over)",
        step,
        cfg.train.steps,
        checkpoints.directory,
        metrics_dir,
        metrics_dir,
    )
    return dict(
        saved,
        already_complete=True,
        finished=True,
        seconds=0.0,
        checkpoint_dir=str(checkpoints.directory),
        checkpoint_step=step,
        metrics_dir=str(metrics_dir),
        model_dir=str(model_dir),
    )
