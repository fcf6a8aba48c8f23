"""`dlc-jax bench soak`: the sampler soak (`sampler`), the trainer soak (`trainer`),
the hostile-input soak (`hostile`: reward values and types, export of corrupt checkpoints, data
edges, config and plan ranges), the environment soak (`env`: hostile environments in training,
evaluation and the warm-up, injected control tokens) and the adapter soak (`adapter`: hostile
LoRA pushes, damaged exports repeated) together, loopback only and bounded; one summary table
(``soak.{json,md}``) plus each part's own table under ``<out>/soak/``.

Targets (issue 12): at least 90 bad inputs, 20 push attacks and 200 concurrent streams against the
sampler; checkpoint bit flips and truncations and SIGKILLs at random points against the trainer;
0 crashes, 0 bad weights served, 0 silent resumes from a corrupt or different run, 0 files left
behind, every user error one line. Issue 25 adds: 0 NaN metrics rows, 0 corrupt checkpoints
exported, 0 processes a reward spawned outliving the run. Issue 33 adds: 0 hangs, 0 control
tokens injected from text, 0 hostile adapters accepted, 0 damaged exports not one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dlc_jax.cli_args import UsageError

from .. import common


@dataclasses.dataclass
class SoakBenchConfig:
    parts: tuple[str, ...] = ("sampler", "trainer", "hostile", "env", "adapter")
    kills: int = 2
    out: str = "bench_results"
    reuse: bool = False  # read a part's <out>/soak/<part>_soak.json instead of running it again


SIZES = {"default": SoakBenchConfig()}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--parts",
        default=",".join(SoakBenchConfig.parts),
        help="comma-separated: sampler,trainer,hostile,env,adapter",
    )
    p.add_argument("--kills", type=int, default=2, help="trainer SIGKILLs (each then resumed)")
    p.add_argument(
        "--reuse", action="store_true", help="reuse <out>/soak/<part>_soak.json of earlier runs"
    )


def from_args(size: str, args) -> SoakBenchConfig:
    """Config from the CLI args (``bench all`` passes none: the defaults)."""
    raw = getattr(args, "parts", None) or ",".join(SoakBenchConfig.parts)
    parts = tuple(p.strip() for p in raw.split(",") if p.strip())
    bad = sorted(set(parts) - set(_PARTS))
    if bad:
        raise UsageError(f"--parts: unknown part(s) {bad}; choose from {', '.join(_PARTS)}")
    return SoakBenchConfig(
        parts=parts,
        kills=int(getattr(args, "kills", None) or 2),
        out=getattr(args, "out", None) or "bench_results",
        reuse=bool(getattr(args, "reuse", False)),
    )


COLUMNS = [
    "part",
    "cases",
    "bad_inputs",
    "push_attacks",
    "streams",
    "kills",
    "checkpoint_damage",
    "crashes",
    "bad_weights_served",
    "silent_bad_resumes",
    "files_left_behind",
    "multi_line_errors",
    "nan_metric_rows",
    "corrupt_exported",
    "hangs",
    "injected_tokens",
    "failed_cases",
    "classes",  # the hostile part: per class, cases ok / crashes / multi-line errors
]


def run(cfg: SoakBenchConfig) -> dict:
    res = common.new_result(
        "soak",
        "Soak: sampler service, trainer failure paths, hostile inputs, environments, adapters "
        "(loopback)",
        COLUMNS,
        cfg,
    )
    parts_dir = Path(cfg.out) / "soak"
    # the two parts drive separate processes (a sampler server; trainer runs): run them side by
    # side, each writing its own table under <out>/soak/
    # transformers resolves its names lazily, and two threads importing the first one at once can
    # fail ("cannot import name 'Qwen3Config'"): import it here, before the threads start
    from transformers import Qwen3Config  # noqa: F401

    with ThreadPoolExecutor(2) as ex:
        futs = {p: ex.submit(_part, p, parts_dir, cfg) for p in cfg.parts}
        for p in cfg.parts:
            res["rows"].append(futs[p].result())
            res["notes"].append(f"{p}: {parts_dir}/{p}_soak.md")
    tot = common.totals(res["rows"], *COLUMNS[1:-1])
    res["summary"] = tot
    sampler: dict = next((r for r in res["rows"] if r["part"] == "sampler"), {})
    res["targets"] = [
        common.target("sampler bad inputs", sampler.get("bad_inputs"), 90, ">="),
        common.target("push attacks", sampler.get("push_attacks"), 20, ">="),
        common.target("concurrent streams", sampler.get("streams"), 200, ">="),
    ]
    zero = {
        "crashes": "crashes",
        "bad weights served": "bad_weights_served",
        "silent resumes from a corrupt or different run": "silent_bad_resumes",
        "files left behind": "files_left_behind",
        "user errors not one line": "multi_line_errors",
    }
    if "hostile" in cfg.parts:
        zero["metrics rows with NaN/missing values"] = "nan_metric_rows"
        zero["corrupt checkpoints exported"] = "corrupt_exported"
    if "env" in cfg.parts or "adapter" in cfg.parts:
        zero.update({"hangs": "hangs", "control tokens injected from text": "injected_tokens"})
    res["targets"] += common.zero_targets(tot, zero)
    if cfg.reuse:
        res["notes"].append(
            "--reuse: parts present under <out>/soak/ were read back, not run again (each part's "
            "table has its own wall time and load)"
        )
    return common.finish_soak(res)


# Each part's row of the summary: column -> the key of the part's own summary it copies, or a
# function of the part's result (r) and summary (s).
_PART_COLUMNS: dict[str, dict[str, Any]] = {
    "sampler": {
        "cases": lambda r, s: s["bad_inputs"] + s["push_attacks"],
        "bad_inputs": "bad_inputs",
        "push_attacks": "push_attacks",
        "streams": lambda r, s: r["config"].get("streams"),
        "crashes": "crashes",
        "bad_weights_served": "bad_weights_served",
        "silent_bad_resumes": lambda r, s: 0,
        "files_left_behind": "files_left_behind",
        "multi_line_errors": "multi_line_errors",
        "failed_cases": lambda r, s: s["attacks_accepted"] + s.get("wrong_codes", 0),
    },
    "trainer": {
        "cases": "cases",
        "bad_inputs": "user_errors",
        "kills": "kills",
        "checkpoint_damage": "checkpoint_damage",
        "crashes": "crashes",
        "bad_weights_served": "bad_weights",
        "silent_bad_resumes": "silent_bad_resumes",
        "files_left_behind": "files_left_behind",
        "multi_line_errors": "multi_line_user_errors",
        "failed_cases": "failed_cases",
    },
    "hostile": {
        "cases": "cases",
        "bad_inputs": "cases",
        "crashes": "crashes",
        "files_left_behind": "orphans",
        "multi_line_errors": "multi_line_user_errors",
        "nan_metric_rows": "nan_metric_rows",
        "corrupt_exported": "corrupt_exported",
        "failed_cases": "failed_cases",
        # per class: cases / ok / crashes / multi-line errors (the part's own table has each case)
        "classes": lambda r, s: "; ".join(
            f"{c} {v['ok']}/{v['cases']} ok, {v['crashes']} crashes, "
            f"{v['multi_line_errors']} multi-line"
            for c, v in s["per_class"].items()
        ),
    },
    "env": {
        "cases": "cases",
        "bad_inputs": "cases",
        "crashes": "crashes",
        "hangs": "hangs",
        "injected_tokens": "injected_tokens",
        "nan_metric_rows": "nonfinite_rewards",
        "failed_cases": "failed_cases",
    },
    "adapter": {
        "cases": "cases",
        "push_attacks": "cases",
        "crashes": "crashes",
        "bad_weights_served": "bad_weights_served",
        "files_left_behind": "files_left",
        "corrupt_exported": "exports_written",
        "failed_cases": lambda r, s: s["failed_cases"] + s["accepted"],
    },
}
_PARTS = tuple(_PART_COLUMNS)


def _part(name: str, parts_dir: Path, cfg: SoakBenchConfig) -> dict:
    """Run the part ``name`` (with ``--reuse``: read back its earlier table when there is one)
    and return its row of the summary."""
    path = parts_dir / f"{name}_soak.json"
    if cfg.reuse and path.exists():
        r = json.loads(path.read_text())
    else:
        mod = importlib.import_module(f"{__name__}.{name}")
        r = (
            mod.run(parts_dir, mod.SoakConfig(kills=cfg.kills))
            if name == "trainer"
            else mod.run(parts_dir)
        )
    s = r["summary"]
    row = {"part": name}
    for col, src in _PART_COLUMNS[name].items():
        row[col] = s[src] if isinstance(src, str) else src(r, s)
    return row
