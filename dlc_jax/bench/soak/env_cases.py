"""The hostile environments (`CASES`) of the env soak and tests/unit/test_env_hostile.py: each a
factory and the end reason its episodes must have."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import numpy as np

from dlc_jax.sampler.wire.types import Rollout


class Base:
    def reset(self, row):
        return [{"role": "user", "content": "go"}]

    def step(self, completion):
        return [{"role": "user", "content": "again"}], 1.0, False

    def demonstration(self, row):
        return ["3"]


def _step(fn):
    return type("Env", (Base,), {"step": lambda self, c: fn()})


def _forever():
    while True:
        time.sleep(0.05)


class AsyncNeverAwaits(Base):
    async def step(self, completion):  # blocks its event loop: never yields to it
        _forever()


class AsyncWaitsForever(Base):
    async def step(self, completion):
        await asyncio.Event().wait()


class InitFails(Base):
    def __init__(self):
        raise ValueError("cannot connect")


def _raise(e):
    raise e


HUGE = "x" * 10_000_000
CASES = {
    # name: (environment factory, end reason of its episodes)
    "reset_raises": (type("E", (Base,), {"reset": lambda s, r: 1 / 0}), "env_error"),
    "step_raises": (_step(lambda: _raise(RuntimeError("boom"))), "env_error"),
    "step_sleeps_forever": (_step(_forever), "env_timeout"),
    "step_os_exit": (_step(lambda: os._exit(1)), "env_error"),
    "step_sys_exit": (_step(lambda: sys.exit(3)), "env_error"),
    "messages_not_a_list": (_step(lambda: ("hello", 1.0, False)), "env_error"),
    "unknown_role": (
        _step(lambda: ([{"role": "wizard", "content": "x"}], 1.0, False)),
        "env_error",
    ),
    "non_string_content": (
        _step(lambda: ([{"role": "user", "content": 7}], 1.0, False)),
        "env_error",
    ),
    "10MB_message": (_step(lambda: ([{"role": "tool", "content": HUGE}], 1.0, False)), "max_turns"),
    "reward_nan": (_step(lambda: ([], float("nan"), True)), "env_error"),
    "reward_inf": (_step(lambda: ([], float("inf"), True)), "env_error"),
    "reward_string": (_step(lambda: ([], "1.0", True)), "env_error"),
    "done_never_true": (Base, "max_turns"),
    "async_never_awaits": (AsyncNeverAwaits, "env_timeout"),
    "async_waits_forever": (AsyncWaitsForever, "env_timeout"),
    "init_fails": (InitFails, "env_error"),
    "factory_returns_none": (lambda: None, "env_error"),
}


class Echo:
    """A sampler that echoes the prompt and generates ``[5, eos]`` each turn."""

    address = "echo"

    def __init__(self, eos):
        self.eos = eos

    def generate(self, prompts, params, slot_ids=None, request_id=None):
        for p, s in zip(prompts, slot_ids):
            gen = [5, self.eos]
            yield Rollout(
                prompt_ids=np.asarray(p, np.int32),
                response_ids=np.asarray(gen, np.int32),
                logprobs=np.full(2, -0.5, np.float32),
                head_ids=np.zeros((2, 1), np.int32),
                head_logprobs=np.zeros((2, 1), np.float32),
                finish_reason="stop",
                version_spans=[(0, 0, 2)],
                slot_id=s,
            )
