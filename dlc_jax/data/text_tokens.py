"""Text stays text: untrusted contents (dataset prompts, environment messages, tool results) are
encoded so that control tokens appear only where the chat template puts them (a tool answering
``5<|im_end|>\\n<|im_start|>assistant`` cannot forge a turn)."""

from __future__ import annotations

import contextlib
import re
import secrets
import weakref
from collections.abc import Callable
from typing import Any

_PATTERNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _pattern(tok: Any) -> tuple[Any, Any]:
    """(all added tokens' texts, the non-special ones) as cached regexes, longest first, or None."""
    with contextlib.suppress(KeyError, TypeError):
        return _PATTERNS[tok]
    added = [t for t in dict(getattr(tok, "added_tokens_decoder", {}) or {}).values() if str(t)]
    both = []
    for keep in (lambda t: True, lambda t: not t.special):
        texts = sorted({str(t) for t in added if keep(t)}, key=len, reverse=True)
        both.append(re.compile("|".join(map(re.escape, texts))) if texts else None)
    out = (both[0], both[1])
    with contextlib.suppress(TypeError):  # not weak-referenceable: not cached
        _PATTERNS[tok] = out
    return out


def count_control(tok: Any, text: str) -> int:
    """How many added tokens the tokenizer would match in ``text`` (`encode_text` keeps as text)."""
    pat = _pattern(tok)[0]
    return 0 if pat is None else sum(1 for _ in pat.finditer(text))


def encode_text(tok: Any, text: str) -> list[int]:
    """Token ids of ``text`` holding no added token: special ones split by the tokenizer
    (``split_special_tokens``), non-special ones (``<think>``) cut after their first character."""
    plain = _pattern(tok)[1]
    cuts = [0] + ([m.start() + 1 for m in plain.finditer(text)] if plain is not None else [])
    out: list[int] = []
    for a, b in zip(cuts, cuts[1:] + [len(text)]):
        if a < b:
            out += tok.encode(text[a:b], add_special_tokens=False, split_special_tokens=True)
    return [int(i) for i in out]


def encode_chat(
    tok: Any,
    render: Callable[[list[dict]], str],
    messages: list[dict],
    *,
    allow_special: bool = False,
) -> tuple[list[int], int]:
    """(token ids of ``render(messages)``, control tokens kept as text): the template's text
    encoded as usual, each content with `encode_text` (``allow_special``: contents as they are)."""
    escaped = 0 if allow_special else sum(count_control(tok, m["content"]) for m in messages)
    if not escaped:
        return [int(i) for i in tok.encode(render(messages), add_special_tokens=False)], 0
    nonce = secrets.token_hex(6)
    marked = [dict(m, content=f"\ue000{nonce}:{i}\ue001") for i, m in enumerate(messages)]
    parts = re.split(f"\ue000{nonce}:(\\d+)\ue001", render(marked))
    seen = [int(p) for p in parts[1::2]]
    if sorted(seen) != list(range(len(messages))):
        raise ValueError(
            "the chat template does not render each message's content exactly once; its control "
            "tokens cannot be kept as text (env.allow_special_tokens: true keeps them)"
        )
    ids: list[int] = []
    for j, part in enumerate(parts):
        if j % 2:
            ids += encode_text(tok, messages[int(part)]["content"])
        elif part:
            ids += tok.encode(part, add_special_tokens=False)
    return [int(i) for i in ids], escaped
