"""`dlc-jax bench soak`: the sampler, trainer, hostile-input, environment and adapter soaks together
(loopback, bounded): a summary table plus each part's own under ``<out>/soak/``. Targets: 90 bad
inputs, 20 push attacks, 200 concurrent streams against the sampler; zero of every failure counted.
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
    parts = ",".join(SoakBenchConfig.parts)
    p.add_argument("--parts", default=parts, help=f"comma-separated: {parts}")
    p.add_argument("--kills", type=int, default=2, help="trainer SIGKILLs (each then resumed)")
    p.add_argument(
        "--reuse", action="store_true", help="reuse <out>/soak/<part>_soak.json of earlier runs"
    )


def from_args(size: str, args) -> SoakBenchConfig:
    """Config from the CLI args (``bench all`` passes none)."""
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
    title = "Soak: sampler service, trainer failure paths, hostile inputs, environments, adapters"
    res = common.new_result("soak", f"{title} (loopback)", COLUMNS, cfg)
    parts_dir = Path(cfg.out) / "soak"
    # the parts drive separate processes: run two side by side. transformers resolves its names
    # lazily, and two threads importing the first one at once can fail: import it here first.
    from transformers import Qwen3Config  # noqa: F401

    with ThreadPoolExecutor(2) as ex:
        futs = {p: ex.submit(_part, p, parts_dir, cfg) for p in cfg.parts}
        for p in cfg.parts:
            res["rows"].append(futs[p].result())
            res["notes"].append(f"{p}: {parts_dir}/{p}_soak.md")
    res["summary"] = tot = common.totals(res["rows"], *COLUMNS[1:-1])
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
    """Run the part ``name`` (``--reuse``: read back its earlier table if any) -> its row."""
    path = parts_dir / f"{name}_soak.json"
    if cfg.reuse and path.exists():
        r = json.loads(path.read_text())
    else:
        mod = importlib.import_module(f"{__name__}.{name}")
        args = (mod.SoakConfig(kills=cfg.kills),) if name == "trainer" else ()
        r = mod.run(parts_dir, *args)
    s = r["summary"]
    cols = _PART_COLUMNS[name].items()
    return {"part": name, **{c: s[src] if isinstance(src, str) else src(r, s) for c, src in cols}}
