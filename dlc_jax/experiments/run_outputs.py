"""A run's outputs turned into results (results.py): its metrics log normalized, its KL to the
on-policy runs averaged into D_t, and the on-policy runs' KL to each other into N_t."""

from __future__ import annotations

import json
from pathlib import Path

from dlc_jax.experiments.matrix import RunSpec
from dlc_jax.experiments.results import NoiseThreshold, RunResult, load_results

# canonical series name -> trainer metric keys to try, in order
METRIC_KEYS: dict[str, tuple[str, ...]] = {
    "reward": ("reward_mean", "reward/mean", "reward"),
    "entropy": ("entropy_mean", "entropy"),
    "ess_lag": ("ess_lag", "lag/ess"),
    "ess_gaussian": ("ess_lag_gaussian", "lag/ess_gaussian"),
    "ell_mean": ("ell_mean", "lag/mean"),
    "ell_std": ("ell_std", "lag/std"),
    "delta_mean": ("delta_mean", "discrepancy/mean"),
    "delta_abs_mean": ("delta_abs_mean",),
    "delta_abs_p99": ("delta_abs_p99",),
    "ess_lag_seq": ("ess_lag_seq",),
    "ell_abs_mean": ("ell_abs_mean",),
    "delta_std": ("delta_std", "discrepancy/std"),
    "mismatch_k3": ("kl_k3", "mismatch/kl_k3"),
    "version_lag": (
        "version_lag",
        "lag/version",
        "weight_version_lag",
        "version_lag_mean",
        "steps_since_sync",
    ),
    "resyncs": ("resyncs", "resync/count", "num_resyncs", "resync_count"),
}


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        raise FileNotFoundError(f"no metrics at {path} (did the run log JSONL?)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_step = {int(r["step"]): r for r in rows}  # a step logged twice (resumed run): the last
    return [by_step[s] for s in sorted(by_step)]


def normalize_metrics(rows: list[dict]) -> tuple[list[int], dict[str, list]]:
    """Trainer metric rows -> (steps, canonical series) using :data:`METRIC_KEYS`."""
    steps = [int(r["step"]) for r in rows]
    series = {}
    for name, keys in METRIC_KEYS.items():
        key = next((k for k in keys if any(k in r for r in rows)), None)
        if key is not None:
            series[name] = [r.get(key) for r in rows]
    return steps, series


def run_result(
    spec: RunSpec, run_dir: Path, kl: dict, own: dict | None, heldout: dict | None = None
) -> RunResult:
    """``spec``'s result from the run trained in ``run_dir`` (possibly another spec's identical
    run), its KL to each on-policy run on the reference (``kl``) and own (``own``) prefixes and its
    held-out accuracy."""
    steps, series = normalize_metrics(read_metrics(run_dir / "logs" / "metrics.jsonl"))
    kl_steps = sorted({s for by in kl.values() for s in by})

    def mean_at(d, s, i):
        vals = [d[r][s][i] for r in d if s in d[r]]
        return float(sum(vals) / len(vals)) if vals else None

    done = json.loads((run_dir / "DONE").read_text())
    own = own or {}
    return RunResult(
        name=spec.name,
        arm=spec.arm,
        scenario=spec.scenario,
        steps=steps,
        series=series,
        kl_steps=kl_steps,
        kl_forward=[mean_at(kl, s, 0) for s in kl_steps],
        kl_reverse=[mean_at(kl, s, 1) for s in kl_steps],
        wall_s=float(done.get("wall_s", 0.0)),
        seed=spec.seed,
        kl_by_ref={r: [kl[r].get(s, (None,))[0] for s in kl_steps] for r in sorted(kl)},
        own_kl_by_ref={r: [own[r].get(s, (None,))[0] for s in kl_steps] for r in sorted(own)},
        info={
            "overrides": list(spec.overrides),
            "trained_as": run_dir.name,
            "cpu_s": done.get("cpu_s"),
            "loadavg": done.get("loadavg"),
        },
        heldout=dict(heldout or {}),
    )


def write_noise(out: Path, onpolicy_names: list[str]) -> None:
    """``noise.json``: N_t over ordered on-policy pairs, every pair kept (also on own prefixes)."""
    res = load_results(out)
    have = [res[n] for n in onpolicy_names if n in res]
    if len(have) < 2:
        return
    steps = have[0].kl_steps
    pairs = {f"{r.name}|{ref}": vals for r in have for ref, vals in r.kl_by_ref.items()}
    own = {f"{r.name}|{ref}": vals for r in have for ref, vals in r.own_kl_by_ref.items()}
    n = len(pairs)
    mean = [float(sum(v[i] for v in pairs.values()) / n) for i in range(len(steps))] if n else []
    # ordered pairs hold both directions, so the mean forward and reverse KL coincide
    NoiseThreshold(steps, forward=mean, reverse=mean, pairs=pairs, own_pairs=own).save(out)
