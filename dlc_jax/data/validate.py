"""Data validation at load: fields present and non-empty text, gold answers found in
``data.answer_format`` and accepted by every reward's ``check_answer`` (errors name the row),
prompts longer than ``max_model_len - max_tokens`` dropped, counted and logged."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from dlc_jax.data.answers import extract_gold
from dlc_jax.data.sources import DataError, RowSource

log = logging.getLogger(__name__)

AnswerCheck = Callable[[list[str]], list]  # answers -> per answer an error message or None
_SCALARS = (str, int, float, bool, type(None))


@dataclasses.dataclass
class Example:
    """One usable row: its prompt, gold answer (extracted), source row and extra scalar columns."""

    prompt: str
    answer: str
    row: int
    metadata: dict


@dataclasses.dataclass
class LoadStats:
    rows: int = 0
    used: int = 0
    too_long: int = 0
    longest_prompt_tokens: int = 0
    seconds: float = 0.0


def _text(rec: dict, name: str, kind: str, where: str) -> str:
    if name not in rec:
        raise DataError(
            f"{where}: no field {name!r} (fields: {sorted(rec)}); set data.{kind}_field"
        )
    v = rec[name]
    if v is None or (isinstance(v, str) and not v.strip()):
        raise DataError(f"{where}: empty {kind} field {name!r}")
    if not isinstance(v, (str, int, float)) or isinstance(v, bool):
        raise DataError(f"{where}: {kind} field {name!r} is {type(v).__name__}, expected text")
    return str(v)


def build_examples(
    src: RowSource, *, prompt_field: str, answer_field: str, answer_format: str
) -> list[Example]:
    """Every row as an :class:`Example` (fields present, gold answer found); errors name the row."""
    out, skip = [], (prompt_field, answer_field)
    for i, rec in src.iter_rows():
        where = src.where(i)
        prompt = _text(rec, prompt_field, "prompt", where)
        raw = _text(rec, answer_field, "answer", where)
        try:
            answer = extract_gold(raw, answer_format)
        except ValueError as e:
            raise DataError(f"{where}: {e} (data.answer_format={answer_format})") from None
        meta = {k: v for k, v in rec.items() if k not in skip and isinstance(v, _SCALARS)}
        out.append(Example(prompt=prompt, answer=answer, row=i, metadata=meta))
    return out


def check_answers(
    src: RowSource,
    examples: list[Example],
    answer_check: AnswerCheck | None,
    answer_format: str,
    raw_field: str,
) -> None:
    """DataError at the first gold answer a reward refuses (with how many more there are)."""
    if answer_check is None or not examples:
        return
    msgs = answer_check([e.answer for e in examples])
    bad = [(e, m) for e, m in zip(examples, msgs) if m]
    if not bad:
        return
    e, m = bad[0]
    more = f"; {len(bad) - 1} more rows like it" if len(bad) > 1 else ""
    hint = ""
    if answer_format == "raw" and "####" in str(src.row(e.row).get(raw_field, "")):
        hint = "; answers end in '#### n': set data.answer_format=gsm8k"
    raise DataError(f"{src.where(e.row)}: {m}{more}{hint}")


def filter_too_long(
    src: RowSource,
    examples: list[Example],
    count_tokens: Callable[[list[str]], list[int]],
    max_prompt_tokens: int | None,
    stats: LoadStats,
) -> list[Example]:
    """Examples whose prompt has 1..max_prompt_tokens tokens; the rest dropped, counted, logged."""
    if not examples:
        return examples
    lengths = count_tokens([e.prompt for e in examples])
    keep, dropped = [], []
    for e, n in zip(examples, lengths):
        if n == 0:
            raise DataError(f"{src.where(e.row)}: prompt tokenizes to zero tokens")
        if max_prompt_tokens is not None and n > max_prompt_tokens:
            dropped.append((e, n))
        else:
            keep.append(e)
    stats.longest_prompt_tokens = max(lengths)
    stats.too_long = len(dropped)
    if dropped:
        e, n = dropped[0]
        log.warning(
            "data: dropped %d of %d prompts longer than %d tokens (max_model_len - max_tokens); "
            "first: %s (%d tokens)",
            len(dropped),
            len(examples),
            max_prompt_tokens,
            src.where(e.row),
            n,
        )
    if not keep:
        raise DataError(
            f"{src.name}: every prompt is longer than {max_prompt_tokens} tokens "
            "(sampler.max_model_len - sampler.max_tokens)"
        )
    return keep


def load_examples(
    src: RowSource,
    *,
    prompt_field: str,
    answer_field: str,
    answer_format: str,
    answer_check: AnswerCheck | None = None,
    count_tokens: Callable[[list[str]], list[int]] | None = None,
    max_prompt_tokens: int | None = None,
) -> tuple[list[Example], LoadStats]:
    """Validated, length-filtered examples of ``src`` and what happened (module doc)."""
    t0 = time.time()
    stats = LoadStats(rows=len(src))
    ex = build_examples(
        src, prompt_field=prompt_field, answer_field=answer_field, answer_format=answer_format
    )
    check_answers(src, ex, answer_check, answer_format, answer_field)
    if count_tokens is not None:
        ex = filter_too_long(src, ex, count_tokens, max_prompt_tokens, stats)
    stats.used = len(ex)
    stats.seconds = time.time() - t0
    log.info(
        "data: %s: %d of %d rows usable (%d too long), longest prompt %d tokens, checked in %.1f s",
        src.name,
        stats.used,
        stats.rows,
        stats.too_long,
        stats.longest_prompt_tokens,
        stats.seconds,
    )
    return ex, stats
