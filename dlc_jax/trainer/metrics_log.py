"""Per-step metrics to JSONL and TensorBoard (tensorboardX), a tqdm progress bar, an end summary."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np


def _scalar(v):
    """Python float/int of a scalar metric (jax/numpy scalars included); None if not scalar."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v
    try:
        a = np.asarray(v)
    except Exception:  # not an array-like: not a scalar metric
        return None
    if a.shape == () and a.dtype.kind in "biuf":
        return a.item()
    return None


class MetricsLogger:
    """Writes ``{"step": s, **metrics}`` per step to ``<dir>/metrics.jsonl`` and TensorBoard events.

    progress: show a tqdm bar with step, reward, lag ESS and the resync count.
    append: continue an existing metrics.jsonl (resume), dropping its rows after ``initial_step``.
    """

    BAR_KEYS = (("reward", "reward_mean"), ("ess", "ess_lag"), ("resyncs", "resync_count"))

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
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.directory / "metrics.jsonl" if jsonl else None
        self._jsonl = None
        if self.jsonl_path is not None:
            if append and self.jsonl_path.exists():
                # resume: drop rows past the checkpoint (steps that will be recomputed)
                keep = [
                    line
                    for line in self.jsonl_path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= initial_step
                ]
                self.jsonl_path.write_text("".join(line + "\n" for line in keep))
            self._jsonl = open(self.jsonl_path, "a" if append else "w")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.directory / "tb"))
        self._bar = None
        if progress:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps, initial=initial_step, desc="train", dynamic_ncols=True
            )
        self.history: list[dict] = []
        self._t0 = time.time()

    def log(self, step: int, metrics: dict) -> dict:
        """Record scalar ``metrics`` at ``step``; non-scalars are skipped. Returns what was
        written."""
        row: dict = {"step": int(step)}
        for k, v in metrics.items():
            s = _scalar(v)
            if s is not None:
                row[k] = None if isinstance(s, float) and not math.isfinite(s) else s
        row["time_s"] = round(time.time() - self._t0, 3)
        if self._jsonl:
            self._jsonl.write(json.dumps(row) + "\n")
            self._jsonl.flush()
        if self._tb:
            for k, v in row.items():
                if k != "step" and v is not None:
                    self._tb.add_scalar(k, v, global_step=step)
        if self._bar is not None:
            post = {name: row[k] for name, k in self.BAR_KEYS if row.get(k) is not None}
            self._bar.set_postfix(
                {k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in post.items()},
                refresh=False,
            )
            self._bar.update(1)
        self.history.append(row)
        return row

    def summary(self) -> dict:
        """First/last/min/max of each metric over the run plus counters."""
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
            if vals:
                out[k] = {
                    "first": vals[0],
                    "last": vals[-1],
                    "min": min(vals),
                    "max": max(vals),
                    "mean": float(np.mean(vals)),
                }
        return out

    def write_summary(self, extra: dict | None = None) -> Path:
        s = dict(self.summary(), **(extra or {}))
        path = self.directory / "summary.json"
        path.write_text(json.dumps(s, indent=1))
        return path

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb:
            self._tb.close()
        if self._jsonl:
            self._jsonl.close()
