"""RewardRunner: plug-ins from a module the test writes, weighted sums, metadata, and a raising and
a hanging plug-in (logged with sample ids, scored 0, the runner keeps going), in real workers."""

import logging
import sys
import textwrap
import time

import numpy as np
import pytest

from dlc_jax.data.reward_runner import RewardError, RewardRunner
from dlc_jax.data.rewards import MATH_VERIFY, RewardConfig

PLUGIN = textwrap.dedent("""
    import os, time

    def length(prompts, completions, answers, **metadata):
        return [float(len(c)) for c in completions]

    def echo_meta(prompts, completions, answers, *, ids, level, bonus=0.0, **metadata):
        # a plug-in may use the sample ids, extra dataset columns and its own kwargs
        return [float(lv) + bonus + (0.5 if i.endswith("/1") else 0.0) for i, lv in zip(ids, level)]

    def raises_on_boom(prompts, completions, answers, **metadata):
        if any("boom" in c for c in completions):
            raise ValueError("boom")
        return [1.0] * len(completions)

    def hangs_on_hang(prompts, completions, answers, **metadata):
        if any("hang" in c for c in completions):
            time.sleep(3600)
        return [2.0] * len(completions)

    def wrong_length(prompts, completions, answers, **metadata):
        return [1.0]

    def pid(prompts, completions, answers, **metadata):
        return [float(os.getpid())] * len(completions)

    def check_positive(answer):
        return None if float(answer) > 0 else f"gold answer {answer!r} must be positive"

    length.check_answer = check_positive
""")


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    mod = f"rw_plugin_{time.monotonic_ns()}"
    (tmp_path / f"{mod}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))  # the workers get this process's sys.path
    yield mod
    sys.modules.pop(mod, None)


def _ids(n):
    return [f"{i // 2}/{i % 2}" for i in range(n)]  # slot/sample


def test_weighted_plugins_metadata_and_builtin(plugin):
    cfg = RewardConfig(
        workers=2,
        fns={
            "len": {"fn": f"{plugin}:length", "weight": 0.5},
            "meta": {"fn": f"{plugin}:echo_meta", "weight": 1.0, "kwargs": {"bonus": 10.0}},
            "acc": MATH_VERIFY,
        },
    )
    comps = ["ab", "\\boxed{0.5}", "xyz", "\\boxed{2^{10}}", "1", "22"]
    golds = ["1/2", "1/2", "3", "1024", "1", "2"]
    with RewardRunner(cfg) as r:
        total, m = r.score(["p"] * 6, comps, golds, _ids(6), metadata={"level": [1, 2, 3, 4, 5, 6]})
        acc = np.array([0, 1, 0, 1, 1, 0], float)
        meta = np.array([1, 2, 3, 4, 5, 6], float) + 10 + np.array([0, 0.5] * 3)
        expect = 0.5 * np.array([len(c) for c in comps]) + meta + acc
        np.testing.assert_allclose(total, expect, rtol=1e-6)
        assert total.dtype == np.float32
        assert (
            m["reward/acc"] == pytest.approx(0.5)
            and m["reward/errors"] == 0
            and m["reward/timeouts"] == 0
        )
        # gold checks run each reward's check_answer in the workers
        assert r.check_answers(["3", "-1", "2"]) == [
            None,
            "gold answer '-1' must be positive (reward len)",
            None,
        ]


def test_raising_and_hanging_plugins_score_zero_with_ids_and_run_goes_on(plugin, caplog):
    cfg = RewardConfig(
        workers=2,
        timeout_s=4.0,
        sample_timeout_s=1.0,
        fns={
            "ok": f"{plugin}:raises_on_boom",
            "slow": {"fn": f"{plugin}:hangs_on_hang", "weight": 10.0},
        },
    )
    comps = ["a", "boom", "b", "hang", "c", "d"]
    with caplog.at_level(logging.INFO, logger="dlc_jax.data.reward_runner"), RewardRunner(cfg) as r:
        pids_before = [w.proc.pid for w in r._workers]
        t0 = time.time()
        total, m = r.score(["p"] * 6, comps, ["1"] * 6, _ids(6))
        took = time.time() - t0
        # boom: raises_on_boom fails only sample 0/1; hang: hangs_on_hang times out only sample 1/1
        np.testing.assert_allclose(total, [21, 20, 21, 1, 21, 21])
        assert m["reward/errors"] == 1 and m["reward/timeouts"] == 1
        assert took < 4.0 + 4.0 + 3.0  # chunk timeout + the one-by-one budget (+ a worker respawn)
        text = caplog.text
        assert (
            "reward 'ok'" in text
            and "failed on sample ids [0/1]" in text
            and "ValueError: boom" in text
        )
        assert "reward 'slow'" in text and "timed out on sample ids [1/1]" in text
        # the hung worker was killed and replaced; the next batch scores normally
        total2, m2 = r.score(["p"] * 4, ["a", "b", "c", "d"], ["1"] * 4, _ids(4))
        np.testing.assert_allclose(total2, [21] * 4)
        assert m2["reward/errors"] == 0 and m2["reward/timeouts"] == 0
        assert [w.proc.pid for w in r._workers] != pids_before
        assert r.totals == {"errors": 1, "timeouts": 1}
        empty, m0 = r.score([], [], [], [])
        assert empty.shape == (0,) and set(m0) == set(m2)  # same metric names with no samples


def test_bad_return_is_a_failure_not_a_crash(plugin, caplog):
    with (
        caplog.at_level(logging.INFO),
        RewardRunner(RewardConfig(workers=1, fn=f"{plugin}:wrong_length")) as r,
    ):
        total, m = r.score(["p"] * 3, ["a", "b", "c"], ["1"] * 3, _ids(3))
    # the batch call returns 1 value for 3 samples; one by one it returns the right count
    np.testing.assert_allclose(total, [1, 1, 1])
    assert m["reward/errors"] == 0 and "returned 1 values for 3 samples" in caplog.text


def test_rewards_run_in_other_processes(plugin):
    import os

    with RewardRunner(RewardConfig(workers=2, fn=f"{plugin}:pid")) as r:
        total, _ = r.score(["p"] * 4, ["a"] * 4, ["1"] * 4, _ids(4))
        pids = set(total.astype(int).tolist())
        procs = [w.proc for w in r._workers]
    assert os.getpid() not in pids and len(pids) == 2  # one chunk per worker
    assert all(p.poll() is not None for p in procs)  # closed: no worker left behind
    r = RewardRunner(RewardConfig(workers=1))
    procs = [w.proc for w in r._workers]
    del r  # garbage-collected without close(): its workers still stop
    import gc

    gc.collect()
    assert all(p.wait(timeout=10) is not None for p in procs)


def test_setup_errors_are_one_line(plugin):
    with pytest.raises(RewardError, match=f"reward module '{plugin}' has no function 'missing'"):
        RewardRunner(RewardConfig(workers=1, fn=f"{plugin}:missing"))
    with pytest.raises(RewardError, match="cannot import reward module 'no_such_reward_mod'"):
        RewardRunner(RewardConfig(workers=1, fn="no_such_reward_mod:f"))
    with RewardRunner(RewardConfig(workers=1)) as r:
        with pytest.raises(ValueError, match="lengths differ"):
            r.score(["p"], ["a", "b"], ["1", "1"], ["0", "1"])


def test_plugin_in_the_working_directory(tmp_path, monkeypatch):
    """`dlc-jax train reward.fn=my_rewards:f` run next to my_rewards.py (the console script's
    sys.path does not have the working directory)."""
    mod = f"rw_cwd_{time.monotonic_ns()}"
    (tmp_path / f"{mod}.py").write_text(PLUGIN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    with RewardRunner(RewardConfig(workers=1, fn=f"{mod}:length")) as r:
        total, _ = r.score(["p"], ["abc"], ["1"], ["0/0"])
    assert total.tolist() == [3.0]
