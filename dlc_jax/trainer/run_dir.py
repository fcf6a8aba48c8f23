"""Which run a checkpoint directory belongs to: the training config fingerprint and the rules for
starting over.

* Resume: a checkpoint stores its resolved config; a resume whose training-relevant keys differ
  (all but :data:`NOT_TRAINING_RELEVANT`) is refused in one line naming them, unless
  ``checkpoint.allow_config_change=true``.
* Start over: ``checkpoint.resume=false`` on a directory holding checkpoints or metrics is refused
  unless ``checkpoint.overwrite=true``, which deletes the old run's outputs first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from dlc_jax.errors import UserError

logger = logging.getLogger(__name__)

# Dotted keys (or whole sections, by prefix) that may change between a checkpoint and its resume.
_KEYS = {
    # held-out evaluation reads the sampler; training is the same with or without it
    "": ("log.", "eval.", "checkpoint.", "distributed.", "mesh.", "plan."),
    # length_buckets: padding only (masked tokens)
    "train": (
        "steps",
        "micro_batches",
        "length_buckets",
        "compile_cache_dir",
        "max_nonfinite_steps",
    ),
    # memory vs recompute, or the same attention / experts by another kernel or collective
    # (model.scan_layers changes the checkpoint layout: relevant)
    "model": ("remat", "remat_policy", "attention_impl", "moe_impl", "moe_dispatch", "path"),
    "sft": ("cache_dir",),
    "reward": ("workers", "timeout_s", "sample_timeout_s"),
    "resync": ("max_snapshots",),
    "sampler": (
        *("address", "token_file", "tls_root_cert", "tls_server_name", "startup_timeout_s"),
        *("reconnect_timeout_s", "connect_timeout_s", "retries", "retry_backoff_s"),
        *("retry_max_backoff_s", "push_transport", "push_relay"),
    ),
}
NOT_TRAINING_RELEVANT = tuple(f"{s}.{k}" if s else k for s, keys in _KEYS.items() for k in keys)

# Run outputs in log.dir that belong to one run (cleared by checkpoint.overwrite).
RUN_OUTPUTS = ("metrics.jsonl", "samples.jsonl", "summary.json", "tb")


class ConfigMismatchError(UserError):
    """A resume whose training-relevant config differs from the checkpoint's."""


class RunDirInUseError(UserError):
    """``checkpoint.resume=false`` on a directory that holds another run."""


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and scalars are leaves)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _relevant(key: str) -> bool:
    return not any(
        key == p or (p.endswith(".") and key.startswith(p)) for p in NOT_TRAINING_RELEVANT
    )


def training_config(config: dict) -> dict[str, Any]:
    """The training-relevant keys of a config dict (``to_dict(cfg)``), flattened, as JSON values
    (tuples become lists, as in a checkpoint's stored config)."""
    plain = json.loads(json.dumps(config, default=str))
    return {k: v for k, v in flatten(plain).items() if _relevant(k)}


def fingerprint(config: dict) -> str:
    """Short stable hash of the training-relevant config."""
    blob = json.dumps(training_config(config), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def config_diff(saved: dict, current: dict) -> list[tuple[str, Any, Any]]:
    """[(key, saved value, current value)] of training-relevant keys that differ. Keys only one
    side has (a config key added or removed by a newer version of dlc_jax) are not compared."""
    a, b = training_config(saved), training_config(current)
    return [(k, a[k], b[k]) for k in sorted(set(a) & set(b)) if a[k] != b[k]]


def check_resume_config(meta: dict, current: dict, *, allow_change: bool, where: str) -> None:
    """Refuse (ConfigMismatchError, one line) to resume checkpoint ``meta`` with config
    ``current`` when training-relevant keys differ, unless ``allow_change`` (then a warning)."""
    saved = meta.get("config")
    if not isinstance(saved, dict):
        return  # a checkpoint from before configs were stored: nothing to compare
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


def run_outputs(log_dir: str | Path) -> list[Path]:
    """The run outputs present in ``log_dir``."""
    d = Path(log_dir)
    return [d / n for n in RUN_OUTPUTS if (d / n).exists()]


def prepare_fresh_start(ckpt, log_dir: str | Path, *, overwrite: bool) -> None:
    """Before a run that does not resume: refuse a run directory holding another run's
    checkpoints or metrics (RunDirInUseError) unless ``overwrite``, which deletes them."""
    steps = ckpt.all_steps()
    outputs = run_outputs(log_dir)
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
