"""Reward functions and their config. A reward function is any importable ``module:function``
``fn(prompts, completions, answers, **metadata) -> list[float]`` (lists of str; ``metadata``:
``ids`` plus the data set's extra columns) returning one real number per completion within ±1e15
unless clipped; an optional ``check_answer(answer) -> str | None`` attribute vets each gold answer
at load. Built-ins: ``exact_match`` and ``math_verify`` (HF math-verify equivalence)."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import numbers
import re
import threading
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from dlc_jax.data.answers import candidate_answer, extract_answer, normalize_text, parse_number

# |reward| limit without reward.clip: (2 * 1e15)^2 * a group of 10^6 stays finite in float32
MAX_ABS_REWARD = 1e15


def as_reward_list(out: object) -> list[float] | str:
    """A reward function's return value as a list of floats, or a one-line reason why not."""
    kind = type(out).__name__
    if isinstance(out, (str, bytes, bytearray, Mapping, set, frozenset)) or out is None:
        return f"returned a {kind}, expected a list of numbers (one per completion)"
    if isinstance(out, np.ndarray) or (hasattr(out, "__array__") and not isinstance(out, Sequence)):
        try:
            arr = np.asarray(out)
        except Exception as e:  # noqa: BLE001 - any array-like that does not convert
            return f"returned a {kind} that is not an array ({type(e).__name__})"
        if arr.ndim != 1 or arr.dtype.kind not in "biuf":
            return (
                f"returned a {kind} of shape {list(arr.shape)} and dtype {arr.dtype}, "
                "expected a 1-D array of real numbers"
            )
        return [float(x) for x in arr.tolist()]
    if not isinstance(out, (list, tuple)):
        return f"returned a {kind}, expected a list of numbers (one per completion)"
    vals = []
    for i, x in enumerate(out):
        if not isinstance(x, numbers.Real) or isinstance(x, (np.datetime64, np.timedelta64)):
            return (
                f"returned a {kind} whose item {i} is a {type(x).__name__} ({_short(x)}), "
                "expected real numbers"
            )
        vals.append(float(x))
    return vals


def check_values(
    vals: list[float], n: int, clip: tuple[float, float] | None = None
) -> tuple[list[float] | None, str | None]:
    """(values, None) if ``vals`` are ``n`` usable (clipped to ``clip``), else (None, why)."""
    if len(vals) != n:
        return None, f"returned {len(vals)} values for {n} samples"
    nan = [x for x in vals if math.isnan(x)]
    if nan:
        return None, f"returned NaN ({len(nan)} of {n} values)"
    if clip is not None:
        lo, hi = clip
        return [min(max(x, lo), hi) for x in vals], None
    big = [x for x in vals if not abs(x) <= MAX_ABS_REWARD]
    if big:
        return None, (
            f"returned values outside ±{MAX_ABS_REWARD:g} "
            f"({', '.join(f'{x:g}' for x in big[:3])}); set reward.clip: [lo, hi] to clip them"
        )
    return vals, None


def check_clip(clip: object) -> tuple[float, float] | None:
    """``reward.clip`` as ``(lo, hi)`` (None: no clipping); one-line ValueError naming the key."""
    if clip is None:
        return None
    ok = isinstance(clip, (list, tuple)) and len(clip) == 2 and all(_is_number(x) for x in clip)
    if not ok:
        raise ValueError(f"reward.clip: expected [lo, hi] (two numbers) or null, got {clip!r}")
    lo, hi = float(clip[0]), float(clip[1])  # type: ignore[index]
    if not (-MAX_ABS_REWARD <= lo < hi <= MAX_ABS_REWARD):
        raise ValueError(
            f"reward.clip: need -{MAX_ABS_REWARD:g} <= lo < hi <= {MAX_ABS_REWARD:g}, got {clip!r}"
        )
    return lo, hi


def _short(x: object) -> str:
    s = repr(x)
    return s if len(s) <= 40 else s[:37] + "..."


EXACT_MATCH = "dlc_jax.data.rewards:exact_match"
MATH_VERIFY = "dlc_jax.data.rewards:math_verify"
_FN_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_SPEC_KEYS = ("fn", "weight", "kwargs")
_EXACT_MATCH_OPTIONS = ("correct", "incorrect", "format_bonus", "strict_format")  # in RewardConfig
# metric tags of the runner itself (reward/errors ...), not usable as reward names
RESERVED_NAMES = frozenset({"errors", "timeouts", "seconds", "mean", "std", "total"})


