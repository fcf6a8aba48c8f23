"""Per-run results (``results/<run>.json``) and the noise threshold (``noise.json``). ``series``
align with ``steps`` (None where missing; names in ``run_outputs.METRIC_KEYS``). At checkpoint
``kl_steps``: ``kl_forward`` = mean over the compared on-policy runs O_j of KL(run_t || O_j,t) on
the reference prefixes, ``kl_reverse`` the other way, ``kl_by_ref`` = {O_j: [KL(run_t || O_j,t)]},
``own_kl_by_ref`` the same on the run's own prefixes. ``heldout``: {"steps": [0, checkpoints...],
"greedy", "sampled": [accuracy per step], "greedy_correct", "sampled_correct": [[per-prompt score]
per step]} (heldout.py)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path


@dataclasses.dataclass
class RunResult:
    """One run's outputs; ``scenario`` is "reference" for the on-policy runs."""

    name: str
    arm: str
    scenario: str
    steps: list[int]
    series: dict[str, list]
    kl_steps: list[int] = dataclasses.field(default_factory=list)
    kl_forward: list[float] = dataclasses.field(default_factory=list)
    kl_reverse: list[float] = dataclasses.field(default_factory=list)
    wall_s: float = 0.0
    info: dict = dataclasses.field(default_factory=dict)
    seed: int = 0
    kl_by_ref: dict = dataclasses.field(default_factory=dict)
    own_kl_by_ref: dict = dataclasses.field(default_factory=dict)
    heldout: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        n = len(self.steps)
        for k, v in self.series.items():
            if len(v) != n:
                raise ValueError(f"run {self.name}: series {k!r} has {len(v)} values for {n} steps")
        if not (len(self.kl_steps) == len(self.kl_forward) == len(self.kl_reverse)):
            raise ValueError(f"run {self.name}: kl_steps/kl_forward/kl_reverse lengths differ")

    def get(self, key: str) -> list:
        """Series ``key`` (all None when the trainer did not log it)."""
        return self.series.get(key, [None] * len(self.steps))

    def to_json(self) -> dict:
        return json_safe(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, d: dict) -> RunResult:
        return cls(**d)

    def save(self, exp_dir: str | Path) -> Path:
        p = Path(exp_dir) / "results" / f"{self.name}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json()))
        tmp.replace(p)
        return p


@dataclasses.dataclass
class NoiseThreshold:
    """N_t at checkpoint steps; ``pairs`` / ``own_pairs`` keep every "O_i|O_j" KL."""

    steps: list[int]
    forward: list[float]
    reverse: list[float]
    pairs: dict = dataclasses.field(default_factory=dict)
    own_pairs: dict = dataclasses.field(default_factory=dict)

    def save(self, exp_dir: str | Path) -> Path:
        p = Path(exp_dir) / "noise.json"
        p.write_text(json.dumps(json_safe(dataclasses.asdict(self))))
        return p

    @classmethod
    def load(cls, exp_dir: str | Path) -> NoiseThreshold:
        p = Path(exp_dir) / "noise.json"
        if not p.exists():
            raise FileNotFoundError(
                f"no noise threshold at {p} (the on-policy runs must finish first)"
            )
        return cls(**json.loads(p.read_text()))


def load_results(exp_dir: str | Path) -> dict[str, RunResult]:
    """All ``results/*.json`` of an experiment, by run name."""
    out = {}
    for p in sorted((Path(exp_dir) / "results").glob("*.json")):
        try:
            r = RunResult.from_json(json.loads(p.read_text()))
        except (json.JSONDecodeError, TypeError, ValueError) as e:
            raise ValueError(f"{p}: not a valid run result: {e}") from e
        out[r.name] = r
    return out


def json_safe(x):
    """JSON-safe copy: NaN/inf -> None."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x
