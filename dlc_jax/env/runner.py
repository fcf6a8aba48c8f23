"""`EnvSampler`: multi-turn episodes behind the `Sampler` protocol. ``generate`` runs one episode
per prompt and yields one `Rollout` per episode, interleaving generated turns (loss mask 1) and the
environment's answers (loss mask 0). Episodes run in lockstep: turn t of every live episode is one
sampler request, then every environment answers (``env.workers`` at a time, each call bounded by
``env.timeout_s``). End reasons: docs/ENVIRONMENTS.md. Environment failures end their episode."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from dlc_jax.env.chat_delta import ChatDelta, TemplateError
from dlc_jax.env.config import EnvConfig
from dlc_jax.env.history import History
from dlc_jax.env.protocol import (
    EnvError,
    EnvTimeout,
    check_step,
    close_env,
    load_env_factory,
    open_env,
    timed_call,
)
from dlc_jax.sampler.client.protocol import SamplerBase
from dlc_jax.sampler.wire.types import Rollout, SamplingParams, mix_seed

logger = logging.getLogger(__name__)

END_REASONS = (
    *("done", "max_turns", "max_total_tokens", "length"),
    *("env_error", "env_timeout", "env_oversized", "prefix_break"),
)
# the Sampler protocol's calls other than generate, answered by the real sampler
_DELEGATED = frozenset(
    ("push_weights", "info", "wait_ready", "metrics", "report", "rotation", "set_rotation", "close")
)


class PrefixBreakError(RuntimeError):
    """A turn's tokens do not extend the episode's history exactly (``on_prefix_break: error``)."""


@dataclasses.dataclass
class _Episode:
    """One episode in flight: slot, token history, environment, counters (``ep``), end reason."""

    slot: int
    hist: History
    env: Any = None
    ep: dict = dataclasses.field(
        default_factory=lambda: {"turns": 0, "env_tokens": 0, "turn_rewards": [], "errors": 0}
    )
    end: str | None = None
    closed: bool = False
    last: list[int] | None = None
    max_tokens: int = 0
    budget_cut: bool = False


class EnvSampler(SamplerBase):
    """inner_fn: zero-arg callable returning the real `Sampler` (it may change on reconnect);
    env_factory: makes one environment per episode; row_fn: slot id -> the data row its environment
    is reset with (default: the rows given to `add_rows`)."""

    def __init__(
        self,
        inner_fn: Callable[[], Any],
        env_factory: Callable[[], Any],
        delta: ChatDelta,
        cfg: EnvConfig,
        *,
        max_model_len: int,
        row_fn: Callable[[int], dict] | None = None,
    ) -> None:
        self.inner_fn, self.env_factory, self.delta, self.cfg = inner_fn, env_factory, delta, cfg
        self.rows: dict[int, dict] = {}
        self.row_fn = row_fn if row_fn is not None else self.rows.__getitem__
        self.max_total = min(cfg.max_total_tokens or max_model_len, max_model_len)
        self.lock = threading.Lock()
        self.counts: dict[str, float] = {}

    def add_rows(self, rows: dict[int, dict]) -> None:
        """Slot -> data row for the episodes to come (when no ``row_fn`` was given)."""
        with self.lock:
            self.rows.update(rows)

    # ---- the Sampler protocol: everything but generate goes to the real sampler ----------------
    @property
    def address(self) -> str:
        return str(self.inner_fn().address)

    def __getattr__(self, name: str) -> Any:
        if name in _DELEGATED:
            return getattr(self.inner_fn(), name)
        raise AttributeError(name)

    def push_model(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner_fn().push_model(*args, **kwargs)

    def _generate(self, prompts, params, slot_ids, request_id) -> Iterator[Rollout]:
        """One episode per prompt (``params.n`` 1), in lockstep; each rollout yielded at its end."""
        if params.n != 1:
            raise ValueError(f"EnvSampler: one episode per request cell (n = 1), got n={params.n}")
        k = int(params.head_k)
        eps = [_Episode(s, History(list(p), k)) for s, p in zip(slot_ids, prompts)]
        pool = ThreadPoolExecutor(max_workers=min(self.cfg.workers, max(len(eps), 1)))
        try:
            self._each(pool, eps, self._open)
            for turn in range(self.cfg.max_turns):
                yield from self._finished(pool, eps)
                live = [e for e in eps if e.end is None]
                if not live:
                    break
                self._sample_turn(live, params, turn)
                self._each(pool, [e for e in live if e.end is None], self._answer)
            for e in eps:
                if e.end is None:
                    e.end = "max_turns"
            yield from self._finished(pool, eps)
        finally:
            for e in [e for e in eps if not e.closed]:  # the consumer stopped early: close them
                pool.submit(self._close, e)
            pool.shutdown(wait=False, cancel_futures=True)

    # ---- one turn of every live episode --------------------------------------------------------
    def _each(self, pool: ThreadPoolExecutor, eps: list[_Episode], fn: Callable) -> None:
        """``fn(e)`` for each episode, ``env.workers`` at once; an env failure ends its episode."""
        for f in [pool.submit(self._guard, fn, e) for e in eps]:
            f.result()

    def _guard(self, fn: Callable, e: _Episode) -> None:
        try:
            fn(e)
        except (EnvError, EnvTimeout) as err:
            e.end = "env_timeout" if isinstance(err, EnvTimeout) else "env_error"
            e.ep["error"] = str(err)[:200]
        except (PrefixBreakError, TemplateError):
            raise
        except Exception as err:  # noqa: BLE001 - an environment's own exception ends the episode
            e.end = "env_error"
            e.ep["error"] = f"{type(err).__name__}: {err}"[:200]

    def _open(self, e: _Episode) -> None:
        t = self.cfg.timeout_s
        e.env = timed_call(self.env_factory, (), t)
        e.hist = History(open_env(e.env, self.row_fn(e.slot), self.delta, t), e.hist.k)

    def _sample_turn(self, live: list[_Episode], params: SamplingParams, turn: int) -> None:
        """One sampler request per per-turn token budget (usually one), each slot once a request."""
        groups: dict[int, list[_Episode]] = {}
        for e in live:
            budget = self.max_total - len(e.hist)
            if budget < 1:
                e.end = "max_total_tokens"
                continue
            e.max_tokens = min(params.max_tokens, budget)
            e.budget_cut = e.max_tokens < params.max_tokens
            groups.setdefault(e.max_tokens, []).append(e)
        reqs: list[list[_Episode]] = []
        for group in groups.values():  # a slot twice in one request could not be told apart
            for e in group:
                for req in reqs:
                    if req[0].max_tokens == e.max_tokens and all(x.slot != e.slot for x in req):
                        req.append(e)
                        break
                else:
                    reqs.append([e])
        for i, req in enumerate(reqs):
            # a seeded request (JAX backend) draws each prompt's noise from the seed and the
            # prompt's place in the request: every turn's request gets its own seed
            seed = None if params.seed is None else mix_seed(int(params.seed), turn, i)
            p = dataclasses.replace(params, n=1, max_tokens=req[0].max_tokens, seed=seed)
            got = list(
                self.inner_fn().generate([e.hist.tokens for e in req], p, [e.slot for e in req])
            )
            by_slot = {int(r.slot_id): r for r in got}
            if len(got) != len(req) or len(by_slot) != len(req):
                raise RuntimeError(
                    f"sampler returned {len(got)} rollouts for {len(req)} prompts of one turn"
                )
            for e in req:
                self._take(e, by_slot[e.slot], turn)

    def _take(self, e: _Episode, r: Rollout, turn: int) -> None:
        """Append turn ``r`` to the history (a prefix break: per ``env.on_prefix_break``)."""
        e.last = None
        if not e.hist.add_generated(r):
            self._bump("env/prefix_breaks")
            if self.cfg.on_prefix_break == "error":
                raise PrefixBreakError(
                    f"slot {e.slot} turn {turn}: the sampler saw {len(r.prompt_ids)} tokens "
                    f"that differ from the episode's {len(e.hist.tokens)}-token history"
                )
            if not self._split(e.hist, r):
                e.end = "prefix_break"
                return
            e.ep["splits"] = e.ep.get("splits", 0) + 1
        e.ep["turns"] += 1
        e.last = [int(t) for t in r.response_ids]

    def _answer(self, e: _Episode) -> None:
        """The environment's answer to the turn just sampled, appended (or the episode's end)."""
        gen, cfg = e.last or [], self.cfg
        ended = bool(gen) and gen[-1] == self.delta.eos_id
        text = self.delta.tok.decode(gen, skip_special_tokens=True)
        msgs, reward, done = check_step(timed_call(e.env.step, (text,), cfg.timeout_s))
        e.ep["turn_rewards"].append(reward)
        if done:
            e.end = "done"
        elif not ended:  # cut by sampler.max_tokens, or by the episode's token budget
            e.end = "max_total_tokens" if e.budget_cut else "length"
        elif e.ep["turns"] >= cfg.max_turns:
            e.end = "max_turns"
        else:
            ids, cut = self.delta.fit_answer(msgs, cfg.max_env_tokens_per_turn, cfg.truncation_side)
            if cut:
                self._bump("env/truncated_answers")
            if not ids:
                e.end = "env_oversized"
            elif len(e.hist) + len(ids) >= self.max_total:
                e.end = "max_total_tokens"
            else:
                e.hist.add_env(ids)

    def _finished(self, pool: ThreadPoolExecutor, eps: list[_Episode]) -> Iterator[Rollout]:
        """The rollouts of ended episodes not handed out yet (their environments closed)."""
        ended = [e for e in eps if e.end is not None and not e.closed]
        for f in [pool.submit(self._close, e) for e in ended]:
            f.result()
        for e in ended:
            yield self._rollout(e)

    def _close(self, e: _Episode) -> None:
        e.closed = True
        close_env(e.env, self.cfg.timeout_s)

    def _rollout(self, e: _Episode) -> Rollout:
        ep, end = e.ep, str(e.end)
        if end in ("env_error", "env_timeout"):
            ep["errors"] += 1
            logger.debug("env episode (slot %d) ended: %s %s", e.slot, end, ep.get("error", ""))
        ep["end"] = end
        ep["env_tokens"] = e.hist.env_tokens
        ep["mismatches"] = e.hist.mismatches()
        rewards = ep["turn_rewards"]
        total = (sum(rewards) if self.cfg.reward == "sum" else rewards[-1]) if rewards else 0.0
        self._count(ep)
        out = e.hist.rollout(end, total, ep)
        out.slot_id = e.slot
        return out

    def _split(self, hist: History, r: Rollout) -> bool:
        """``on_prefix_break: split``: turn ``r`` starts a new sequence in the episode's row from
        the sampler's own prompt; False when the row would outgrow its budget or ``r`` is bad."""
        echo, t = len(r.prompt_ids), len(r.response_ids)
        if not echo or len(r.logprobs) != t or len(hist) + echo + t > self.max_total:
            return False
        hist.restart(r.prompt_ids)
        if not hist.add_generated(r):  # cannot happen: the echo is the new sequence
            raise RuntimeError("env: a split turn does not extend its own prompt")
        self._bump("env/splits")
        return True

    # ---- counters ------------------------------------------------------------------------------
    def _bump(self, *keys: str, by: dict[str, float] | None = None) -> None:
        """Add 1 to each run counter of ``keys``, and each of ``by``'s values to its counter."""
        with self.lock:
            for k, v in {**dict.fromkeys(keys, 1.0), **(by or {})}.items():
                self.counts[k] = self.counts.get(k, 0.0) + v

    def _count(self, ep: dict) -> None:
        more = {"env/errors": ep["errors"], "env/silent_mismatches": ep["mismatches"]}
        self._bump(by={"env/episodes": 1.0, **more, f"env/end_{ep['end']}": 1.0})

    def totals(self) -> dict[str, float]:
        """Run totals of the counters (episodes, errors, prefix breaks, end reasons, ...)."""
        with self.lock:
            out = dict(self.counts)
        out["env/escaped_special_tokens"] = float(self.delta.escaped)
        return out


