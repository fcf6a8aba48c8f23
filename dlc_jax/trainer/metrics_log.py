"""`MetricsLogger`: per-step metrics to metrics.jsonl, TensorBoard, wandb and a progress line."""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import IO

import numpy as np
import yaml

from dlc_jax.trainer.writers import ProgressLine, WandbWriter, flatten, samples_markdown, tb_tag

logger = logging.getLogger(__name__)


def _scalar(v):
    """Python float/int of a scalar metric (jax/numpy too); None if not scalar."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v
    try:
        a = np.asarray(v)
    except Exception:  # not an array-like: not a scalar metric
        return None
    return a.item() if a.shape == () and a.dtype.kind in "biuf" else None


def _write_hparams(tb, flat: dict) -> None:
    """The resolved config in TensorBoard's HPARAMS tab, next to the headline metrics."""
    from tensorboardX.summary import hparams

    metrics = dict.fromkeys(("reward/mean", "eval/accuracy", "ess/lag"))
    writer = tb._get_file_writer()
    for summary in hparams(flat, metrics):
        writer.add_summary(summary)


def read_rows(path: Path, upto: int | None = None) -> list[dict]:
    """Rows of a metrics.jsonl (step <= ``upto``); unreadable lines are skipped with a warning."""
    rows = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            where = "its half-written last line" if i == len(lines) - 1 else f"line {i + 1}"
            logger.warning("%s: skipping %s (not JSON: %.60r)", path, where, line)
            continue
        if upto is None or row.get("step", 0) <= upto:
            rows.append(row)
    return rows


class MetricsLogger:
    """Writes ``{"step": s, **metrics}`` per step to ``<dir>/metrics.jsonl``, TensorBoard and wandb
    (``{"project", "run_name"}``; None = off). progress: a tqdm bar on a terminal, else a plain
    line every ``progress_every`` steps. append: resume, dropping rows after ``initial_step``."""

    def __init__(
        self,
        directory: str | Path,
        *,
        jsonl: bool = True,
        tensorboard: bool = True,
        progress: bool = True,
        total_steps: int | None = None,
        initial_step: int = 0,
        append: bool = False,
        progress_every: int = 10,
        config: dict | None = None,
        wandb: dict | None = None,
        quiet: bool = False,
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.directory / "metrics.jsonl" if jsonl else None
        self._jsonl = None
        self.history: list[dict] = []
        if self.jsonl_path is not None:
            if append and self.jsonl_path.exists():
                self.history = read_rows(self.jsonl_path, initial_step)
                self.jsonl_path.write_text("".join(json.dumps(r) + "\n" for r in self.history))
            self._jsonl = open(self.jsonl_path, "a" if append else "w")
        self._samples: IO[str] | None = None  # samples.jsonl, opened by the first samples
        self._append = append
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.directory / "tb"))
            if config is not None:
                text = "```yaml\n" + yaml.safe_dump(config, sort_keys=False) + "```"
                self._tb.add_text("config", text, global_step=initial_step)
                _write_hparams(self._tb, flatten(config))
        self._wandb = None
        if wandb is not None:
            project, name = wandb.get("project", "dlc-jax"), wandb.get("run_name", "")
            self._wandb = WandbWriter(self.directory, project, name, flatten(config or {}))
        self._bar = None
        self._line: ProgressLine | None = None
        if progress and sys.stdout.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps, initial=initial_step, desc="train", dynamic_ncols=True
            )
        elif not quiet:
            self._line = ProgressLine(progress_every, total_steps)
        self._t0 = time.time()

    def log(self, step: int, metrics: dict) -> dict:
        """Record scalar ``metrics`` at ``step`` (non-scalars skipped); returns the row written."""
        row: dict = {"step": int(step)}
        for k, v in metrics.items():
            if (s := _scalar(v)) is not None:
                row[k] = None if isinstance(s, float) and not math.isfinite(s) else s
        row["time_s"] = round(time.time() - self._t0, 3)
        if self._jsonl:
            self._jsonl.write(json.dumps(row) + "\n")
            self._jsonl.flush()
        tagged = ((tb_tag(k, row) if v is not None else None, v) for k, v in row.items())
        tags = {tag: v for tag, v in tagged if tag is not None}
        if self._tb:
            for tag, v in tags.items():
                self._tb.add_scalar(tag, v, global_step=step)
        if self._wandb is not None:
            self._wandb.log(step, tags)
        if self._line is not None:
            self._line.update(row)
        if self._bar is not None:
            post = {name: row[k] for name, k in ProgressLine.KEYS if row.get(k) is not None}
            self._bar.set_postfix(
                {k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in post.items()},
                refresh=False,
            )
            self._bar.update(1)
        self.history.append(row)
        return row

    def log_samples(self, step: int, records: list[dict]) -> None:
        """Sample completions of step ``step`` to samples.jsonl, TensorBoard text and wandb."""
        if not records:
            return
        records = [{"step": int(step), **r} for r in records]
        if self._samples is None:
            self._samples = open(self.directory / "samples.jsonl", "a" if self._append else "w")
        self._samples.write("".join(json.dumps(r) + "\n" for r in records))
        self._samples.flush()
        if self._tb:
            self._tb.add_text("samples", samples_markdown(records), global_step=step)
        if self._wandb is not None:
            self._wandb.log_samples(step, records)

    def summary(self) -> dict:
        """First/last/min/max/mean of each metric, and means of the first and last 10% of steps."""
        if not self.history:
            return {"steps": 0}
        keys = sorted({k for r in self.history for k in r} - {"step"})
        out = {
            "steps": len(self.history),
            "first_step": self.history[0]["step"],
            "last_step": self.history[-1]["step"],
        }
        for k in keys:
            vals = [r[k] for r in self.history if r.get(k) is not None]
            if vals and all(isinstance(v, (int, float)) for v in vals):
                w = max(1, math.ceil(0.1 * len(vals)))
                out[k] = {
                    "first": vals[0],
                    "last": vals[-1],
                    "min": min(vals),
                    "max": max(vals),
                    "mean": float(np.mean(vals)),
                    "first_10pct": float(np.mean(vals[:w])),
                    "last_10pct": float(np.mean(vals[-w:])),
                }
        return out

    def write_summary(self, extra: dict | None = None) -> Path:
        s = dict(self.summary(), **(extra or {}))
        path = self.directory / "summary.json"
        path.write_text(json.dumps(s, indent=1))
        return path

    def close(self) -> None:
        for out in (self._bar, self._samples, self._wandb, self._tb, self._jsonl):
            if out is not None:
                out.close()
