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
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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
    )
    res["config"] = dataclasses.asdict(cfg)
    parts_dir = Path(cfg.out) / "soak"
    # the two parts drive separate processes (a sampler server; trainer runs): run them side by
    # side, each writing its own table under <out>/soak/
    # transformers resolves its names lazily, and two threads importing the first one at once can
    # fail ("cannot import name 'Qwen3Config'"): import it here, before the threads start
    from transformers import Qwen3Config  # noqa: F401

    with ThreadPoolExecutor(2) as ex:
        futs = {p: ex.submit(_PARTS[p], parts_dir, cfg) for p in cfg.parts}
        for p in cfg.parts:
            res["rows"].append(futs[p].result())
            res["notes"].append(f"{p}: {parts_dir}/{p}_soak.md")
    tot = {c: sum(r.get(c) or 0 for r in res["rows"]) for c in COLUMNS[1:-1]}
    res["summary"] = tot
    sampler: dict = next((r for r in res["rows"] if r["part"] == "sampler"), {})
    res["targets"] = [
        common.target("sampler bad inputs", sampler.get("bad_inputs"), 90, ">="),
        common.target("push attacks", sampler.get("push_attacks"), 20, ">="),
        common.target("concurrent streams", sampler.get("streams"), 200, ">="),
        common.target("crashes", tot["crashes"], 0, "<="),
        common.target("bad weights served", tot["bad_weights_served"], 0, "<="),
        common.target(
            "silent resumes from a corrupt or different run", tot["silent_bad_resumes"], 0, "<="
        ),
        common.target("files left behind", tot["files_left_behind"], 0, "<="),
        common.target("user errors not one line", tot["multi_line_errors"], 0, "<="),
    ]
    if "hostile" in cfg.parts:
        res["targets"] += [
            common.target("metrics rows with NaN/missing values", tot["nan_metric_rows"], 0, "<="),
            common.target("corrupt checkpoints exported", tot["corrupt_exported"], 0, "<="),
        ]
    if "env" in cfg.parts or "adapter" in cfg.parts:
        res["targets"] += [
            common.target("hangs", tot["hangs"], 0, "<="),
            common.target("control tokens injected from text", tot["injected_tokens"], 0, "<="),
        ]
    if cfg.reuse:
        res["notes"].append(
            "--reuse: parts present under <out>/soak/ were read back, not run again (each part's "
            "table has its own wall time and load)"
        )
    res["notes"].append(common.load_note(res["machine"]))
    return common.finish(res)


def _earlier(parts_dir: Path, name: str, cfg: SoakBenchConfig) -> dict | None:
    path = parts_dir / f"{name}_soak.json"
    return json.loads(path.read_text()) if cfg.reuse and path.exists() else None


def _sampler_part(parts_dir: Path, cfg: SoakBenchConfig) -> dict:
    from . import sampler

    r = _earlier(parts_dir, "sampler", cfg) or sampler.run(parts_dir)
    s = r["summary"]
    return {
        "part": "sampler",
        "cases": s["bad_inputs"] + s["push_attacks"],
        "bad_inputs": s["bad_inputs"],
        "push_attacks": s["push_attacks"],
        "streams": r["config"].get("streams"),
        "crashes": s["crashes"],
        "bad_weights_served": s["bad_weights_served"],
        "silent_bad_resumes": 0,
        "files_left_behind": s["files_left_behind"],
        "multi_line_errors": s["multi_line_errors"],
        "failed_cases": s["attacks_accepted"] + s.get("wrong_codes", 0),
    }


def _trainer_part(parts_dir: Path, cfg: SoakBenchConfig) -> dict:
    from . import trainer

    r = _earlier(parts_dir, "trainer", cfg) or trainer.run(
        parts_dir, trainer.SoakConfig(kills=cfg.kills)
    )
    s = r["summary"]
    return {
        "part": "trainer",
        "cases": s["cases"],
        "bad_inputs": s["user_errors"],
        "kills": s["kills"],
        "checkpoint_damage": s["checkpoint_damage"],
        "crashes": s["crashes"],
        "bad_weights_served": s["bad_weights"],
        "silent_bad_resumes": s["silent_bad_resumes"],
        "files_left_behind": s["files_left_behind"],
        "multi_line_errors": s["multi_line_user_errors"],
        "failed_cases": s["failed_cases"],
    }


def _hostile_part(parts_dir: Path, cfg: SoakBenchConfig) -> dict:
    from . import hostile

    r = _earlier(parts_dir, "hostile", cfg) or hostile.run(parts_dir)
    s = r["summary"]
    return {
        "part": "hostile",
        "cases": s["cases"],
        "bad_inputs": s["cases"],
        "crashes": s["crashes"],
        "files_left_behind": s["orphans"],
        "multi_line_errors": s["multi_line_user_errors"],
        "nan_metric_rows": s["nan_metric_rows"],
        "corrupt_exported": s["corrupt_exported"],
        "failed_cases": s["failed_cases"],
        # per class: cases / ok / crashes / multi-line errors (the part's own table has each case)
        "classes": "; ".join(
            f"{c} {v['ok']}/{v['cases']} ok, {v['crashes']} crashes, "
            f"{v['multi_line_errors']} multi-line"
            for c, v in s["per_class"].items()
        ),
    }


def _env_part(parts_dir: Path, cfg: SoakBenchConfig) -> dict:
    from . import env

    r = _earlier(parts_dir, "env", cfg) or env.run(parts_dir)
    s = r["summary"]
    return {
        "part": "env",
        "cases": s["cases"],
        "bad_inputs": s["cases"],
        "crashes": s["crashes"],
        "hangs": s["hangs"],
        "injected_tokens": s["injected_tokens"],
        "nan_metric_rows": s["nonfinite_rewards"],
        "failed_cases": s["failed_cases"],
    }


def _adapter_part(parts_dir: Path, cfg: SoakBenchConfig) -> dict:
    from . import adapter

    r = _earlier(parts_dir, "adapter", cfg) or adapter.run(parts_dir)
    s = r["summary"]
    return {
        "part": "adapter",
        "cases": s["cases"],
        "push_attacks": s["cases"],
        "crashes": s["crashes"],
        "bad_weights_served": s["bad_weights_served"],
        "files_left_behind": s["files_left"],
        "corrupt_exported": s["exports_written"],
        "failed_cases": s["failed_cases"] + s["accepted"],
    }


_PARTS = {
    "sampler": _sampler_part,
    "trainer": _trainer_part,
    "hostile": _hostile_part,
    "env": _env_part,
    "adapter": _adapter_part,
}
