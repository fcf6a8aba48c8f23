"""Held-out accuracy of a policy from its own parameters: greedy answers checked against an
independent argmax decode, seeded (paired) sampling, the per-prompt scores."""

import numpy as np
import pytest

from dlc_jax.experiments.heldout import HeldoutConfig, heldout_score, score_answers


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from model_helpers import make_random_hf_dir

    from dlc_jax.model import load_hf

    d = make_random_hf_dir(
        tmp_path_factory.mktemp("m"),
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        noise=0.5,
    )
    return load_hf(str(d))


def _first_greedy_token(model, prompt):
    return int(np.argmax(np.asarray(model(np.asarray([prompt], np.int32)))[0, -1]))


def _decode(ids):  # "the answer" is the first response token
    return f"#### {ids[0] if ids else -1}"


PROMPTS = [np.array([5 + i, 9, 14 + i], np.int32) for i in range(6)]


def test_score_answers_is_the_training_reward():
    got = score_answers(["3+5=8 #### 8", "#### 7", "no number"], ["#### 8", "8", "8"])
    assert got.tolist() == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="2 responses for 1"):
        score_answers(["a", "b"], ["1"])


def test_greedy_accuracy_matches_an_independent_argmax_decode(model):
    truth = [_first_greedy_token(model, p) for p in PROMPTS]
    cfg = HeldoutConfig(prompts=6, samples=3, max_tokens=2)
    right = heldout_score(
        model, PROMPTS, [str(t) for t in truth], _decode, eos_id=-1, cfg=cfg, step=5
    )
    assert right.greedy == 1.0 and right.greedy_correct == [1] * 6
    half = [str(t) if i % 2 else str(t + 1) for i, t in enumerate(truth)]
    wrong = heldout_score(model, PROMPTS, half, _decode, eos_id=-1, cfg=cfg, step=5)
    assert wrong.greedy_correct == [0, 1, 0, 1, 0, 1] and wrong.greedy == 0.5
    # sampled: `samples` answers per prompt, per-prompt means in steps of 1/samples
    assert len(right.sampled_correct) == 6
    assert all(abs(x * 3 - round(x * 3)) < 1e-9 for x in right.sampled_correct)
    assert right.sampled == pytest.approx(np.mean(right.sampled_correct))


def test_sampling_is_paired_by_step_not_by_call(model):
    answers = [str(_first_greedy_token(model, p)) for p in PROMPTS]
    cfg = HeldoutConfig(prompts=4, samples=8, max_tokens=2, temperature=3.0)
    a = heldout_score(model, PROMPTS, answers, _decode, eos_id=-1, cfg=cfg, step=10)
    b = heldout_score(model, PROMPTS, answers, _decode, eos_id=-1, cfg=cfg, step=10)
    c = heldout_score(model, PROMPTS, answers, _decode, eos_id=-1, cfg=cfg, step=11)
    assert a == b  # the same step draws the same random numbers: runs compare paired
    assert a.sampled_correct != c.sampled_correct  # another step draws others
    assert len(a.greedy_correct) == 4  # the first `prompts` prompts only


def test_config_is_validated():
    with pytest.raises(ValueError, match="heldout: prompts"):
        HeldoutConfig(prompts=0)
    with pytest.raises(ValueError, match="heldout.temperature"):
        HeldoutConfig(temperature=0.0)
