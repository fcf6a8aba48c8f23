"""Hooks: what runs after a training step at an interval (evaluation, the metrics row, checkpoints),
levanter-style. A hook is ``fn(info) -> dict | None`` run after every step that is a multiple of
``every`` (0 = never), in the order added; what it returns is merged into ``info.row`` before the
next hook runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass
class StepInfo:
    """One finished step: its number (optimizer steps so far), its metrics row and the sample
    completions logged for it (``log.samples_every``; empty when not due)."""

    step: int
    row: dict
    samples: list[dict] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Hook:
    name: str
    every: int
    fn: Callable[[StepInfo], dict | None]

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0


class Hooks:
    """An ordered list of `Hook` s."""

    def __init__(self, hooks: list[Hook] | None = None):
        self.hooks: list[Hook] = list(hooks or [])

    def add(self, name: str, every: int, fn: Callable[[StepInfo], dict | None]) -> Hook:
        if every < 0:
            raise ValueError(f"hook {name!r}: every must be >= 0, got {every}")
        h = Hook(name, int(every), fn)
        self.hooks.append(h)
        return h

    def names(self) -> list[str]:
        return [h.name for h in self.hooks]

    def run(self, info: StepInfo) -> StepInfo:
        """Run the hooks due at ``info.step``; returns ``info`` with their metrics in its row."""
        for h in self.hooks:
            if h.due(info.step):
                out = h.fn(info)
                if out:
                    info.row.update(out)
        return info
