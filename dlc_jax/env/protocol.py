"""What an environment is, and how ``env.fn`` names one: a class (or factory) called with no
arguments per episode, with ``reset(row) -> messages`` and ``step(completion) -> (messages,
reward, done)``, either may be ``async``; optional: ``tools`` (function schemas), ``close()``."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import math
import os
import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from dlc_jax.errors import UserError

ROLES = ("user", "tool", "system")  # roles an environment may answer with (never "assistant")
OPENING_ROLES = ("system", "user", "assistant", "tool")


@runtime_checkable
class Environment(Protocol):
    def reset(self, row: dict) -> list[dict]: ...

    def step(self, completion: str) -> tuple[list[dict], float, bool]: ...


class EnvError(ValueError):
    """An environment broke its contract (bad return value); ends its episode, counted."""


class EnvConfigError(ValueError, UserError):
    """``env.fn`` / ``env.kwargs`` cannot make an environment: the run stops in one line."""


class EnvTimeout(Exception):
    """An environment call ran past ``env.timeout_s`` (its thread is abandoned)."""


_IN_ENV = threading.local()  # .pid: this thread runs an environment call of that process
_REAL_EXIT = os._exit


def _guarded_exit(code: int = 0) -> None:
    """``os._exit`` while environment calls may run: from an environment's thread it ends that
    call (EnvError) instead of the process; elsewhere (a forked child too) it exits."""
    if getattr(_IN_ENV, "pid", None) == os.getpid():
        raise EnvError(f"the environment called os._exit({code})")
    _REAL_EXIT(code)


def timed_call(fn: Callable, args: tuple, timeout: float) -> Any:
    """``call_env(fn, *args)`` in a daemon thread; EnvTimeout after ``timeout`` seconds (the thread
    is abandoned). ``sys.exit`` or ``os._exit`` inside the call is an EnvError."""
    box: dict[str, Any] = {}
    os._exit = _guarded_exit  # type: ignore[assignment]

    def run() -> None:
        _IN_ENV.pid = os.getpid()
        try:
            box["out"] = call_env(fn, *args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["err"] = e

    t = threading.Thread(target=run, daemon=True, name="env-call")
    t.start()
    t.join(timeout)
    name = getattr(fn, "__name__", None) or type(fn).__name__
    if t.is_alive():
        raise EnvTimeout(f"{name} ran past {timeout:g} s")
    err = box.get("err")
    if err is not None:
        if not isinstance(err, Exception):  # SystemExit from sys.exit, ...
            raise EnvError(f"{name} raised {type(err).__name__}({err})")
        raise err
    return box.get("out")


def load_env_factory(spec: str, kwargs: dict | None = None) -> Callable[[], Any]:
    """The zero-argument factory of ``env.fn`` with ``env.kwargs`` bound (else EnvConfigError)."""
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise EnvConfigError(f"env.fn: expected 'package.module:Name', got {spec!r}")
    try:
        mod = importlib.import_module(mod_name)
    except BaseException as e:  # noqa: BLE001 - any import failure (even sys.exit) is the user's
        raise EnvConfigError(
            f"env.fn: cannot import {mod_name!r} ({type(e).__name__}: {e})"
        ) from None
    obj = getattr(mod, attr, None)
    if obj is None or not callable(obj):
        raise EnvConfigError(f"env.fn: {mod_name!r} has no callable {attr!r}")
    kw = dict(kwargs or {})
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin without a signature: checked when called
        sig = None
    if sig is not None:
        try:
            sig.bind(**kw)
        except TypeError as e:
            raise EnvConfigError(f"env.kwargs: {spec} does not take {sorted(kw)} ({e})") from None

    def factory() -> Any:
        env = obj(**kw)
        if env is None:
            raise EnvError(f"env.fn: {spec} returned None, not an environment")
        for name in ("reset", "step"):
            if not callable(getattr(env, name, None)):
                raise EnvError(f"env.fn: {spec} made an object without a {name}() method")
        return env

    return factory


def call_env(fn: Callable, *args: Any) -> Any:
    """``fn(*args)``, run to completion when it is a coroutine function (async environments)."""
    out = fn(*args)
    return asyncio.run(_await(out)) if inspect.isawaitable(out) else out


async def _await(x: Any) -> Any:
    return await x


def close_env(env: Any, timeout: float) -> None:
    """``env.close()`` when it has one, bounded by ``timeout``; best effort (errors ignored)."""
    close = getattr(env, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            timed_call(close, (), timeout)


def open_env(env: Any, row: dict, delta: Any, timeout: float) -> list[int]:
    """The opening token ids of ``env`` reset with ``row``, rendered by the `ChatDelta`."""
    opening = check_messages(timed_call(env.reset, (row,), timeout), "reset()", OPENING_ROLES)
    return delta.opening(opening, getattr(env, "tools", None))


def check_messages(msgs: Any, where: str, roles: tuple[str, ...] = ROLES) -> list[dict]:
    """``msgs`` as a list of {"role", "content"} dicts with one of ``roles``, else EnvError."""
    if not isinstance(msgs, (list, tuple)):
        raise EnvError(f"{where}: expected a list of messages, got {type(msgs).__name__}")
    out = []
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise EnvError(f"{where}: a message must be a dict with a string 'content', got {m!r}")
        if m.get("role") not in roles:
            raise EnvError(f"{where}: message role must be one of {roles}, got {m.get('role')!r}")
        out.append(dict(m))
    return out


def check_step(out: Any) -> tuple[list[dict], float, bool]:
    """A ``step`` return value checked: (messages, finite reward, bool done), else EnvError."""
    if not isinstance(out, tuple) or len(out) != 3:
        raise EnvError(f"step(): expected (messages, reward, done), got {out!r:.200}")
    msgs, reward, done = out
    if isinstance(reward, (str, bytes)):
        raise EnvError(f"step(): reward must be a number, got {reward!r:.100}")
    try:
        r = float(reward)
    except (TypeError, ValueError):
        raise EnvError(f"step(): reward must be a number, got {reward!r:.100}") from None
    if not math.isfinite(r):
        raise EnvError(f"step(): reward must be finite, got {r}")
    return check_messages(msgs, "step()"), r, bool(done)
