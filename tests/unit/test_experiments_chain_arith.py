"""The chain-arithmetic task: worked answers, determinism, reward on the final number, JSONL
file."""

import json

import pytest

from dlc_jax.data.chain_arith import (
    ChainArithConfig,
    ChainArithSource,
    WorkedTargets,
    worked_answer,
    write_jsonl,
)
from dlc_jax.data.rewards import exact_match_reward


def test_worked_answer_is_a_chain_of_partial_sums():
    assert worked_answer([3, 5, 2, 7]) == "3+5=8,8+2=10,10+7=17 #### 17"
    with pytest.raises(ValueError, match="at least 2"):
        worked_answer([4])


def test_examples_are_deterministic_and_consistent():
    cfg = ChainArithConfig(min_terms=3, max_terms=5, num_examples=50)
    src = ChainArithSource(cfg, seed=1)
    assert len(src) == 50 and src[7] == ChainArithSource(cfg, seed=1)[7]
    assert any(src[i] != ChainArithSource(cfg, seed=2)[i] for i in range(5))
    for i in range(50):
        ex = src[i]
        terms = [int(t) for t in ex["prompt"].rstrip("=").split("+")]
        assert 3 <= len(terms) <= 5 and all(0 <= t < 10 for t in terms)
        assert ex["answer"] == str(sum(terms)) and ex["worked"] == worked_answer(terms)
        # the worked answer earns the reward; a chain with a wrong total does not
        assert exact_match_reward(ex["worked"], ex["answer"]) == 1.0
        assert (
            exact_match_reward(ex["worked"].rsplit(" ", 1)[0] + f" {sum(terms) + 1}", ex["answer"])
            == 0.0
        )
    assert WorkedTargets(src)[3] == {"prompt": src[3]["prompt"], "answer": src[3]["worked"]}
    with pytest.raises(IndexError):
        src[50]
    with pytest.raises(ValueError, match="min_terms"):
        ChainArithConfig(min_terms=1)


def test_jsonl_is_a_trainer_data_source(tmp_path):
    from dlc_jax.data.prompts import DataConfig, load_records

    src = ChainArithSource(ChainArithConfig(num_examples=20), seed=0)
    p = write_jsonl(src, tmp_path / "d" / "chain.jsonl")
    rows = [json.loads(line) for line in p.read_text().splitlines()]
    assert rows == [src[i] for i in range(20)]
    recs = load_records(DataConfig(source=str(p)))
    assert recs[4]["prompt"] == src[4]["prompt"] and recs[4]["answer"] == src[4]["answer"]
