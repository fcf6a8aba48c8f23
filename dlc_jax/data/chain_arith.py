"""Chain arithmetic: a synthetic task whose answers are worked chains of partial sums,
``"3+5+2+7="`` -> ``"3+5=8,8+2=10,10+7=17 #### 17"``, so lag and numerics act over many tokens per
sequence. Examples are pure functions of ``(seed, index)``."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np

from dlc_jax.data.arithmetic import ExampleSource


@dataclasses.dataclass(frozen=True)
class ChainArithConfig:
    """Terms per example in [min_terms, max_terms] (>= 2), each in [0, 10**digits)."""

    min_terms: int = 3
    max_terms: int = 5
    digits: int = 1
    num_examples: int = 2000

    def __post_init__(self):
        if not 2 <= self.min_terms <= self.max_terms:
            raise ValueError(
                f"chain_arith: need 2 <= min_terms <= max_terms, got {self.min_terms}, "
                f"{self.max_terms}"
            )
        if self.digits < 1:
            raise ValueError(f"chain_arith.digits must be >= 1, got {self.digits}")
        if self.num_examples < 1:
            raise ValueError(f"chain_arith.num_examples must be >= 1, got {self.num_examples}")


def worked_answer(terms: list[int]) -> str:
    """``[3, 5, 2]`` -> ``"3+5=8,8+2=10 #### 10"``."""
    if len(terms) < 2:
        raise ValueError(f"worked_answer needs at least 2 terms, got {terms}")
    steps = [f"{a}+{t}={a + t}" for a, t in zip(itertools.accumulate(terms), terms[1:])]
    return ",".join(steps) + f" #### {sum(terms)}"


def chain_example(cfg: ChainArithConfig, seed: int, index: int) -> dict:
    """The ``index``-th example: ``{"prompt", "answer" (the total), "worked" (the SFT target)}``."""
    if not 0 <= index < cfg.num_examples:
        raise IndexError(f"chain_arith example index {index} out of range [0, {cfg.num_examples})")
    rng = np.random.default_rng([int(seed), int(index), 7])
    n = int(rng.integers(cfg.min_terms, cfg.max_terms + 1))
    terms = [int(x) for x in rng.integers(0, 10**cfg.digits, size=n)]
    prompt = "+".join(map(str, terms)) + "="
    return {"prompt": prompt, "answer": str(sum(terms)), "worked": worked_answer(terms)}


class ChainArithSource(ExampleSource[ChainArithConfig]):
    example = staticmethod(chain_example)


class WorkedTargets:
    """View of a source whose ``answer`` is the worked answer (the SFT target)."""

    def __init__(self, source: ChainArithSource):
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> dict:
        ex = self.source[index]
        return {"prompt": ex["prompt"], "answer": ex["worked"]}


def write_jsonl(source: ChainArithSource, path: str | Path) -> Path:
    """Write every record as JSONL (a ``data.source`` file for the trainer)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(source[i]) + "\n" for i in range(len(source))))
    tmp.replace(path)
    return path
