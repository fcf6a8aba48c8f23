"""Synthetic arithmetic task (prompts like ``"12+7="``); every example is a pure function of
``(seed, index)``, so the task is deterministic and random-access."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import numpy as np

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclasses.dataclass(frozen=True)
class ArithmeticConfig:
    """Operands in [0, 10**digits), operators a subset of "+-*", nonnegative answers for "-"."""

    digits: int = 2
    operators: str = "+"
    num_examples: int = 10_000
    nonnegative: bool = True

    def __post_init__(self):
        if self.digits < 1:
            raise ValueError(f"arithmetic.digits must be >= 1, got {self.digits}")
        if not self.operators or set(self.operators) - set(_OPS):
            raise ValueError(
                f"arithmetic.operators must be a non-empty subset of '+-*', got {self.operators!r}"
            )
        if self.num_examples < 1:
            raise ValueError(f"arithmetic.num_examples must be >= 1, got {self.num_examples}")


def arithmetic_example(cfg: ArithmeticConfig, seed: int, index: int) -> dict:
    """The ``index``-th example: ``{"prompt": "12+7=", "answer": "19"}``."""
    if not 0 <= index < cfg.num_examples:
        raise IndexError(f"arithmetic example index {index} out of range [0, {cfg.num_examples})")
    rng = np.random.default_rng([int(seed), int(index)])
    hi = 10**cfg.digits
    a, b = (int(x) for x in rng.integers(0, hi, size=2))
    op = cfg.operators[int(rng.integers(0, len(cfg.operators)))]
    if op == "-" and cfg.nonnegative and b > a:
        a, b = b, a
    return {"prompt": f"{a}{op}{b}=", "answer": str(_OPS[op](a, b))}


class _TaskConfig(Protocol):
    @property
    def num_examples(self) -> int: ...


C = TypeVar("C", bound=_TaskConfig)


class ExampleSource(Generic[C]):
    """Random-access source (``len`` + ``__getitem__``) of a generated task, usable as
    ``grain.MapDataset.source``: item ``index`` is ``example(cfg, seed, index)``."""

    example: Callable[[C, int, int], dict]

    def __init__(self, cfg: C, seed: int = 0):
        self.cfg, self.seed = cfg, int(seed)

    def __len__(self) -> int:
        return self.cfg.num_examples

    def __getitem__(self, index: int) -> dict:
        return type(self).example(self.cfg, self.seed, int(index))


class ArithmeticSource(ExampleSource[ArithmeticConfig]):
    example = staticmethod(arithmetic_example)
