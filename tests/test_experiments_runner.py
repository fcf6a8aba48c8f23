"""The experiment matrix and its configs (no training here)."""

import json

import pytest

from dlc_jax.experiments.presets import PRESETS, TINY
from dlc_jax.experiments.runner import Experiment, normalize_metrics, read_metrics, run_specs


def test_matrix_is_onpolicy_pair_then_scenario_by_arm():
    specs = run_specs(TINY)
    assert [s.name for s in specs[:2]] == ["onpolicy_seed1", "onpolicy_seed2"]
    assert len(specs) == 2 + len(TINY.arms) * len(TINY.scenarios)
    assert {s.scenario for s in specs[2:]} == {s.name for s in TINY.scenarios}
    sub = run_specs(TINY, arms=["tis", "dlc"], scenarios=["stale_never"])
    assert [s.name for s in sub] == ["onpolicy_seed1", "onpolicy_seed2", "stale_never__tis", "stale_never__dlc"]
    with pytest.raises(ValueError, match="unknown arms"):
        run_specs(TINY, arms=["nope"])
    with pytest.raises(KeyError, match="no scenario"):
        run_specs(TINY, scenarios=["nope"])


def test_run_configs_differ_only_where_the_arm_and_scenario_say(tmp_path):
    exp = Experiment(TINY, tmp_path)
    by = {s.name: exp.run_config(s, "/some/model") for s in exp.specs}
    o1, o2 = by["onpolicy_seed1"], by["onpolicy_seed2"]
    assert o1.resync.policy == "onpolicy" and o1.train.seed != o2.train.seed
    assert o1.model.path == "/some/model" and not o1.sft.enabled  # one initial model for every run
    tis = by["stale_k4__tis"]
    assert (tis.loss.name, tis.resync.policy, tis.resync.k) == ("tis", "every_k", 4)
    assert tis.data == o1.data and tis.optim == o1.optim and tis.train.steps == o1.train.steps
    assert tis.train.seed == o1.train.seed  # arms sample with the first on-policy seed
    assert by["stale_never__tis"].resync.policy == "never"
    assert by["quant_int8__naive"].sampler.quantization == "int8"
    assert by["noise__naive"].sampler.weight_noise > 0
    # DLC brings its own ESS trigger; DLC without resync follows the scenario's schedule
    assert by["stale_k4__dlc"].resync.policy == by["stale_never__dlc"].resync.policy == "ess"
    assert by["stale_never__dlc_noresync"].resync.policy == "never"
    # ... so DLC is trained once for both stale scenarios
    ident = exp.training_identity
    assert ident(by["stale_k4__dlc"]) == ident(by["stale_never__dlc"])
    assert ident(by["stale_k4__tis"]) != ident(by["stale_never__tis"])
    assert by["stale_k4__tis"].checkpoint.dir != by["stale_never__tis"].checkpoint.dir
    assert by["stale_k4__tis"].checkpoint.every == TINY.checkpoint_every
    assert by["stale_k4__tis"].checkpoint.keep >= TINY.steps // TINY.checkpoint_every
    assert exp.checkpoint_steps() == list(range(TINY.checkpoint_every, TINY.steps + 1, TINY.checkpoint_every))


def test_metrics_are_normalized_and_duplicates_keep_the_last(tmp_path):
    p = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "ess_lag": 0.9, "reward_mean": 0.1, "kl_k3": 0.01, "ell_std": 0.2},
            {"step": 2, "ess_lag": 0.5, "reward_mean": 0.2, "kl_k3": 0.02, "ell_std": 0.3},
            {"step": 2, "ess_lag": 0.4, "reward_mean": 0.3, "kl_k3": 0.03, "ell_std": 0.4}]
    p.write_text("\n".join(json.dumps(r) for r in rows))
    steps, series = normalize_metrics(read_metrics(p))
    assert steps == [1, 2]
    assert series["ess_lag"] == [0.9, 0.4] and series["reward"] == [0.1, 0.3] and series["mismatch_k3"] == [0.01, 0.03]
    assert "delta_std" not in series  # not logged -> absent, not invented
    with pytest.raises(FileNotFoundError, match="no metrics"):
        read_metrics(tmp_path / "missing.jsonl")


def test_presets_are_consistent():
    for p in PRESETS.values():
        assert len(set(p.arms)) == len(p.arms)
        assert p.steps % p.checkpoint_every == 0
    assert set(PRESETS["qwen3_0p6b"].arms) == {"naive", "tis", "mis", "score_centering", "score_centering_tis",
                                               "ppo_clip", "decoupled_ppo", "m2po", "vcpo", "dlc", "dlc_noresync"}
