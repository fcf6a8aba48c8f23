"""Levanter-style hooks: ``fn(info) -> dict | None`` run in order after every step that is a
multiple of ``every`` (0 = never); what one returns is merged into ``info.row`` for the next.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass
class StepInfo:
    """One finished step: its number, metrics row and logged sample completions."""

    step: int
    row: dict
    samples: list[dict] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Hook:
    name: str
    every: int
    fn: Callable[[StepInfo], dict | None]


class Hooks:
    """An ordered list of `Hook` s."""

    def __init__(self, hooks: list[Hook] | None = None):
        self.hooks: list[Hook] = list(hooks or [])

    def add(self, name: str, every: int, fn: Callable[[StepInfo], dict | None]) -> None:
        if every < 0:
            raise ValueError(f"hook {name!r}: every must be >= 0, got {every}")
        self.hooks.append(Hook(name, int(every), fn))

    def names(self) -> list[str]:
        return [h.name for h in self.hooks]

    def run(self, info: StepInfo) -> None:
        """Run the hooks due at ``info.step``, their metrics merged into ``info.row``."""
        for h in self.hooks:
            if h.every > 0 and info.step % h.every == 0:
                info.row.update(h.fn(info) or {})
