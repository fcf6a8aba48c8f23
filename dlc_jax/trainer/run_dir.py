"""A training run's directory: checkpoints and metrics outputs, and the rules for reusing it. A
resume whose training-relevant config differs (all but :data:`NOT_TRAINING_RELEVANT`) is refused
unless ``checkpoint.allow_config_change``; a fresh start over an old run needs ``overwrite``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlc_jax.errors import UserError
from dlc_jax.lora.base_check import base_meta, check_base
from dlc_jax.trainer.checkpoint import (
    Checkpointer,
    CheckpointError,
    restore_train_state,
    save_train_state,
)
from dlc_jax.trainer.config import TrainConfig, to_dict
from dlc_jax.trainer.metrics_log import MetricsLogger
from dlc_jax.trainer.state import TrainState
from dlc_jax.trainer.writers import flat_keys

logger = logging.getLogger(__name__)

# Dotted keys (or whole sections, by prefix) that may change between a checkpoint and its resume.
_KEYS = {
    "": "log. eval. checkpoint. distributed. mesh. plan.",
    # length_buckets: padding only
    "train": "steps micro_batches length_buckets compile_cache_dir max_nonfinite_steps",
    # the same maths by other kernels (model.scan_layers changes the checkpoint layout: relevant)
    "model": "remat remat_policy attention_impl moe_impl moe_dispatch path",
    "sft": "cache_dir",
    "reward": "workers timeout_s sample_timeout_s",
    "resync": "max_snapshots",
    "sampler": (
        "address token_file tls_root_cert tls_server_name startup_timeout_s reconnect_timeout_s "
        "connect_timeout_s retries retry_backoff_s retry_max_backoff_s push_transport push_relay"
    ),
}
NOT_TRAINING_RELEVANT = tuple(
    f"{s}.{k}" if s else k for s, keys in _KEYS.items() for k in keys.split()
)

# Run outputs in log.dir that belong to one run (cleared by checkpoint.overwrite).
RUN_OUTPUTS = ("metrics.jsonl", "samples.jsonl", "summary.json", "tb")


class ConfigMismatchError(UserError):
    """A resume whose training-relevant config differs from the checkpoint's."""


class RunDirInUseError(UserError):
    """``checkpoint.resume=false`` on a directory that holds another run."""


def _relevant(key: str) -> bool:
    return not any(
        key == p or (p.endswith(".") and key.startswith(p)) for p in NOT_TRAINING_RELEVANT
    )


def training_config(config: dict) -> dict[str, Any]:
    """The training-relevant keys of ``to_dict(cfg)``, flattened, as JSON values."""
    plain = json.loads(json.dumps(config, default=str))
    return {k: v for k, v in flat_keys(plain).items() if _relevant(k)}


def fingerprint(config: dict) -> str:
    """Short stable hash of the training-relevant config."""
    blob = json.dumps(training_config(config), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def config_diff(saved: dict, current: dict) -> list[tuple[str, Any, Any]]:
    """[(key, saved, current)] of the training-relevant keys both configs have that differ."""
    a, b = training_config(saved), training_config(current)
    return [(k, a[k], b[k]) for k in sorted(set(a) & set(b)) if a[k] != b[k]]


def check_resume_config(meta: dict, current: dict, *, allow_change: bool, where: str) -> None:
    """ConfigMismatchError (a warning with ``allow_change``) when the config changed."""
    saved = meta.get("config")
    if not isinstance(saved, dict):
        return  # from before configs were stored
    diff = config_diff(saved, current)
    if not diff:
        return
    shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in diff[:8])
    more = f" (+{len(diff) - 8} more)" if len(diff) > 8 else ""
    if allow_change:
        logger.warning(
            "resuming %s (step %s) with a changed training config (checkpoint.allow_config_change"
            "=true): %s%s",
            where,
            meta.get("step"),
            shown,
            more,
        )
        return
    raise ConfigMismatchError(
        f"checkpoint {where} (step {meta.get('step')}) was trained with a different config: "
        f"{shown}{more}. Use a new checkpoint.dir and log.dir for a new run, "
        f"checkpoint.allow_config_change=true to continue this one anyway, or "
        f"checkpoint.resume=false checkpoint.overwrite=true to start over here"
    )


def prepare_fresh_start(ckpt, log_dir: str | Path, *, overwrite: bool) -> None:
    """Refuse a directory holding another run unless ``overwrite``, which deletes it."""
    steps = ckpt.all_steps()
    outputs = [Path(log_dir, n) for n in RUN_OUTPUTS if Path(log_dir, n).exists()]
    if not steps and not outputs:
        return
    found = ([f"checkpoints {steps} in {ckpt.directory}"] if steps else []) + [
        str(p) for p in outputs
    ]
    if not overwrite:
        raise RunDirInUseError(
            f"checkpoint.resume=false but this run directory is in use ({', '.join(found)}); "
            f"resume it (checkpoint.resume=true), choose a new checkpoint.dir and log.dir, or "
            f"delete the old run with checkpoint.overwrite=true"
        )
    ckpt.clear()
    for p in outputs:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    logger.warning("checkpoint.overwrite=true: deleted the previous run (%s)", ", ".join(found))


def open_metrics(cfg: TrainConfig, *, lead: bool, step: int, append: bool) -> MetricsLogger:
    """The run's metrics outputs (process 0's), from ``step`` on."""
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
    """Checkpoints of one run: saves with ``meta_fn()`` + the config, and resuming."""

    def __init__(
        self, cfg: TrainConfig, meta_fn: Callable[[], dict], *, base_fingerprint: str | None = None
    ):
        c = cfg.checkpoint
        self.cfg = cfg
        self.base_fingerprint = base_fingerprint  # LoRA: the adapters' base
        self.ckpt = Checkpointer(c.dir, keep=c.keep, every=c.every)
        self.meta_fn = meta_fn

    def save(self, state: TrainState, force: bool = False) -> bool:
        """Checkpoint ``state`` (periodic unless ``force``); a failed save is logged."""
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
        """Restore the latest good checkpoint into ``state``: its metadata (None: fresh start)."""
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
            check_base(m, self.base_fingerprint, where)

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
    """The saved summary of a finished run re-invoked, flagged ``already_complete``."""
    metrics_dir = Path(cfg.log.dir).absolute()
    try:
        saved = json.loads((metrics_dir / "summary.json").read_text())
    except (OSError, ValueError):
        saved = {}
    step = checkpoints.ckpt.latest_step()
    logger.info(
        "run already complete: checkpoint step %s >= train.steps=%d in %s; metrics "
        "%s/metrics.jsonl, summary %s/summary.json; nothing was trained (raise train.steps to "
        "continue, or use checkpoint.resume=false checkpoint.overwrite=true / a new checkpoint.dir "
        "and log.dir to start over)",
        step,
        cfg.train.steps,
        checkpoints.ckpt.directory,
        metrics_dir,
        metrics_dir,
    )
    return dict(
        saved,
        already_complete=True,
        finished=True,
        seconds=0.0,
        checkpoint_dir=str(checkpoints.ckpt.directory),
        checkpoint_step=step,
        metrics_dir=str(metrics_dir),
        model_dir=str(model_dir),
    )
