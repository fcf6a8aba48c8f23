"""`EnvSampler`: multi-turn episodes behind the `Sampler` protocol.

It wraps the real sampler: ``generate(prompts, params, slot_ids)`` runs one episode per prompt
(``env.workers`` at a time, each in its own thread) and yields one `Rollout` per episode, whose
response interleaves the generated turns (loss mask 1, the sampler's log-probs, head and weight
version per token) and the environment's answers (loss mask 0). The trainer sees ordinary
rollouts. Every turn is a sampler call on token ids (`History`); a resync between two turns gives
the episode two weight versions, handled like any in-flight rollout (theta_s per version).

Episode end reasons (``episode["end"]``, counted under ``env/end_<reason>``): ``done`` (the
environment said so), ``max_turns``, ``max_total_tokens``, ``length`` (a turn hit
``sampler.max_tokens`` without its end-of-turn token: the environment still scores that turn),
``env_error`` (reset/step raised or returned garbage), ``env_timeout`` (a call ran past
``env.timeout_s``; its thread is abandoned), ``env_oversized`` (an answer over
``env.max_env_tokens_per_turn`` with ``truncation_side: error``), ``prefix_break``
(``on_prefix_break: split``, when the rest cannot continue as a new sequence in the same row).
An environment failure never reaches the trainer; a sampler failure
does (the stream fails as for single-turn requests).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from dlc_jax.env.chat_delta import ChatDelta, TemplateError
from dlc_jax.env.config import EnvConfig
from dlc_jax.env.history import History
from dlc_jax.env.protocol import EnvError, call_env, check_messages, check_step
from dlc_jax.sampler.types import Rollout, SamplingParams, mix_seed

logger = logging.getLogger(__name__)

END_REASONS = (
    "done",
    "max_turns",
    "max_total_tokens",
    "length",
    "env_error",
    "env_timeout",
    "env_oversized",
    "prefix_break",
)


_DELEGATED = (
    "push_weights",
    "push_model",
    "info",
    "wait_ready",
    "metrics",
    "report",
    "rotation",
    "set_rotation",
    "close",
)


class PrefixBreakError(RuntimeError):
    """A turn's tokens do not extend the episode's history exactly (``on_prefix_break: error``)."""


class EnvTimeout(Exception):
    pass


def timed_call(fn: Callable, args: tuple, timeout: float) -> Any:
    """``call_env(fn, *args)`` in a daemon thread; EnvTimeout after ``timeout`` seconds (the
    thread cannot be killed and is left to finish on its own)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["out"] = call_env(fn, *args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["err"] = e

    t = threading.Thread(target=run, daemon=True, name="env-call")
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise EnvTimeout(f"{getattr(fn, '__name__', fn)} ran past {timeout:g} s")
    if "err" in box:
        raise box["err"]
    return box["out"]


class EnvSampler:
    """inner_fn: zero-arg callable returning the real `Sampler` (it may change on reconnect);
    env_factory: zero-arg callable making one environment per episode; delta: the `ChatDelta` of
    the model's tokenizer; row_fn: slot id -> the data row (dict) its environment is reset with
    (default: the rows given to `add_rows`); max_model_len: the sampler's context (bounds
    ``env.max_total_tokens``)."""

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
        self.inner_fn = inner_fn
        self.env_factory = env_factory
        self.delta = delta
        self.cfg = cfg
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

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        slot_ids: list[int] | None = None,
        request_id: str | None = None,
    ) -> Iterator[Rollout]:
        """One episode per prompt (``params.n`` must be 1); rollouts in completion order."""
        if params.n != 1:
            raise ValueError(f"EnvSampler: one episode per request cell (n = 1), got n={params.n}")
        slots = list(slot_ids) if slot_ids is not None else list(range(len(prompts)))
        pool = ThreadPoolExecutor(max_workers=min(self.cfg.workers, max(len(prompts), 1)))
        try:
            pending = {
                pool.submit(self.episode, s, list(p), params): s for s, p in zip(slots, prompts)
            }
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    del pending[f]
                    yield f.result()  # a sampler failure (or an 'error' prefix break) raises
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    # ---- one episode ---------------------------------------------------------------------------
    def episode(self, slot: int, fallback_prompt: list[int], params: SamplingParams) -> Rollout:
        cfg, k = self.cfg, int(params.head_k)
        ep: dict[str, Any] = {"turns": 0, "env_tokens": 0, "turn_rewards": [], "errors": 0}
        hist = History(fallback_prompt, k)
        env = None
        try:
            env = timed_call(self.env_factory, (), cfg.timeout_s)
            opening = check_messages(
                timed_call(env.reset, (self.row_fn(slot),), cfg.timeout_s),
                "reset()",
                ("system", "user", "assistant", "tool"),
            )
            hist = History(self.delta.opening(opening, getattr(env, "tools", None)), k)
            end = self._turns(env, hist, slot, params, ep)
        except (EnvError, EnvTimeout) as e:
            end = "env_timeout" if isinstance(e, EnvTimeout) else "env_error"
            ep["error"] = str(e)[:200]
        except (PrefixBreakError, TemplateError):
            raise
        except _SamplerError as e:
            raise (e.__cause__ or e) from None
        except Exception as e:  # noqa: BLE001 - an environment's own exception ends the episode
            end = "env_error"
            ep["error"] = f"{type(e).__name__}: {e}"[:200]
        finally:
            close = getattr(env, "close", None)
            if callable(close):
                try:
                    timed_call(close, (), cfg.timeout_s)
                except BaseException:  # noqa: BLE001 - closing is best effort
                    pass
        if end in ("env_error", "env_timeout"):
            ep["errors"] += 1
            logger.debug("env episode (slot %d) ended: %s %s", slot, end, ep.get("error", ""))
        ep["end"] = end
        ep["env_tokens"] = hist.env_tokens
        ep["mismatches"] = hist.mismatches()
        rewards = ep["turn_rewards"]
        total = (sum(rewards) if cfg.reward == "sum" else rewards[-1]) if rewards else 0.0
        self._count(ep)
        out = hist.rollout(end, total, ep)
        out.slot_id = slot
        return out

    def _turns(self, env, hist: History, slot: int, params: SamplingParams, ep: dict) -> str:
        cfg = self.cfg
        for turn in range(cfg.max_turns):
            budget = self.max_total - len(hist)
            if budget < 1:
                return "max_total_tokens"
            # a seeded request (JAX backend) draws its noise from the seed and the prompt's place
            # in the request, the same for every one-prompt turn: each turn of each slot gets its
            # own seed, else all episodes of a sample index (and all their turns) share one noise
            seed = None if params.seed is None else mix_seed(int(params.seed), slot, turn)
            p = dataclasses.replace(
                params, n=1, max_tokens=min(params.max_tokens, budget), seed=seed
            )
            try:
                got = list(self.inner_fn().generate([hist.tokens], p, slot_ids=[slot]))
            except Exception as e:
                raise _SamplerError(str(e)) from e
            if len(got) != 1:
                raise _SamplerError(f"sampler returned {len(got)} rollouts for one prompt")
            r = got[0]
            if not hist.add_generated(r):
                self._bump("env/prefix_breaks")
                if cfg.on_prefix_break == "error":
                    raise PrefixBreakError(
                        f"slot {slot} turn {turn}: the sampler saw {len(r.prompt_ids)} tokens "
                        f"that differ from the episode's {len(hist.tokens)}-token history"
                    )
                if not self._split(hist, r):
                    return "prefix_break"
                ep["splits"] = ep.get("splits", 0) + 1
            ep["turns"] += 1
            gen = [int(t) for t in r.response_ids]
            ended = bool(gen) and gen[-1] == self.delta.eos_id
            text = self.delta.tok.decode(gen, skip_special_tokens=True)
            msgs, reward, done = check_step(timed_call(env.step, (text,), cfg.timeout_s))
            ep["turn_rewards"].append(reward)
            if done:
                return "done"
            if not ended:  # cut by sampler.max_tokens, or by the episode's token budget
                return "max_total_tokens" if p.max_tokens < params.max_tokens else "length"
            if turn == cfg.max_turns - 1:
                return "max_turns"
            ids, cut = self.delta.fit_answer(msgs, cfg.max_env_tokens_per_turn, cfg.truncation_side)
            if cut:
                self._bump("env/truncated_answers")
            if not ids:
                return "env_oversized"
            if len(hist) + len(ids) >= self.max_total:
                return "max_total_tokens"
            hist.add_env(ids)
        return "max_turns"

    def _split(self, hist: History, r: Rollout) -> bool:
        """``on_prefix_break: split``: the turn ``r`` starts a new sequence in the episode's row
        from the sampler's own prompt (`History.restart`), counted in ``env/splits``; False (the
        episode ends at the break) when the row would outgrow ``env.max_total_tokens`` or ``r``
        is malformed."""
        echo, t = len(r.prompt_ids), len(r.response_ids)
        if not echo or len(r.logprobs) != t or len(hist) + echo + t > self.max_total:
            return False
        hist.restart(r.prompt_ids)
        if not hist.add_generated(r):  # cannot happen: the echo is the new sequence
            raise RuntimeError("env: a split turn does not extend its own prompt")
        self._bump("env/splits")
        return True

    # ---- counters ------------------------------------------------------------------------------
    def _bump(self, key: str, by: float = 1.0) -> None:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0.0) + by

    def _count(self, ep: dict) -> None:
        with self.lock:
            c = self.counts
            c["env/episodes"] = c.get("env/episodes", 0.0) + 1
            c["env/errors"] = c.get("env/errors", 0.0) + ep["errors"]
            c["env/silent_mismatches"] = c.get("env/silent_mismatches", 0.0) + ep["mismatches"]
            key = f"env/end_{ep['end']}"
            c[key] = c.get(key, 0.0) + 1

    def totals(self) -> dict[str, float]:
        """Run totals of the counters (episodes, errors, prefix breaks, end reasons)."""
        with self.lock:
            return dict(self.counts)


class _SamplerError(Exception):
    """A sampler call failed inside an episode: re-raised from `generate` (the stream fails)."""


def episode_stats(rollouts: list[Rollout]) -> dict[str, float]:
    """Per-step means over the episodes in ``rollouts``: turns, env tokens, generated tokens,
    reward per turn (``env/reward_turn_<i>``), the share of each end reason."""
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
    most = max(len(e["turn_rewards"]) for e in eps)
    for i in range(most):
        vals = [e["turn_rewards"][i] for e in eps if len(e["turn_rewards"]) > i]
        out[f"env/reward_turn_{i}"] = float(np.mean(vals))
    return out
