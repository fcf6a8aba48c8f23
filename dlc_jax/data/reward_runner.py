"""Runs reward functions in worker processes (a hanging reward must be killable; math-verify's
signal timeouts need a main thread): ``RewardRunner(cfg).score(...) -> (rewards [N], metrics)``.
Each call is split into one chunk per worker; a chunk that raises, returns unusable values or
outlives ``timeout_s`` (its worker's process group killed and replaced) is re-scored one sample at
a time; samples that still fail score 0 and are logged, until the failure budget stops the run."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

import numpy as np

from dlc_jax.data.reward_budget import FailureBudget
from dlc_jax.data.rewards import (
    MAX_ABS_REWARD,
    RewardConfig,
    RewardFnSpec,
    check_clip,
    check_values,
)

log = logging.getLogger(__name__)

_STARTUP_TIMEOUT_S = 120.0
_MAX_IDS_IN_LOG = 8
_POSITIONAL = ("prompts", "completions", "answers")  # dataset columns of these names are not passed


class RewardError(ValueError):
    """A reward set-up error (bad function path, import failure); the message is one line."""


class _Worker:
    """One ``dlc_jax.data.reward_worker`` subprocess and its socket connection."""

    def __init__(self, fn_paths: list[str]):
        parent, child = socket.socketpair()
        # the worker imports what this process can (plug-ins next to a script, test modules)
        path = os.pathsep.join(dict.fromkeys(p or os.getcwd() for p in sys.path))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dlc_jax.data.reward_worker", str(child.fileno())],
            pass_fds=(child.fileno(),),
            env=dict(os.environ, PYTHONPATH=path),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: killed whole (module doc)
        )
        child.close()
        self.conn = Connection(parent.detach())
        self.conn.send(list(fn_paths))
        self.ready = False
        self.task: _Task | None = None
        self.deadline = math.inf

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill the worker's whole process group (what its reward spawned too)."""
        self.ready = False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self.conn.close()

    def exit_status(self) -> str:
        """``exit code N`` / ``killed by SIGNAME`` / ``still running`` (after waiting up to 5 s)."""
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "still running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"


@dataclass
class _Task:
    spec: int  # index into specs
    rows: list[int]  # sample indices of this call
    timeout_s: float
    single: bool  # a one-sample re-score (no further fallback)
    deadline: float = math.inf  # hard limit for fallback tasks (the time budget)


