"""Hostile reward plug-ins in real workers: values finite in float64 but not float32, huge values,
wrong return types, a wrong signature (the failure budget stops the run in one line), and children
a reward spawns (killed with its worker's process group)."""

import logging
import os
import sys
import textwrap
import time

import numpy as np
import pytest

from dlc_jax.data.reward_budget import RewardFailureError
from dlc_jax.data.reward_runner import RewardRunner
from dlc_jax.data.rewards import RewardConfig
from dlc_jax.errors import UserError

PLUGIN = textwrap.dedent("""
    import subprocess, sys
    import numpy as np

    def huge32(prompts, completions, answers, **kw):  # finite in float64, inf in float32
        return [1e39 if c == "x" else 1.0 for c in completions]

    def huge20(prompts, completions, answers, **kw):  # finite in float32, overflows its variance
        return [1e20 if c == "x" else 1.0 for c in completions]

    def as_str(prompts, completions, answers, **kw):
        return "1" * len(completions)

    def as_dict(prompts, completions, answers, **kw):
        return {i: 1.0 for i in range(len(completions))}

    def as_array(prompts, completions, answers, **kw):
        return np.full(len(completions), 0.5, np.float32)

    def as_2d(prompts, completions, answers, **kw):
        return np.ones((len(completions), 1))

    def no_kwargs(prompts, completions, answers):  # a wrong signature: ids= is always passed
        return [1.0] * len(completions)

    def dies(prompts, completions, answers, **kw):  # the worker process itself dies
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)

    def spawns(prompts, completions, answers, *, pidfile, **kw):
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        with open(pidfile, "a") as f:
            f.write(f"{p.pid}\\n")
        return [1.0] * len(completions)
""")


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    mod = f"rw_hostile_{time.monotonic_ns()}"
    (tmp_path / f"{mod}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield mod
    sys.modules.pop(mod, None)


def _score(r, comps):
    n = len(comps)
    return r.score(["p"] * n, comps, ["1"] * n, [f"{i}/0" for i in range(n)])


def test_float32_overflow_and_huge_rewards_score_zero_and_advantages_stay_finite(plugin, caplog):
    from dlc_jax.rl.advantages import group_advantages

    comps = ["x", "a", "b", "c"]
    with (
        caplog.at_level(logging.WARNING),
        RewardRunner(
            RewardConfig(workers=1, fns={"h32": f"{plugin}:huge32", "h20": f"{plugin}:huge20"})
        ) as r,
    ):
        total, m = _score(r, comps)
    assert np.isfinite(total).all()
    np.testing.assert_allclose(total, [0.0, 2.0, 2.0, 2.0])
    assert m["reward/errors"] == 2  # sample 0/0 of each reward
    assert "outside ±1e+15" in caplog.text and "ids [0/0]" in caplog.text
    adv = np.asarray(group_advantages(total.reshape(1, 4)))
    assert np.isfinite(adv).all() and np.abs(adv).max() > 0.5


def test_clip_range_clips_instead(plugin):
    cfg = RewardConfig(workers=1, fn=f"{plugin}:huge32", clip=[-5, 5])
    with RewardRunner(cfg) as r:
        total, m = _score(r, ["x", "a"])
    np.testing.assert_allclose(total, [5.0, 1.0])
    assert m["reward/errors"] == 0


@pytest.mark.parametrize(
    "fn, why",
    [
        ("as_str", "returned a str, expected a list of numbers"),
        ("as_dict", "returned a dict, expected a list of numbers"),
        ("as_2d", "expected a 1-D array of real numbers"),
    ],
)
def test_wrong_return_types_score_zero_with_the_reason(plugin, caplog, fn, why):
    with (
        caplog.at_level(logging.WARNING),
        RewardRunner(RewardConfig(workers=1, fn=f"{plugin}:{fn}")) as r,
    ):
        total, m = _score(r, ["a", "b"])
    np.testing.assert_allclose(total, [0.0, 0.0])
    assert m["reward/errors"] == 2 and why in caplog.text and "ids [0/0, 1/0]" in caplog.text


def test_a_1d_array_is_accepted(plugin):
    with RewardRunner(RewardConfig(workers=1, fn=f"{plugin}:as_array")) as r:
        total, m = _score(r, ["a", "b", "c"])
    np.testing.assert_allclose(total, [0.5] * 3)
    assert m["reward/errors"] == 0


def test_wrong_signature_stops_the_run_in_one_line_naming_the_function(plugin):
    cfg = RewardConfig(workers=1, fn=f"{plugin}:no_kwargs", window=3, max_failed_fraction=0.9)
    with RewardRunner(cfg) as r:
        for _ in range(2):  # a window not yet full: scored 0, the run goes on
            total, m = _score(r, ["a", "b"])
            assert m["reward/errors"] == 2
        with pytest.raises(RewardFailureError) as e:
            _score(r, ["a", "b"])
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg
    assert f"{plugin}:no_kwargs" in msg and "failed on 6 of 6 samples over the last 3" in msg
    assert "unexpected keyword argument 'ids'" in msg


def test_children_a_reward_spawns_die_with_the_runner(plugin, tmp_path):
    pidfile = tmp_path / "pids"
    cfg = RewardConfig(
        workers=1, fns={"s": {"fn": f"{plugin}:spawns", "kwargs": {"pidfile": str(pidfile)}}}
    )
    with RewardRunner(cfg) as r:
        _score(r, ["a"])
        pids = [int(x) for x in pidfile.read_text().split()]
        assert pids and all(_alive(p) for p in pids)
    deadline = time.time() + 10
    while any(_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its dead parent's reaper) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_a_worker_that_dies_is_reported_with_its_signal(plugin, caplog):
    with (
        caplog.at_level(logging.INFO),
        RewardRunner(
            RewardConfig(workers=1, fn=f"{plugin}:dies", timeout_s=20, sample_timeout_s=5)
        ) as r,
    ):
        total, m = _score(r, ["a"])
    np.testing.assert_allclose(total, [0.0])
    assert m["reward/errors"] == 1
    assert "worker died (killed by SIGKILL)" in caplog.text and "exit code None" not in caplog.text
