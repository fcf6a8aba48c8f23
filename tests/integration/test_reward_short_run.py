"""A reward failing on every sample in a run shorter than ``reward.window`` (issue 33 item 3):
the run ends with the one-line `RewardFailureError` instead of training on zeros and exiting 0."""

import textwrap

import pytest

from dlc_jax.data.reward_budget import RewardFailureError
from dlc_jax.trainer.config import default_config_path, load_config

pytestmark = pytest.mark.slow

PLUGIN = textwrap.dedent("""
    def no_kwargs(prompts, completions, answers):  # a wrong signature: fails on every call
        return [1.0] * len(completions)
""")


def test_a_short_run_of_an_always_failing_reward_stops_in_one_line(tiny_dir, tmp_path, monkeypatch):
    from dlc_jax.trainer.build import build_trainer

    (tmp_path / "short_rewards.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(
        default_config_path(),
        [
            f"model.path={tiny_dir}",
            "sft.enabled=false",
            "sampler.backend=inprocess",
            "sampler.n=2",
            "sampler.max_tokens=2",
            "sampler.head_k=2",
            "sampler.max_model_len=64",
            "train.batch_prompts=2",
            "train.steps=2",  # < reward.window (10)
            "log.progress=false",
            "log.tensorboard=false",
            f"log.dir={tmp_path}/logs",
            f"checkpoint.dir={tmp_path}/ckpt",
            "checkpoint.every=0",
            "reward.fn=short_rewards:no_kwargs",
            "reward.workers=1",
        ],
    )
    t = build_trainer(cfg)
    with pytest.raises(RewardFailureError) as e:
        t.run()
    msg = str(e.value)
    assert "\n" not in msg and "failed on 8 of 8 samples of a run shorter than" in msg
    assert "short_rewards:no_kwargs" in msg