class RewardRunner:
    """Weighted rewards of ``cfg`` in worker processes; a context manager (or call `close`)."""

    def __init__(self, cfg: RewardConfig):
        self.cfg = cfg
        try:
            self.specs: list[RewardFnSpec] = cfg.specs()
        except ValueError as e:
            raise RewardError(str(e)) from e
        self._paths = [s.fn for s in self.specs]
        self._workers: list[_Worker] = []
        weakref.finalize(self, _stop_workers, self._workers)
        self.totals = {"errors": 0, "timeouts": 0}
        self._clip = check_clip(cfg.clip)
        self.budget = FailureBudget(cfg.max_failed_fraction, cfg.window)
        t0 = time.time()
        self._workers.extend(_Worker(self._paths) for _ in range(cfg.workers))
        for w in self._workers:
            self._await_ready(w)
        log.info(
            "reward: %s in %d worker processes (ready in %.1f s)",
            ", ".join(f"{s.name}={s.fn} x{s.weight:g}" for s in self.specs),
            cfg.workers,
            time.time() - t0,
        )

    def _await_ready(self, w: _Worker) -> None:
        if not w.conn.poll(_STARTUP_TIMEOUT_S):
            self.close()
            raise RewardError(f"reward: worker did not start within {_STARTUP_TIMEOUT_S:.0f} s")
        try:
            kind, msg = w.conn.recv()
        except EOFError:
            self.close()
            raise RewardError(f"reward: worker exited at start ({w.exit_status()})") from None
        if kind != "ready":
            self.close()
            raise RewardError(f"reward: {msg}")
        w.ready = True

    def close(self) -> None:
        """Stop the workers (also done when the runner is garbage-collected)."""
        _stop_workers(self._workers)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- public API ---------------------------------------------------------------------------
    def score(
        self,
        prompts: list[str],
        completions: list[str],
        answers: list[str],
        ids: list[str],
        metadata: dict[str, list] | None = None,
    ) -> tuple[np.ndarray, dict[str, float]]:
        """Weighted total reward per sample (float32 [N]) and metrics ``reward/<name>`` (means),
        ``reward/errors`` / ``reward/timeouts`` (samples scored 0) and ``reward/seconds``."""
        n = len(completions)
        if not (len(prompts) == len(answers) == len(ids) == n):
            raise ValueError(
                f"score: {len(prompts)} prompts, {n} completions, {len(answers)} answers, "
                f"{len(ids)} ids: lengths differ"
            )
        t0 = time.time()
        meta = dict(metadata or {})
        for k, v in meta.items():
            if len(v) != n:
                raise ValueError(f"score: metadata {k!r} has {len(v)} values for {n} samples")
        total = np.zeros(n, np.float64)
        metrics = {f"reward/{s.name}": 0.0 for s in self.specs}  # the same names even when empty
        failures = {"errors": 0, "timeouts": 0}
        payload = (prompts, completions, answers, meta, ids)
        for spec, (vals, failed) in zip(self.specs, self._run(payload, n) if n else []):
            for kind, rows, why in failed:
                failures[kind + "s"] += len(rows)
                what = "timed out" if kind == "timeout" else "failed"
                log.warning(
                    "reward %r (%s) %s on sample ids [%s]: %s; they score 0",
                    spec.name, spec.fn, what, _shown(ids, rows), why,
                )  # fmt: skip
            # after the warnings above: a stop names the last error, they name the samples
            failed_rows = sum(len(rows) for _, rows, _ in failed)
            self.budget.record(
                spec.name, spec.fn, failed_rows, n, failed[-1][2] if failed else None
            )
            metrics[f"reward/{spec.name}"] = float(np.mean(vals))
            total += spec.weight * vals
        big = np.flatnonzero(~(np.abs(total) <= MAX_ABS_REWARD))  # weights x values overflowing
        if big.size:
            failures["errors"] += big.size
            log.warning(
                "rewards: the weighted total of sample ids [%s] is outside ±%g; they score 0",
                _shown(ids, big),
                MAX_ABS_REWARD,
            )
            total[big] = 0.0
        for key, count in failures.items():
            self.totals[key] += count
            metrics[f"reward/{key}"] = float(count)
        metrics["reward/seconds"] = time.time() - t0 if n else 0.0
        return total.astype(np.float32), metrics

    def check_answers(self, answers: list[str]) -> list[str | None]:
        """Per gold answer, the first message of a reward's ``check_answer`` (None = fine)."""
        out: list[str | None] = [None] * len(answers)
        if not answers:
            return out
        for si in range(len(self.specs)):
            chunks = _split(len(answers), len(self._workers))
            results = self._map_simple("check", si, [[answers[i] for i in c] for c in chunks])
            for c, res in zip(chunks, results):
                for i, msg in zip(c, res):
                    if msg is not None and out[i] is None:
                        name = self.specs[si].name
                        out[i] = msg if name in msg else f"{msg} (reward {name})"
        return out

    # ---- scheduling ---------------------------------------------------------------------------
    def _call_args(self, spec: RewardFnSpec, payload, rows: list[int]):
        prompts, completions, answers, meta, ids = payload
        kwargs = {k: [v[r] for r in rows] for k, v in meta.items() if k not in _POSITIONAL}
        kwargs["ids"] = [ids[r] for r in rows]
        kwargs.update(spec.kwargs)
        cols = [[col[r] for r in rows] for col in (prompts, completions, answers)]
        return (*cols, kwargs)

    def _replace(self, i: int) -> _Worker:
        """A fresh worker in place of worker ``i`` (killed, dead or broken)."""
        self._workers[i].kill()
        w = self._workers[i] = _Worker(self._paths)
        self._await_ready(w)
        return w

    def _ensure_workers(self) -> None:
        for i, w in enumerate(self._workers):
            if not (w.ready and w.alive()):
                self._replace(i)

    def _run(self, payload, n: int):
        """Per spec: (values float64 [n], failures [(kind, rows, why)])."""
        cfg = self.cfg
        self._ensure_workers()
        vals = [np.zeros(n, np.float64) for _ in self.specs]
        failed: list[list] = [[] for _ in self.specs]
        queue: deque[_Task] = deque(
            _Task(si, rows, cfg.timeout_s, single=(len(rows) == 1))
            for si in range(len(self.specs))
            for rows in _split(n, len(self._workers))
        )
        budget_end: dict[int, float] = {}  # per reward: end of its one-by-one re-scoring budget
        busy: list[_Worker] = []
        while queue or busy:
            now = time.time()
            # hand out tasks to idle, ready workers
            for i, w in enumerate(self._workers):
                if not queue:
                    break
                if w.task is not None:
                    continue
                if not w.ready:
                    w = self._replace(i)
                nxt = queue.popleft()
                if nxt.deadline <= now:
                    failed[nxt.spec].append(
                        ("timeout", nxt.rows, "not scored within reward.timeout_s")
                    )
                    continue
                w.task, w.deadline = nxt, min(now + nxt.timeout_s, nxt.deadline)
                args = self._call_args(self.specs[nxt.spec], payload, nxt.rows)
                w.conn.send(("score", nxt.spec, args))
                busy.append(w)
            if not busy:
                continue
            timeout = max(0.0, min(w.deadline for w in busy) - time.time())
            ready = wait([w.conn for w in busy], timeout=timeout)
            now = time.time()
            for w in list(busy):
                t = w.task
                assert t is not None
                why, kind = None, "error"
                if w.conn in ready:
                    try:
                        status, res = w.conn.recv()
                    except (EOFError, OSError):
                        status, res = "err", f"worker died ({w.exit_status()})"
                        w.ready = False
                    if status == "ok":
                        got, why = check_values(res, len(t.rows), self._clip)
                        if got is not None:
                            vals[t.spec][t.rows] = got
                    else:
                        why = res
                elif now >= w.deadline:
                    kind, why = "timeout", f"no result within {t.timeout_s:g} s"
                    w.kill()
                else:
                    continue
                busy.remove(w)
                w.task = None
                if why is None:
                    continue
                if t.single:
                    failed[t.spec].append((kind, t.rows, why))
                    continue
                log.info(
                    "reward %r: a %d-sample call %s (%s); re-scoring its samples one by one",
                    self.specs[t.spec].name,
                    len(t.rows),
                    "timed out" if kind == "timeout" else "failed",
                    why,
                )
                end = budget_end.setdefault(t.spec, now + cfg.timeout_s)
                queue.extend(
                    _Task(t.spec, [r], cfg.sample_timeout_s, single=True, deadline=end)
                    for r in t.rows
                )
        return list(zip(vals, [_merge_failures(f) for f in failed]))

    def _map_simple(self, kind: str, si: int, payloads: list) -> list[list]:
        """One request per worker (len(payloads) <= workers), no fallback; errors: RewardError."""
        self._ensure_workers()
        ws = self._workers[: len(payloads)]
        for w, p in zip(ws, payloads):
            w.conn.send((kind, si, p))
        out = []
        for w in ws:
            if not w.conn.poll(max(self.cfg.timeout_s, 60.0)):
                w.kill()
                raise RewardError(
                    f"reward {self.specs[si].name!r}: check_answer did not finish in time"
                )
            status, res = w.conn.recv()
            if status != "ok":
                raise RewardError(f"reward {self.specs[si].name!r}: check_answer failed: {res}")
            out.append(res)
        return out


def _stop_workers(workers: list[_Worker]) -> None:
    for w in workers:
        with contextlib.suppress(OSError, ValueError):
            w.conn.send(None)
    for w in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.proc.wait(timeout=2)
        w.kill()  # the process group too: what the reward spawned
    workers.clear()


def _shown(ids: list[str], rows) -> str:
    """The ids of ``rows`` for a log line: the first few, then how many more."""
    more = len(rows) - _MAX_IDS_IN_LOG
    shown = ", ".join(ids[r] for r in rows[:_MAX_IDS_IN_LOG])
    return shown + (f" (+{more} more)" if more > 0 else "")


def _split(n: int, parts: int) -> list[list[int]]:
    """``range(n)`` in at most ``parts`` contiguous, non-empty, near-equal chunks."""
    parts = max(1, min(parts, n))
    bounds = np.linspace(0, n, parts + 1).round().astype(int)
    return [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _merge_failures(failed: list) -> list:
    """One ``(kind, rows, first reason)`` per kind, rows sorted."""
    out: dict[str, tuple[str, list[int], str]] = {}
    for kind, rows, why in failed:
        out.setdefault(kind, (kind, [], why))[1].extend(rows)
    return [(k, sorted(rows), why) for k, rows, why in out.values()]
