"""Verifiable rewards: numeric-answer extraction (GSM8K style) and exact-match scoring.

Extraction order: ``#### 42`` (GSM8K), then ``\\boxed{42}`` (last one), then the last number in the
text. Numbers are normalized (thousands separators removed, ``42.0`` -> ``42``) before comparison.
"""

from __future__ import annotations

import dataclasses
import re
from fractions import Fraction

_NUM = r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+"
_HASH_RE = re.compile(r"####\s*(" + _NUM + ")")
_BOXED_RE = re.compile(r"\\boxed\{\s*([^{}]*)\s*\}")
_NUM_RE = re.compile(_NUM)


def normalize_number(s: str) -> str | None:
    """Canonical string of a number (``"1,234.50"`` -> ``"1234.5"``, ``"7.0"`` -> ``"7"``); None if not a number."""
    s = s.strip().replace(",", "").rstrip(".")
    if s.startswith("$"):
        s = s[1:]
    try:
        v = Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    if v.denominator == 1:
        return str(v.numerator)
    return repr(float(v))


def extract_answer(text: str) -> str | None:
    """The normalized numeric answer in ``text``, or None when there is none."""
    m = _HASH_RE.findall(text)
    if m:
        return normalize_number(m[-1])
    boxed = _BOXED_RE.findall(text)
    if boxed:
        nums = _NUM_RE.findall(boxed[-1])
        if nums:
            return normalize_number(nums[-1])
    nums = _NUM_RE.findall(text)
    if nums:
        return normalize_number(nums[-1])
    return None


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """correct: reward for a matching answer; format_bonus: added when the response is well formed
    (``strict_format`` regex full-matches the stripped response); incorrect: reward otherwise."""

    correct: float = 1.0
    incorrect: float = 0.0
    format_bonus: float = 0.0
    strict_format: str = r"-?\d+"


def exact_match_reward(response: str, answer: str, cfg: RewardConfig = RewardConfig()) -> float:
    """Reward of one response against the reference ``answer`` (a number, or GSM8K text with ####)."""
    ref = extract_answer(answer)
    if ref is None:
        raise ValueError(f"reference answer {answer!r} contains no number")
    got = extract_answer(response)
    r = cfg.correct if got is not None and got == ref else cfg.incorrect
    if cfg.format_bonus and re.fullmatch(cfg.strict_format, response.strip()):
        r += cfg.format_bonus
    return float(r)