def episode_stats(rollouts: list[Rollout]) -> dict[str, float]:
    """Per-step means over the episodes in ``rollouts`` (turns, tokens, rewards, end reasons)."""
    eps = [r.episode for r in rollouts if r.episode is not None]
    if not eps:
        return {}
    n = len(eps)
    out = {
        "env/turns": float(np.mean([e["turns"] for e in eps])),
        "env/env_tokens": float(np.mean([e["env_tokens"] for e in eps])),
        "env/generated_tokens": float(
            np.mean([r.generated_mask().sum() for r in rollouts if r.episode is not None])
        ),
        "env/episode_errors": float(sum(e["errors"] for e in eps)),
        "env/splits": float(sum(e.get("splits", 0) for e in eps)),
    }
    for reason in END_REASONS:
        out[f"env/share_{reason}"] = sum(e["end"] == reason for e in eps) / n
    for i in range(max(len(e["turn_rewards"]) for e in eps)):
        vals = [e["turn_rewards"][i] for e in eps if len(e["turn_rewards"]) > i]
        out[f"env/reward_turn_{i}"] = float(np.mean(vals))
    return out


def env_row(record: Any) -> dict:
    """What an environment's ``reset`` gets of a `PromptRecord`: metadata, prompt, answer, row."""
    return dict(record.metadata, prompt=record.prompt, answer=record.answer, row=record.row)


def make_env_sampler(cfg: Any, tokenizer: Any, inner_fn: Callable[[], Any]) -> EnvSampler | None:
    """The `EnvSampler` of ``cfg.env`` (None when ``env.fn`` is empty)."""
    if not cfg.env.enabled:
        return None
    factory = load_env_factory(cfg.env.fn, cfg.env.kwargs)
    delta = ChatDelta.for_env(cfg.env, tokenizer, enable_thinking=cfg.data.enable_thinking)
    return EnvSampler(inner_fn, factory, delta, cfg.env, max_model_len=cfg.sampler.max_model_len)
