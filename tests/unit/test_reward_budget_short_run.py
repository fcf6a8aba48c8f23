"""The reward-failure budget judges a run shorter than ``reward.window`` at its end (issue 33
item 3), on the counts of every process summed (`FailureBudget.short_run_counts` /
`judge_short_run`)."""

import numpy as np
import pytest

from dlc_jax.data.reward_budget import FailureBudget, RewardFailureError
from dlc_jax.errors import UserError

NAMES, FNS = ["acc", "fmt"], ["m:acc", "m:fmt"]


def test_a_short_run_whose_reward_always_failed_is_judged_at_its_end():
    b = FailureBudget(0.9, window=10)
    for _ in range(3):  # 3 batches < window: no verdict while running
        b.record("acc", "m:acc", 4, 4, "TypeError: boom")
        b.record("fmt", "m:fmt", 0, 4, None)
    counts = b.short_run_counts(NAMES)
    assert counts.tolist() == [[12, 12], [0, 12]]
    with pytest.raises(RewardFailureError) as e:
        b.judge_short_run(NAMES, FNS, counts)
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg
    assert "'acc' (m:acc) failed on 12 of 12 samples" in msg and "TypeError: boom" in msg


def test_the_verdict_is_on_every_process_counts_summed():
    """Process 0 scored only failures, process 1 only successes: summed, within budget; the
    same sum on every process gives the same verdict (nobody stops alone)."""
    p0, p1 = FailureBudget(0.9, 10), FailureBudget(0.9, 10)
    p0.record("acc", "m:acc", 4, 4, "boom")
    p1.record("acc", "m:acc", 0, 4, None)
    total = np.stack([p.short_run_counts(["acc"]) for p in (p0, p1)]).sum(0)
    for p in (p0, p1):
        p.judge_short_run(["acc"], ["m:acc"], total)  # 4 of 8 failed: no stop
    p0.record("acc", "m:acc", 4, 4, "boom")
    p1b = FailureBudget(0.9, 10)
    p1b.record("acc", "m:acc", 4, 4, "boom")
    total = np.stack([p.short_run_counts(["acc"]) for p in (p0, p1b)]).sum(0)
    for p in (p0, p1b):  # every process raises, p1b without a local error too
        with pytest.raises(RewardFailureError):
            p.judge_short_run(["acc"], ["m:acc"], total)


def test_a_full_window_was_judged_already_and_the_check_can_be_off():
    b = FailureBudget(0.9, window=2)
    b.record("acc", "m:acc", 0, 4, None)
    b.record("acc", "m:acc", 0, 4, None)
    assert b.short_run_counts(["acc"]).tolist() == [[0, 0]]
    off = FailureBudget(1.0, window=10)
    off.record("acc", "m:acc", 4, 4, "boom")
    off.judge_short_run(["acc"], ["m:acc"], off.short_run_counts(["acc"]))
