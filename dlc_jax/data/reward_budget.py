"""The reward-failure budget: a reward failing on more than ``reward.max_failed_fraction`` of its
samples over the last ``reward.window`` batches stops the run (1.0: never). Each process judges its
own samples; a run that ends before a window fills is judged on every process's summed counts."""

from __future__ import annotations

from collections import deque

import numpy as np

from dlc_jax.errors import UserError


class RewardFailureError(UserError):
    """A reward failed on more than ``reward.max_failed_fraction`` of its samples in a window."""


class FailureBudget:
    """Failed / scored sample counts per reward over the last ``window`` batches."""

    def __init__(self, max_failed_fraction: float, window: int):
        self.max_failed_fraction = float(max_failed_fraction)
        self.window = int(window)
        self._seen: dict[str, deque[tuple[int, int]]] = {}
        self._full: set[str] = set()  # rewards whose window has been full (judged then)
        self._last: dict[str, str] = {}  # reward -> its last error

    def record(self, name: str, fn: str, failed: int, total: int, last_error: str | None) -> None:
        """Count one batch of reward ``name`` (``fn``: its ``module:function``); raise
        :class:`RewardFailureError` once a full window's failure fraction exceeds the budget."""
        if total <= 0:
            return
        seen = self._seen.setdefault(name, deque(maxlen=self.window))
        seen.append((failed, total))
        if last_error is not None:
            self._last[name] = last_error
        if len(seen) == self.window:
            self._full.add(name)
        if len(seen) < self.window or last_error is None:
            return
        bad, n = sum(f for f, _ in seen), sum(t for _, t in seen)
        if bad > self.max_failed_fraction * n:
            raise RewardFailureError(
                f"reward {name!r} ({fn}) failed on {bad} of {n} samples over the last "
                f"{self.window} batches (more than reward.max_failed_fraction="
                f"{self.max_failed_fraction:g}); last error: {last_error}"
            )

    def short_run_counts(self, names: list[str]) -> np.ndarray:
        """[len(names), 2] (failed, scored) of rewards whose window never filled."""
        out = np.zeros((len(names), 2), np.int64)
        for i, name in enumerate(names):
            seen = self._seen.get(name)
            if seen and name not in self._full:
                out[i] = (sum(f for f, _ in seen), sum(t for _, t in seen))
        return out

    def judge_short_run(self, names: list[str], fns: list[str], counts: np.ndarray) -> None:
        """Raise :class:`RewardFailureError` when summed `short_run_counts` exceed the budget."""
        if self.max_failed_fraction >= 1.0:
            return
        for name, fn, (bad, n) in zip(names, fns, np.asarray(counts).tolist()):
            if n > 0 and bad > self.max_failed_fraction * n:
                last = self._last.get(name, "(logged by another process)")
                raise RewardFailureError(
                    f"reward {name!r} ({fn}) failed on {bad} of {n} samples of a run shorter than "
                    f"reward.window={self.window} batches (more than reward.max_failed_fraction="
                    f"{self.max_failed_fraction:g}); last error: {last}"
                )