@dataclasses.dataclass(frozen=True)
class RewardFnSpec:
    """One weighted reward: ``name`` (metric tag ``reward/<name>``), ``fn`` (``module:function``),
    ``weight`` (its factor in the total) and ``kwargs`` (extra keyword arguments of every call)."""

    name: str
    fn: str
    weight: float = 1.0
    kwargs: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RewardConfig:
    """The ``reward`` section (keys: docs/CONTRACTS.md). ``fns`` (``NAME: {fn, weight, kwargs}`` or
    ``NAME: module:function``), when non-empty, replaces ``fn`` with a weighted sum. ``timeout_s``
    bounds a chunk's call, then samples are re-scored one by one (``sample_timeout_s`` each);
    ``correct`` ... ``strict_format``: options of the built-in exact_match."""

    fn: str = EXACT_MATCH
    fns: dict = dataclasses.field(default_factory=dict)
    workers: int = 2
    timeout_s: float = 60.0
    sample_timeout_s: float = 10.0
    clip: list | None = None
    max_failed_fraction: float = 0.9
    window: int = 10
    correct: float = 1.0
    incorrect: float = 0.0
    format_bonus: float = 0.0
    strict_format: str = r"-?\d+"

    def __post_init__(self):
        if self.workers < 1:
            raise ValueError(f"reward.workers must be >= 1, got {self.workers}")
        for t in (self.timeout_s, self.sample_timeout_s):
            if not t > 0 or not math.isfinite(t):
                raise ValueError(
                    "reward.timeout_s and reward.sample_timeout_s must be finite and > 0"
                )
        check_clip(self.clip)
        f = self.max_failed_fraction
        if not _is_number(f) or not 0.0 <= f <= 1.0:
            raise ValueError(f"reward.max_failed_fraction must be in [0, 1], got {f!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"reward.window must be an integer >= 1, got {self.window!r}")
        for key in _EXACT_MATCH_OPTIONS[:3]:  # the numbers
            _finite(f"reward.{key}", getattr(self, key))
        try:
            re.compile(self.strict_format)
        except re.error as e:
            raise ValueError(f"reward.strict_format: bad regex {self.strict_format!r}: {e}") from e
        self.specs()  # validates fn / fns

    def exact_match_options(self) -> dict:
        return {k: getattr(self, k) for k in _EXACT_MATCH_OPTIONS}

    def specs(self) -> list[RewardFnSpec]:
        """The rewards to run, validated (one-line ValueError naming the key)."""
        if not self.fns:
            _check_fn_path("reward.fn", self.fn)
            kw = self.exact_match_options() if self.fn == EXACT_MATCH else {}
            return [RewardFnSpec(name=self.fn.rsplit(":", 1)[1], fn=self.fn, kwargs=kw)]
        out = []
        for name, entry in self.fns.items():
            key = f"reward.fns.{name}"
            if isinstance(entry, str):
                entry = {"fn": entry}
            if not isinstance(entry, dict):
                raise ValueError(
                    f"{key}: expected 'module:function' or a mapping with {list(_SPEC_KEYS)}"
                )
            extra = sorted(set(entry) - set(_SPEC_KEYS))
            if extra:
                raise ValueError(f"{key}: unknown keys {extra} (known: {list(_SPEC_KEYS)})")
            if "fn" not in entry:
                raise ValueError(f"{key}: missing 'fn: module:function'")
            if str(name) in RESERVED_NAMES:
                raise ValueError(
                    f"{key}: the name is reserved for a metric (reserved: {sorted(RESERVED_NAMES)})"
                )
            _check_fn_path(f"{key}.fn", entry["fn"])
            w = _finite(f"{key}.weight", entry.get("weight", 1.0))
            kw = entry.get("kwargs") or {}
            if not isinstance(kw, dict):
                raise ValueError(f"{key}.kwargs: expected a mapping, got {kw!r}")
            out.append(RewardFnSpec(str(name), entry["fn"], float(w), dict(kw)))
        return out


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(key: str, v):
    """``v`` when it is a finite number, else a one-line ValueError naming ``key``."""
    if not _is_number(v) or not math.isfinite(v):
        raise ValueError(f"{key}: expected a finite number, got {v!r}")
    return v


def _check_fn_path(key: str, path) -> None:
    if not isinstance(path, str) or not _FN_RE.match(path):
        raise ValueError(f"{key}: expected 'package.module:function', got {path!r}")


def resolve_fn(path: str) -> Callable:
    """The function named by ``package.module:function``; one-line ValueError when not found."""
    mod_name, _, fn_name = path.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - any import failure of user code is reported the same way
        raise ValueError(
            f"cannot import reward module {mod_name!r} ({type(e).__name__}: {e})"
        ) from e
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise ValueError(f"reward module {mod_name!r} has no function {fn_name!r}")
    return fn


def _exact_match_one(completion: str, answer: str) -> bool:
    gold = parse_number(answer)
    cand = candidate_answer(completion)
    if cand is None:
        return False
    if gold is None:  # a non-numeric gold: compare normalized text
        return normalize_text(cand) == normalize_text(answer)
    got = parse_number(cand)
    return got is not None and got == gold


def exact_match(
    prompts: list[str],
    completions: list[str],
    answers: list[str],
    *,
    correct: float = 1.0,
    incorrect: float = 0.0,
    format_bonus: float = 0.0,
    strict_format: str = r"-?\d+",
    **metadata,
) -> list[float]:
    """``correct`` when the response's candidate answer equals the gold number, else ``incorrect``;
    plus ``format_bonus`` when ``strict_format`` full-matches the stripped response."""
    fmt = re.compile(strict_format) if format_bonus else None
    out = []
    for c, a in zip(completions, answers, strict=True):
        r = correct if _exact_match_one(c, a) else incorrect
        if fmt is not None and fmt.fullmatch(c.strip()):
            r += format_bonus
        out.append(float(r))
    return out


def _exact_match_check(answer: str) -> str | None:
    if parse_number(answer) is None:
        return f"gold answer {answer!r} is not a number (exact_match needs one)"
    return None


exact_match.check_answer = _exact_match_check  # type: ignore[attr-defined]


def exact_match_reward(response: str, answer: str, cfg: RewardConfig | None = None) -> float:
    """One response scored by :func:`exact_match` with ``cfg``'s options (for scripts)."""
    cfg = cfg or RewardConfig()
    gold = answer if parse_number(answer) is not None else extract_answer(answer)  # e.g. "#### 19"
    if gold is None or parse_number(gold) is None:
        raise ValueError(f"reference answer {answer!r} contains no number")
    return exact_match([""], [response], [gold], **cfg.exact_match_options())[0]


def _mv_timeout(seconds: float) -> int | None:
    """math-verify's timeouts use signal.alarm (main thread only): off it they are disabled."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return max(1, int(math.ceil(seconds)))


def _gold_text(answer: str) -> str:
    """Gold answers are usually bare LaTeX/numbers; box them so math-verify parses all of it."""
    if "$" in answer or "\\boxed" in answer or "\\(" in answer or "\\[" in answer:
        return answer
    return "\\boxed{" + normalize_text(answer) + "}"


@functools.lru_cache(maxsize=4096)
def _parse_gold(answer: str, timeout: int | None):
    from math_verify import parse

    return parse(_gold_text(answer), parsing_timeout=timeout)


def math_verify(
    prompts: list[str],
    completions: list[str],
    answers: list[str],
    *,
    correct: float = 1.0,
    incorrect: float = 0.0,
    timeout_s: float = 5.0,
    **metadata,
) -> list[float]:
    """``correct`` when HF math-verify finds the response's final answer equal to the gold one."""
    from math_verify import parse, verify

    t = _mv_timeout(timeout_s)
    out = []
    for c, a in zip(completions, answers, strict=True):
        gold = _parse_gold(a, t)
        pred = parse(c, parsing_timeout=t) if gold else []
        ok = bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=t)
        out.append(float(correct if ok else incorrect))
    return out


def _math_verify_check(answer: str) -> str | None:
    if parse_number(answer) is not None:  # a plain number always parses (fast path at load)
        return None
    if not _parse_gold(answer, _mv_timeout(5.0)):
        return f"gold answer {answer!r} is not parsed by math-verify"
    return None


math_verify.check_answer = _math_verify_check  # type: ignore[attr-defined]
