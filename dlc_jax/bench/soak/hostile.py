"""The hostile-input soak (`hostile_cases`) on real ``python -m dlc_jax.cli`` processes. Counted:
crashes, user errors not one line, metrics rows with a non-finite or missing value, corrupt
checkpoints exported, and processes a reward spawned that outlived the run (``orphans``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import tempfile
from pathlib import Path

from .. import common
from .hostile_cases import config_plan_cases, data_cases, export_cases, reward_cases
from .trainer_harness import Tally, tiny_model

CLASSES = ("reward", "export", "data", "config/plan")


@dataclasses.dataclass
class HostileSoakConfig:
    classes: tuple[str, ...] = CLASSES
    run_timeout_s: float = 600.0


def run(out_dir, cfg: HostileSoakConfig | None = None) -> dict:
    """Run the hostile-input soak; write ``<out_dir>/hostile_soak.{json,md}``; return the result."""
    cfg = cfg or HostileSoakConfig()
    cols = ["scenario", "cases", "ok", "crashes", "multi_line_errors", "seconds"]
    title = "Hostile inputs: rewards, export, data, config and plan (loopback)"
    res = common.new_result("hostile_soak", title, cols, cfg)
    t = Tally()
    counts = {"nan_metric_rows": 0, "corrupt_exported": 0, "orphans": 0}
    timeout = cfg.run_timeout_s
    with tempfile.TemporaryDirectory(prefix="dlc_hostile_soak_") as tmp:
        work = Path(tmp)
        model = tiny_model(work)
        if "config/plan" in cfg.classes:
            config_plan_cases(work, t, timeout)
        if "data" in cfg.classes:
            data_cases(model, work, t, timeout)
        if "export" in cfg.classes:
            export_cases(model, work, t, counts, timeout)
        if "reward" in cfg.classes:
            reward_cases(model, work, t, counts, timeout)
    res["rows"] = rows = [{k: r[k] for k in cols} for r in t.rows.values()]
    keys = ("cases", "ok", "crashes", "multi_line_errors")
    per_class = {
        c: common.totals((r for r in rows if r["scenario"].startswith(c + ":")), *keys)
        for c in CLASSES
    }
    s = res["summary"] = common.case_totals(rows, "crashes")
    s["multi_line_user_errors"] = common.totals(rows, "multi_line_errors")["multi_line_errors"]
    s.update(counts, per_class=per_class)
    res["targets"] = common.zero_targets(
        s,
        {
            "crashes": "crashes",
            "user errors not one line": "multi_line_user_errors",
            "metrics rows with NaN/missing values": "nan_metric_rows",
            "corrupt checkpoints exported": "corrupt_exported",
            "reward children outliving the run": "orphans",
            "failed cases": "failed_cases",
        },
    )
    return common.finish_soak(res, out_dir, t.examples[:60])


if __name__ == "__main__":  # python -m dlc_jax.bench.soak.hostile OUT_DIR [CLASS,...]
    logging.basicConfig(level=logging.WARNING)
    classes = tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else CLASSES
    r = run(sys.argv[1] if len(sys.argv) > 1 else "soak_out", HostileSoakConfig(classes=classes))
    print(json.dumps(r["summary"], indent=2))
