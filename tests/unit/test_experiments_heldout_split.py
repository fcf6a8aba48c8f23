"""The held-out split is disjoint from the training rows by construction, and its overlap is
counted into the report (issue 32: 11 of the `tiny` experiment's 64 held-out prompts were
training prompts)."""

from __future__ import annotations

import json

import pytest

from dlc_jax.data.chain_arith import ChainArithConfig, chain_example
from dlc_jax.experiments.heldout_split import (
    disjoint_heldout,
    overlap,
    read_overlap,
    training_prompts,
)

pytestmark = pytest.mark.unit

TASK = ChainArithConfig(min_terms=3, max_terms=5, digits=1, num_examples=2000)


def test_the_plain_held_out_stream_repeats_training_prompts():
    # what the experiment did before: the first 64 of another seed's stream
    train = {chain_example(TASK, 0, i)["prompt"] for i in range(TASK.num_examples)}
    plain = [chain_example(TASK, 987_654, i) for i in range(64)]
    assert overlap(plain, train) == 11


def test_disjoint_split_skips_training_prompts_and_keeps_the_stream_order():
    train = {chain_example(TASK, 0, i)["prompt"] for i in range(TASK.num_examples)}
    rows, skipped = disjoint_heldout(TASK, 987_654, 64, train)
    assert len(rows) == 64 and overlap(rows, train) == 0 and skipped >= 11
    stream = [chain_example(TASK, 987_654, i) for i in range(64 + skipped)]
    assert rows == [r for r in stream if r["prompt"] not in train]
    with pytest.raises(ValueError, match="outside the training rows"):
        disjoint_heldout(
            ChainArithConfig(2, 2, 1, 10), 1, 5, {f"{a}+{b}=" for a in range(10) for b in range(10)}
        )


def test_experiment_writes_the_disjoint_split_and_its_count(tmp_path):
    from dlc_jax.experiments.presets import TINY
    from dlc_jax.experiments.runner import Experiment
    from dlc_jax.experiments.warmup import data_file

    exp = Experiment(TINY, tmp_path / "exp", cache_dir=tmp_path / "cache")
    pcfg = exp.prefix_config()
    held = [json.loads(x) for x in open(pcfg.source).read().splitlines()]
    train = training_prompts(data_file(TINY.task, tmp_path / "cache"))
    assert len(held) == 64 and overlap(held, train) == 0
    assert read_overlap(tmp_path / "exp") == 0
    assert read_overlap(tmp_path / "missing") is None
