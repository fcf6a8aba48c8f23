"""Evaluation and sample completions in a tiny run against the in-process JAX sampler:
eval/* in the metrics rows at eval.every, greedy evaluation deterministic at fixed sampler weights,
samples.jsonl with the per-token delta/ell summary (ell exactly 0 at the sampler's own weights)."""

import json

import pytest

from dlc_jax.trainer.config import default_config_path, load_config

pytestmark = pytest.mark.slow


def test_eval_and_samples_in_a_tiny_run(tiny_dir, tmp_path):
    from dlc_jax.trainer.build import build_trainer
    from dlc_jax.trainer.hooks import Hook

    tiny = tiny_dir
    cfg = load_config(
        default_config_path(),
        [
            f"model.path={tiny}",
            "sampler.backend=inprocess",
            "sampler.n=4",
            "sampler.max_tokens=4",
            "sampler.head_k=4",
            "train.batch_prompts=4",
            "train.steps=4",
            "resync.policy=never",  # the sampler keeps theta_0: greedy eval is the same each time
            "log.progress=false",
            f"log.dir={tmp_path}/logs",
            f"checkpoint.dir={tmp_path}/ckpt",
            "checkpoint.every=0",
            # a 0/1 format reward (response contains an "e"): accuracy == mean reward
            "reward.correct=0",
            "reward.format_bonus=1",
            "reward.strict_format=(?s).*e.*",
            "eval.every=2",
            "eval.source=arithmetic",
            "eval.n=6",
            "eval.temperature=0",
            "log.samples_every=1",
            "log.samples_n=3",
        ],
    )
    assert cfg.sft.enabled is False  # a model.path of our own: no arithmetic warm-up
    seen = []  # a hook of the caller's: runs after the trainer's own (eval, metrics, checkpoint)
    probe = Hook("probe", 2, lambda info: seen.append((info.step, sorted(info.row))))
    t = build_trainer(cfg, hooks=[probe])
    assert t.hooks.names() == ["eval", "metrics", "checkpoint", "probe"]
    assert len(t.evaluator.examples) == 6
    s = t.run()
    assert s["finished"] and s["model"] == str(tiny) and "sft" not in s
    rows = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert [st for st, _ in seen] == [2, 4] and all("eval/accuracy" in keys for _, keys in seen)
    for r in evals:
        assert r["eval/accuracy"] == pytest.approx(r["eval/reward_mean"])
        assert round(r["eval/accuracy"] * 6, 6) == int(round(r["eval/accuracy"] * 6))
        assert 1 <= r["eval/response_len"] <= 4 and r["eval/version"] == 0
    assert evals[0]["eval/accuracy"] == evals[1]["eval/accuracy"]
    assert evals[0]["eval/response_len"] == evals[1]["eval/response_len"]
    samples = [
        json.loads(x) for x in (tmp_path / "logs" / "samples.jsonl").read_text().splitlines()
    ]
    assert [x["step"] for x in samples] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    first = [x for x in samples if x["step"] == 1]
    assert len({x["slot"] for x in first}) == 3  # one sample of each of 3 prompts
    for x in first:
        assert x["reward"] == (1.0 if "e" in x["response"] else 0.0)
        assert x["ell_mean"] == 0.0 and x["ell_abs_max"] == 0.0  # trainer still at theta_0
        assert abs(x["delta_mean"]) < 1e-3 and x["tokens"] >= 1 and x["prompt"]
    later = [x for x in samples if x["step"] == 4]
    assert any(x["ell_abs_max"] > 0 for x in later)  # the trainer moved, the sampler did not
    assert s["reward_mean"]["first_10pct"] == rows[0]["reward_mean"]
