"""Answer strings: gold answers of a ``data.answer_format``, the candidate answer of a response
(after the last ``####``, else the last ``\\boxed{}``, else the last number not part of an
expression like ``x^2``) and exact numbers (``"1,234"``, ``"-3/4"``, ``"\\frac{1}{2}"``,
``"50\\%"``)."""

from __future__ import annotations

import re
from fractions import Fraction

ANSWER_FORMATS = ("raw", "gsm8k", "boxed")

# one number token; thousands separators only in groups of three ("3, 4" is two numbers)
_NUM = r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?|-?\.\d+"
# a number that is not part of a larger expression: not glued to letters, ^, _, /, \, √, braces
_STANDALONE_RE = re.compile(r"(?<![\w.^_/\\√{])(?:" + _NUM + r")(?![\w^_√}]|\.\d|,\d{3}|/\d)")
_HASH_RE = re.compile(r"####\s*\$?\s*(" + _NUM + ")")
_FRAC_RE = re.compile(r"^(-?)\\[dt]?frac\{(-?[\d.,]+)\}\{(-?[\d.,]+)\}$")
_SQRT_UNICODE_RE = re.compile(r"√\s*(\d+|\w|\([^()]*\))")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces balanced), or None."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None  # unbalanced: no complete box


def _strip_wrappers(s: str) -> str:
    s = s.strip()
    for a, b in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(s) >= len(a) + len(b) and s.startswith(a) and s.endswith(b):
            s = s[len(a) : len(s) - len(b)].strip()
    s = re.sub(r"\\text\{\s*\}", "", s)
    s = s.replace("\\!", "").replace("\\,", "").replace("{,}", ",").replace("\\$", "$")
    return s.removeprefix("$").removesuffix("\\%").removesuffix("%").rstrip(".").strip()


def parse_number(text: str) -> Fraction | None:
    """The exact value of ``text`` when all of it is one number (see module doc); else None."""
    s = _strip_wrappers(text).replace(" ", "")
    m = _FRAC_RE.match(s)
    if m:
        num, den = parse_number(m.group(2)), parse_number(m.group(3))
        if num is None or den is None or den == 0:
            return None
        return -num / den if m.group(1) else num / den
    if not re.fullmatch(_NUM, s):
        return None
    try:
        if "/" in s:
            a, b = s.replace(",", "").split("/")
            return Fraction(Fraction(a), Fraction(b))
        return Fraction(s.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def format_number(v: Fraction) -> str:
    """Canonical text of a number: ``"7"``, ``"12.5"`` (finite decimals), else exact ``"1/3"``."""
    if v.denominator == 1:
        return str(v.numerator)
    d = v.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    if d == 1:  # a finite decimal
        return repr(float(v))
    return f"{v.numerator}/{v.denominator}"


def normalize_text(s: str) -> str:
    """Whitespace-free, wrapper-free text of an answer, ``√2`` written as ``\\sqrt{2}``."""
    s = _SQRT_UNICODE_RE.sub(lambda m: "\\sqrt{" + m.group(1).strip("()") + "}", _strip_wrappers(s))
    return re.sub(r"\s+", "", s)


def candidate_answer(text: str) -> str | None:
    """The answer a response commits to (module doc), as text; None when it has none."""
    m = _HASH_RE.findall(text)
    if m:
        return m[-1]
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    nums = _STANDALONE_RE.findall(text)
    return nums[-1] if nums else None


def extract_answer(text: str) -> str | None:
    """The response's candidate answer normalized (a canonical number, else its text), or None."""
    c = candidate_answer(text)
    if c is None:
        return None
    v = parse_number(c)
    return format_number(v) if v is not None else normalize_text(c)


def extract_gold(text: str, answer_format: str) -> str:
    """The gold answer in a dataset field of ``answer_format``; one-line ValueError when absent."""
    if answer_format == "raw":
        out = text.strip()
    elif answer_format == "gsm8k":
        if "####" not in text:
            raise ValueError(f"no '####' in GSM8K-format answer {_short(text)}")
        out = text.rsplit("####", 1)[1].strip()
    elif answer_format == "boxed":
        b = last_boxed(text)
        if b is None:
            raise ValueError(f"no \\boxed{{...}} in answer {_short(text)}")
        out = b.strip()
    else:
        raise ValueError(f"unknown answer format {answer_format!r} (one of {list(ANSWER_FORMATS)})")
    if not out:
        raise ValueError(f"empty gold answer in {_short(text)}")
    return out


def _short(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else text[: n - 3] + "...")
