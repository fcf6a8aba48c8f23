"""The experiment matrix and its configs (no training here)."""

import json

import pytest

from dlc_jax.experiments.matrix import run_specs
from dlc_jax.experiments.presets import PRESETS, TINY
from dlc_jax.experiments.run_outputs import normalize_metrics, read_metrics
from dlc_jax.experiments.runner import Experiment


def test_matrix_is_onpolicy_runs_then_seed_major_scenario_by_arm():
    specs = run_specs(TINY)
    n_on = len(TINY.onpolicy_seeds)
    assert n_on >= 3 and len(TINY.seeds) >= 3  # noise threshold over >= 3 pairs, >= 3 seeds per arm
    assert [s.name for s in specs[:n_on]] == [f"onpolicy__s{s}" for s in TINY.onpolicy_seeds]
    assert len(specs) == n_on + len(TINY.arms) * len(TINY.scenarios) * len(TINY.seeds)
    assert [s.seed for s in specs[n_on:]] == sorted(s.seed for s in specs[n_on:])  # seed-major
    assert set(TINY.arms) == {
        "naive",
        "tis",
        "mis",
        "ppo_clip",
        "decoupled_ppo",
        "dlc",
        "dlc_noresync",
    }
    sub = run_specs(TINY, arms=["tis", "dlc"], scenarios=["collapse"], seeds=[5])
    assert [s.name for s in sub[n_on:]] == ["collapse__tis__s5", "collapse__dlc__s5"]
    with pytest.raises(ValueError, match="unknown arms"):
        run_specs(TINY, arms=["nope"])
    with pytest.raises(KeyError, match="no scenario"):
        run_specs(TINY, scenarios=["nope"])


def test_run_configs_differ_only_where_the_arm_scenario_and_seed_say(tmp_path):
    exp = Experiment(TINY, tmp_path)
    by = {s.name: exp.run_config(s, "/some/model") for s in exp.specs}
    o0, o1 = by["onpolicy__s0"], by["onpolicy__s1"]
    assert o0.resync.policy == "onpolicy" and (o0.train.seed, o1.train.seed) == (0, 1)
    assert o0.model.path == "/some/model" and not o0.sft.enabled  # one initial model for every run
    assert o0.data.source.endswith(".jsonl") and "chain_arith" in o0.data.source  # the chain task
    assert o0.sampler.max_tokens >= 32
    tis = by["collapse__tis__s1"]
    assert (tis.loss.name, tis.resync.policy, tis.sampler.quantization) == ("tis", "never", "int8")
    assert tis.data == o0.data and tis.optim == o0.optim and tis.train.steps == o0.train.steps
    assert tis.train.seed == 1
    assert by["collapse__ppo_clip__s0"].loss.old_policy == "sampler"
    # DLC brings its own ESS trigger; DLC without resync follows the scenario's schedule
    assert by["collapse__dlc__s0"].resync.policy == "ess"
    assert by["collapse__dlc_noresync__s0"].resync.policy == "never"
    ident = exp.training_identity
    assert ident(by["collapse__tis__s0"]) != ident(by["collapse__tis__s1"])
    assert by["collapse__tis__s0"].checkpoint.every == TINY.checkpoint_every
    assert by["collapse__tis__s0"].checkpoint.keep >= TINY.steps // TINY.checkpoint_every
    assert exp.checkpoint_steps() == list(
        range(TINY.checkpoint_every, TINY.steps + 1, TINY.checkpoint_every)
    )
    # an arm run is compared with the on-policy runs of the *other* seeds, like an on-policy pair
    spec = {s.name: s for s in exp.specs}
    assert exp.refs_for(spec["collapse__tis__s1"]) == ["onpolicy__s0", "onpolicy__s2"]
    assert exp.refs_for(spec["onpolicy__s0"]) == ["onpolicy__s1", "onpolicy__s2"]
    assert exp.wants_own_prefixes(spec["collapse__tis__s1"]) and exp.wants_own_prefixes(
        spec["onpolicy__s0"]
    )


def test_metrics_are_normalized_and_duplicates_keep_the_last(tmp_path):
    p = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 1, "ess_lag": 0.9, "reward_mean": 0.1, "kl_k3": 0.01, "ell_std": 0.2},
        {"step": 2, "ess_lag": 0.5, "reward_mean": 0.2, "kl_k3": 0.02, "ell_std": 0.3},
        {"step": 2, "ess_lag": 0.4, "reward_mean": 0.3, "kl_k3": 0.03, "ell_std": 0.4},
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows))
    steps, series = normalize_metrics(read_metrics(p))
    assert steps == [1, 2]
    assert (
        series["ess_lag"] == [0.9, 0.4]
        and series["reward"] == [0.1, 0.3]
        and series["mismatch_k3"] == [0.01, 0.03]
    )
    assert "delta_std" not in series  # not logged -> absent, not invented
    with pytest.raises(FileNotFoundError, match="no metrics"):
        read_metrics(tmp_path / "missing.jsonl")


def test_presets_are_consistent():
    for p in PRESETS.values():
        assert len(set(p.arms)) == len(p.arms)
        assert p.steps % p.checkpoint_every == 0
        assert len(set(p.onpolicy_seeds)) >= 2
    assert set(PRESETS["qwen3_0p6b"].arms) == set(TINY.arms)


def test_gpu_smoke_preset_and_warmup_overrides():
    from dlc_jax.experiments.cli import with_warmup

    p = PRESETS["qwen3_0p6b_smoke"]
    dims = dict(p.task.model_dims)
    assert (dims["hidden_size"], dims["num_hidden_layers"], dims["head_dim"]) == (1024, 4, 128)
    assert p.arms == ("tis", "dlc") and len(p.onpolicy_seeds) == 2
    assert "sampler.backend=jax" in p.overrides
    small = with_warmup(p, ["steps=5", "dims.num_hidden_layers=1", "dims.tie_word_embeddings=0"])
    d = dict(small.task.model_dims)
    assert small.task.steps == 5 and d["num_hidden_layers"] == 1 and d["tie_word_embeddings"] == 0
    assert d["hidden_size"] == 1024
    assert small.task.key() != p.task.key()  # a different warm-up cache
    assert with_warmup(TINY, []).task.key() == TINY.task.key()  # no override, same cached warm-up
    with pytest.raises(SystemExit, match="unknown key"):
        with_warmup(p, ["nope=1"])
    with pytest.raises(SystemExit, match="no chain warm-up"):
        with_warmup(PRESETS["qwen3_0p6b"], ["steps=1"])
