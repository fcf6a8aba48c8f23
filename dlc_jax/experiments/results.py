"""Normalized per-run results (what the report reads), independent of the trainer's metric names.

Layout under an experiment directory::

    results/<run_name>.json   one RunResult each (written by the runner after a run and its KL pass)
    noise.json                {"steps", "forward", "reverse", "pairs", "own_pairs"}: N_t

Per-step series (all lists aligned with ``steps``; missing values are ``None``):
    reward, entropy, ess_lag (token ESS of exp(ell)), ess_gaussian (exp(-Var ell)), ell_mean,
    ell_std, delta_mean, delta_std, mismatch_k3 (KL(q||p) on the sampler's own prefixes, k3
    estimator), version_lag (steps since the sampler's weights were synced, per step), resyncs
    (cumulative count), delta_abs_mean and ell_abs_mean (mean |delta| and |ell| over the batch)
Checkpoint-step series: ``kl_steps`` with ``kl_forward`` = mean over the compared on-policy runs O_j
(those of the other sampling seeds) of KL(run_t || O_j,t) on the reference prefixes, ``kl_reverse``
the other direction; ``kl_by_ref`` = {O_j: [KL(run_t || O_j,t)]} and ``own_kl_by_ref`` the same on
prefixes the run sampled itself (empty when not measured).
Held-out accuracy of theta_t from the run's checkpoints (heldout.py): ``heldout`` = {"steps": [0,
checkpoint steps...], "greedy", "sampled": [accuracy per step], "greedy_correct",
"sampled_correct": [[per-prompt score] per step]} (step 0 is the initial policy; empty when not
measured).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path


@dataclasses.dataclass
class RunResult:
    """One run's normalized outputs. ``arm`` is the correction (or "onpolicy"); ``scenario`` names
    the sampler condition (stale/quantized/noisy), "reference" for the on-policy runs."""

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
    """N_t = mean over ordered on-policy pairs of KL(O_i,t || O_j,t) at checkpoint steps; ``pairs``
    keeps every pair ("O_i|O_j": [...]) for the bootstrap, ``own_pairs`` the same on O_i's own
    prefixes."""

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
                f"no noise threshold at {p} (the two on-policy runs must finish first)"
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
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
