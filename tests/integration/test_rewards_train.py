"""Bring your own data and reward, end to end: the trainer on a 20-row GSM8K-style data set saved
with ``datasets``, the tokenizer's chat template, a plug-in reward from a module the test writes
plus math_verify (weighted), against the in-process JAX sampler."""

import json
import textwrap

import pytest

from dlc_jax.trainer.config import default_config_path, load_config

pytestmark = pytest.mark.slow
datasets = pytest.importorskip("datasets")

PLUGIN = textwrap.dedent("""
    def has_digit(prompts, completions, answers, *, ids, level, **metadata):
        # the untrained tiny model rarely answers right: a format reward gives groups variance
        assert all(isinstance(x, int) for x in level) and len(ids) == len(completions)
        return [1.0 if any(ch.isdigit() for ch in c) else 0.0 for c in completions]
""")


def test_train_on_hf_dataset_with_plugin_and_math_verify(tiny_dir, tmp_path, monkeypatch):
    from dlc_jax.trainer.build import build_trainer

    tiny = tiny_dir
    rows = {
        "question": [f"What is {i} + {i + 2}?" for i in range(20)],
        "answer": [f"{i} + {i + 2} = {2 * i + 2}\n#### {2 * i + 2}" for i in range(20)],
        "level": list(range(20)),
    }
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "gsm8k_like"))
    (tmp_path / "my_rewards.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(
        default_config_path(),
        [
            f"model.path={tiny}",
            "sft.enabled=false",
            "sampler.backend=inprocess",
            "sampler.n=4",
            "sampler.max_tokens=4",
            "sampler.head_k=4",
            "sampler.max_model_len=64",
            "train.batch_prompts=4",
            "train.steps=2",
            "log.progress=false",
            "log.tensorboard=false",
            f"log.dir={tmp_path}/logs",
            f"checkpoint.dir={tmp_path}/ckpt",
            "checkpoint.every=0",
            f"data.source=hf:{tmp_path / 'gsm8k_like'}",
            "data.prompt_field=question",
            "data.answer_format=gsm8k",
            "data.chat_template=true",
            "data.system=Answer with a number.",
            "reward.fns.fmt.fn=my_rewards:has_digit",
            "reward.fns.fmt.weight=0.5",
            "reward.fns.acc.fn=dlc_jax.data.rewards:math_verify",
            "reward.fns.acc.weight=2.0",
            "reward.workers=1",
        ],
    )
    t = build_trainer(cfg)
    assert t.data.stats.used == 20 and t.data.stats.too_long == 0
    s = t.run()
    assert s["finished"]
    out = [
        json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in out] == [1, 2]
    for r in out:
        # the logged reward is the weighted sum of the plug-in rewards, each logged on its own
        assert r["reward_mean"] == pytest.approx(
            0.5 * r["reward/fmt"] + 2.0 * r["reward/acc"], abs=1e-6
        )
        assert 0.0 <= r["reward/fmt"] <= 1.0 and 0.0 <= r["reward/acc"] <= 1.0
        assert r["reward/errors"] == 0 and r["reward/timeouts"] == 0
    assert all(w.proc.poll() is not None for w in t.rewards._workers) or not t.rewards._workers
