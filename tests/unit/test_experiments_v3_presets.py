"""The v3 presets of issue 32: arms, seeds, scenarios of measured discrepancy size, the frozen
control, the sequence-statistic DLC, and the budget the dry run prints."""

from __future__ import annotations

import pytest

from dlc_jax.experiments.budget import estimate, train_cpu_s
from dlc_jax.experiments.matrix import run_specs
from dlc_jax.experiments.presets import PRESETS, TINY, TINY_ARMS, TINY_V3, TINY_V3_MORE

pytestmark = pytest.mark.unit


def _seeds(specs, arm):
    return {s.seed for s in specs if s.arm == arm}


def test_main_preset_has_the_v2_arms_the_control_and_the_seeds():
    assert set(TINY_ARMS) | {"frozen"} <= set(TINY_V3.arms)
    specs = run_specs(TINY_V3)
    for arm in ("onpolicy", "naive", "tis", "mis", "dlc", "dlc_noresync"):
        assert len(_seeds(specs, arm)) >= 5, arm
    for arm in TINY_V3.arms:
        assert len(_seeds(specs, arm)) >= 3, arm
    frozen = [s for s in specs if s.arm == "frozen"]
    assert frozen and all(s.overrides[-2] == "optim.lr=1e-12" for s in frozen)
    seq = [s for s in specs if s.arm == "dlc_seq"][0]
    assert "resync.policy=ess" in seq.overrides and "resync.statistic=sequence" in seq.overrides


def test_scenarios_cover_the_sizes_and_the_staleness():
    both = {s.name: s for s in TINY_V3.scenarios + TINY_V3_MORE.scenarios}
    assert both["both_noise20"].weight_noise == 0.2 and both["both_noise20"].kind == "both"
    assert both["disc_fp8"].quantization == "fp8_e4m3" and both["disc_fp8"].kind == "discrepancy"
    assert both["disc_noise20"].kind == "discrepancy"
    assert [both[f"lag_k{k}"].sync_k for k in (2, 4, 8)] == [2, 4, 8]
    assert PRESETS["tiny_v3"] is TINY_V3 and PRESETS["tiny_v3_more"] is TINY_V3_MORE


def test_budget_model_matches_the_measured_tiny_matrix():
    # the committed `tiny` matrix: 101 trainings of 20 x 32, 9,700 CPU-s measured
    assert train_cpu_s(20, 32) == pytest.approx(79.2)
    b = estimate(104, 101, 20, 32, 2)
    assert 9_000 < b.cpu_s < 10_500 and b.wall_min == pytest.approx(b.cpu_s / 120)
    assert "104 runs (101 trainings" in b.line() and "--workers 2" in b.line()
    assert TINY.steps == 20


def test_both_v3_presets_fit_150_minutes_on_two_cores(tmp_path):
    from dlc_jax.experiments.runner import Experiment

    for p in (TINY_V3, TINY_V3_MORE):
        b = Experiment(p, tmp_path / p.name, workers=2).budget()
        assert b.wall_min <= 150, (p.name, b.line())
