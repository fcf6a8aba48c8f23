"""Scenarios say which error source they have; the matrix's overrides follow the scenario; runs
are trained `workers` at a time."""

import threading

import pytest

from dlc_jax.experiments.matrix import RunSpec, arm_overrides, run_specs
from dlc_jax.experiments.presets import ARMS, TINY, Scenario
from dlc_jax.experiments.runner import Experiment


def test_a_scenario_kind_must_match_its_sync_and_perturbation():
    Scenario("lag", sync="never", kind="lag")
    Scenario("disc", sync="onpolicy", quantization="int8", kind="discrepancy")
    Scenario("bf16", sync="onpolicy", dtype="bfloat16", kind="discrepancy")
    Scenario("both", sync="never", quantization="int8", kind="both")
    with pytest.raises(ValueError, match="is kind 'lag', not 'both'"):
        Scenario("x", sync="every_k")
    with pytest.raises(ValueError, match="is kind 'discrepancy', not 'lag'"):
        Scenario("x", sync="onpolicy", weight_noise=0.1, kind="lag")
    with pytest.raises(ValueError, match="sync must be one of"):
        Scenario("x", sync="sometimes", kind="lag")


def test_a_sampler_synced_every_batch_overrides_dlcs_own_trigger():
    disc = Scenario("d", sync="onpolicy", dtype="bfloat16", kind="discrepancy")
    ov = dict(o.split("=", 1) for o in arm_overrides(ARMS["dlc"], disc))
    assert ov["resync.policy"] == "onpolicy" and ov["sampler.dtype"] == "bfloat16"
    lag = Scenario("l", sync="never", kind="lag")
    assert "resync.policy=ess" in arm_overrides(ARMS["dlc"], lag)
    assert "sampler.head_k=0" in arm_overrides(ARMS["dlc_nocenter"], lag)


def test_bounded_staleness_caps_dlcs_trigger_at_the_scenarios_k():
    k8 = Scenario("lag_k8", sync="every_k", sync_k=8, kind="lag")
    dlc = dict(o.split("=", 1) for o in arm_overrides(ARMS["dlc"], k8))
    assert dlc["resync.policy"] == "ess" and dlc["resync.max_interval"] == "8"
    fixed = dict(o.split("=", 1) for o in arm_overrides(ARMS["dlc_noresync"], k8))
    assert fixed["resync.policy"] == "every_k" and "resync.max_interval" not in fixed
    never = Scenario("lag_never", sync="never", kind="lag")
    assert not any("max_interval" in o for o in arm_overrides(ARMS["dlc"], never))


def test_no_arms_means_the_onpolicy_runs_only():
    assert {s.arm for s in run_specs(TINY, arms=[])} == {"onpolicy"}


def test_workers_train_at_the_same_time_and_errors_are_reported(tmp_path):
    exp = Experiment(TINY, tmp_path, workers=2)
    barrier = threading.Barrier(2, timeout=30)
    started = []

    def train(spec, cfg):  # the scheduling is under test, not the trainer
        started.append(spec.name)
        barrier.wait()  # passes only when two trainings run at once
        if spec.name == "b":
            raise RuntimeError("boom")

    exp.train = train  # type: ignore[method-assign]
    specs = [RunSpec("a", "x", "s", ()), RunSpec("b", "x", "s", ())]
    got = {s.name: e for s, e in exp._train_parallel(specs, {"a": None, "b": None})}
    assert got["a"] is None and isinstance(got["b"], RuntimeError)
    with pytest.raises(ValueError, match="--workers must be >= 1"):
        Experiment(TINY, tmp_path, workers=0)


def test_source_verdict_matches_the_measured_errors_to_the_kind():
    from dlc_jax.experiments.sources import source_verdict

    assert source_verdict("lag", [1e-6, 2e-6], [0.0, 0.3]) == "separated"
    assert source_verdict("lag", [0.05, 0.05], [0.0, 0.3]) == "NOT separated"  # a discrepancy too
    assert source_verdict("discrepancy", [0.05, 0.04], [0.0, 0.0]) == "separated"
    assert source_verdict("discrepancy", [0.05, 0.04], [0.0, 0.2]) == "NOT separated"
    assert source_verdict("both", [0.01, 0.01], [0.0, 0.2]) == "separated"
