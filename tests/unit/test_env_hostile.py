"""Hostile environments (issue 33 item 4), in training episodes (`EnvSampler`), evaluation
(`EnvEvaluator`) and the warm-up's demonstrations (`dlc_jax.env.demos`) alike: each case ends its
episode, counted under ``env/*``, or stops the run with a one-line error; never a hang past
``env.timeout_s`` plus a grace period, never an exception out of the runner, never a non-finite
reward."""

import json
import math
import os
import sys
import time

import pytest

from dlc_jax.bench.soak.env_cases import CASES, Base, Echo, InitFails
from dlc_jax.env import ChatDelta, EnvConfig, EnvSampler
from dlc_jax.env.demos import NoDemonstrationError, demonstrations
from dlc_jax.env.evaluate import EnvEvaluator
from dlc_jax.env.protocol import EnvConfigError, EnvError, load_env_factory, timed_call
from dlc_jax.errors import is_user_error
from dlc_jax.sampler.wire.types import SamplingParams

TIMEOUT = 0.5
GRACE = 5.0  # seconds past env.timeout_s per turn a case may take (CPU load)
ROW = {"prompt": "1+2=", "answer": "3"}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from dlc_jax.data.tokenize import load_tokenizer
    from dlc_jax.model.tiny import _write_tokenizer_files, generate_corpus, train_tokenizer

    d = tmp_path_factory.mktemp("tok")
    _write_tokenizer_files(train_tokenizer(generate_corpus(n_lines=1000), 400), d, 2048)
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    return load_tokenizer(str(d))


def _sampler(tok, factory, n=2, **kw):
    cfg = EnvConfig(fn="x:y", **{"max_turns": 3, "timeout_s": TIMEOUT, **kw})
    return EnvSampler(
        lambda: Echo(tok.eos_token_id),
        factory,
        ChatDelta(tok, tok.eos_token_id),
        cfg,
        row_fn=lambda s: dict(ROW),
        max_model_len=512,
    )


def _params():
    return SamplingParams(n=1, max_tokens=8, head_k=1)


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_environment_in_training_ends_its_episode(tok, case):
    factory, end = CASES[case]
    if factory is InitFails or case == "factory_returns_none":  # as load_env_factory wraps it
        factory = _wrapped(factory)
    runner = _sampler(tok, factory)
    t0 = time.monotonic()
    out = list(runner.generate([[9], [9]], _params(), slot_ids=[0, 1]))
    assert time.monotonic() - t0 < 3 * (TIMEOUT + GRACE)
    assert [r.finish_reason for r in out] == [end, end]
    assert all(math.isfinite(r.reward) for r in out)
    t = runner.totals()
    assert t["env/episodes"] == 2 and t[f"env/end_{end}"] == 2
    if end.startswith("env_"):
        assert t["env/errors"] == 2 and all(r.reward == 0.0 for r in out)
    if case == "10MB_message":
        assert t["env/truncated_answers"] >= 2
        assert all(r.episode["env_tokens"] <= 2 * 64 for r in out)


def _wrapped(obj):
    """``obj`` as `load_env_factory` calls it (a None result is an EnvError)."""
    mod = type(sys)("hostile_env_mod")
    mod.Env = obj
    sys.modules["hostile_env_mod"] = mod
    return load_env_factory("hostile_env_mod:Env")


def test_env_kwargs_the_class_rejects_stop_the_run_in_one_line():
    mod = type(sys)("hostile_kwargs_mod")
    mod.Env = Base
    sys.modules["hostile_kwargs_mod"] = mod
    with pytest.raises(EnvConfigError, match="env.kwargs") as e:
        load_env_factory("hostile_kwargs_mod:Env", {"difficulty": 3})
    assert is_user_error(e.value) and "\n" not in str(e.value)
    with pytest.raises(EnvConfigError, match="cannot import"):
        load_env_factory("no_such_module_zz:Env")


def test_a_thousand_episodes_of_a_one_percent_failing_environment(tok):
    class Flaky(Base):
        n = 0

        def __init__(self):
            Flaky.n += 1
            self.bad = Flaky.n % 100 == 0

        def step(self, completion):
            if self.bad:
                raise RuntimeError("flaky")
            return [], 1.0, True

    runner = _sampler(tok, Flaky)
    out = list(runner.generate([[9]] * 1000, _params(), slot_ids=list(range(1000))))
    assert len(out) == 1000
    t = runner.totals()
    assert t["env/episodes"] == 1000 and t["env/errors"] == 10 and t["env/end_done"] == 990
    assert sum(r.reward for r in out) == 990.0


@pytest.mark.parametrize("case", ["step_raises", "step_sleeps_forever", "reward_nan", "init_fails"])
def test_hostile_environment_in_evaluation_is_counted(tok, case):
    factory, _ = CASES[case]
    _wrapped(factory)
    ev = EnvEvaluator(
        EnvConfig(fn="hostile_env_mod:Env", max_turns=2, timeout_s=TIMEOUT),
        tok,
        [dict(ROW, row=i) for i in range(3)],
        max_model_len=512,
        correct_min=1.0,
    )
    m = ev.run(Echo(tok.eos_token_id), _params(), "eval-0")
    assert m["eval/env_errors"] == 3 and m["eval/accuracy"] == 0.0
    assert all(math.isfinite(v) for v in m.values())


@pytest.mark.parametrize(
    "case", ["reset_raises", "step_raises", "step_sleeps_forever", "step_os_exit", "init_fails"]
)
def test_hostile_environment_in_the_warmup_stops_in_one_line(tok, case):
    factory, _ = CASES[case]
    mod = type(sys)("hostile_demo_mod")
    mod.Env = factory
    sys.modules["hostile_demo_mod"] = mod
    cfg = EnvConfig(fn="hostile_demo_mod:Env", timeout_s=TIMEOUT)
    t0 = time.monotonic()
    with pytest.raises(NoDemonstrationError) as e:
        demonstrations(cfg, tok, [dict(ROW)] * 5)
    assert time.monotonic() - t0 < 5 * (TIMEOUT + GRACE)
    assert is_user_error(e.value) and "\n" not in str(e.value)


def test_warmup_leaves_out_and_counts_failing_demonstrations(tok):
    class Half(Base):
        n = 0

        def __init__(self):
            Half.n += 1
            self.bad = Half.n % 2 == 0

        def step(self, completion):
            if self.bad:
                raise RuntimeError("half")
            return [], 1.0, True

    mod = type(sys)("hostile_half_mod")
    mod.Env = Half
    sys.modules["hostile_half_mod"] = mod
    hists, counts = demonstrations(EnvConfig(fn="hostile_half_mod:Env"), tok, [dict(ROW)] * 6)
    assert len(hists) == 3 and counts["env/warmup_errors"] == 3


def test_os_exit_in_an_env_call_ends_the_call_but_a_forked_child_still_exits():
    """The guard turns os._exit inside an environment call into an EnvError, yet a process the
    environment forks (multiprocessing ends its children with os._exit) must really exit: before
    the guard looked at the pid, the child raised instead and ended with status 0, not 7."""

    def exits():
        os._exit(3)

    with pytest.raises(EnvError, match="os._exit"):
        timed_call(exits, (), 10.0)

    def forks():
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    assert timed_call(forks, (), 10.0) == 7
