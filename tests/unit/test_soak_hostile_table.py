"""`dlc-jax bench soak` knows the hostile part (issue 25) and reports its classes; the hostile
soak's NaN-metrics check counts rows with a missing or non-finite value."""

from __future__ import annotations

import argparse
import json

import pytest

from dlc_jax.bench import soak
from dlc_jax.bench.soak.hostile import CLASSES
from dlc_jax.bench.soak.hostile_cases import _nonfinite_rows
from dlc_jax.cli_args import UsageError


def test_parts_include_hostile_by_default_and_refuse_unknown_ones():
    assert soak.from_args("default", argparse.Namespace()).parts == (
        "sampler",
        "trainer",
        "hostile",
        "env",
        "adapter",
    )
    assert soak.from_args("default", argparse.Namespace(parts="hostile")).parts == ("hostile",)
    with pytest.raises(UsageError, match="unknown part"):
        soak.from_args("default", argparse.Namespace(parts="nope"))
    assert {"nan_metric_rows", "corrupt_exported", "classes"} <= set(soak.COLUMNS)
    assert CLASSES == ("reward", "export", "data", "config/plan")


def test_hostile_part_row_reports_each_class(tmp_path):
    summary = {
        "cases": 3,
        "failed_cases": 0,
        "crashes": 0,
        "multi_line_user_errors": 0,
        "nan_metric_rows": 0,
        "corrupt_exported": 0,
        "orphans": 0,
        "per_class": {
            c: {"cases": 1, "ok": 1, "crashes": 0, "multi_line_errors": 0} for c in CLASSES
        },
    }
    import json

    d = tmp_path / "soak"
    d.mkdir()
    (d / "hostile_soak.json").write_text(json.dumps({"summary": summary}))
    row = soak._part("hostile", d, soak.SoakBenchConfig(parts=("hostile",), reuse=True))
    assert row["part"] == "hostile" and row["cases"] == 3
    assert all(f"{c} 1/1 ok" in row["classes"] for c in CLASSES)


def test_nonfinite_rows():
    good = {"reward_mean": 0.5, "reward_std": 0.1, "grad_norm": 1.0, "loss/loss": 0.2}
    assert _nonfinite_rows([good, good]) == 0
    assert (
        _nonfinite_rows(
            [good, dict(good, reward_mean=None), dict(good, **{"loss/loss": float("nan")})]
        )
        == 2
    )


def test_env_and_adapter_part_rows(tmp_path):
    """Issue 33 item 6: the env and adapter parts report hangs, injected tokens, bad weights
    served and files left in the summary table's columns."""
    env = {"cases": 55, "failed_cases": 0, "crashes": 0, "hangs": 1, "injected_tokens": 2}
    env["nonfinite_rewards"] = 0
    (tmp_path / "env_soak.json").write_text(json.dumps({"summary": env}))
    ad = {"cases": 32, "failed_cases": 0, "crashes": 0, "accepted": 1, "bad_weights_served": 3}
    ad.update(files_left=4, exports_written=5)
    (tmp_path / "adapter_soak.json").write_text(json.dumps({"summary": ad}))
    cfg = soak.SoakBenchConfig(parts=("env", "adapter"), reuse=True)
    e, a = soak._part("env", tmp_path, cfg), soak._part("adapter", tmp_path, cfg)
    assert (e["hangs"], e["injected_tokens"], e["cases"]) == (1, 2, 55)
    assert (a["bad_weights_served"], a["files_left_behind"], a["corrupt_exported"]) == (3, 4, 5)
    assert a["failed_cases"] == 1  # an accepted hostile push fails its case
    assert {"hangs", "injected_tokens"} <= set(soak.COLUMNS)
