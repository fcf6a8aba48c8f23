"""Token ids of chat turns, rendered once and appended: the history is never re-tokenized.
`ChatDelta.answer` is the token delta an environment answer adds after an assistant turn ending in
the end-of-turn token, tokenized on its own (it starts right after a special token). A control
token's text in a message is encoded as text (counted in ``escaped``) unless ``allow_special``."""

from __future__ import annotations

import threading
from typing import Any

from dlc_jax.data.text_tokens import encode_chat, encode_text

CHARS_PER_TOKEN = 64  # more characters than this per allowed token: cut before tokenizing
_MARK = "dlc-probe-7f3a"  # the probe assistant turn's content
_PROBE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK}]


class TemplateError(ValueError):
    """The chat template does not end an assistant turn with the end-of-turn token."""


class ChatDelta:
    """eos_id: the end-of-turn token the sampler stops on; tools: OpenAI-style function schemas
    for the opening prompt; enable_thinking: passed to the template."""

    def __init__(
        self,
        tokenizer: Any,
        eos_id: int,
        *,
        tools=None,
        enable_thinking: bool = True,
        allow_special: bool = False,
    ) -> None:
        self.tok = tokenizer
        self.eos_id = int(eos_id)
        self.eos_text = tokenizer.decode([self.eos_id])
        self.tools = tools
        self.enable_thinking = enable_thinking
        self.allow_special = allow_special
        self.escaped = 0  # control tokens kept as text so far (env/escaped_special_tokens)
        self._lock = threading.Lock()
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("env: the model's tokenizer has no chat template")

    @classmethod
    def for_env(cls, cfg: Any, tokenizer: Any, *, enable_thinking: bool = True) -> ChatDelta:
        """The delta of the ``env`` section ``cfg`` (its ``allow_special_tokens``)."""
        eos = int(tokenizer.eos_token_id)
        allow = cfg.allow_special_tokens
        return cls(tokenizer, eos, enable_thinking=enable_thinking, allow_special=allow)

    def _render(self, messages: list[dict], gen: bool, tools=None) -> str:
        kw = {"tools": tools} if tools else {}
        kw.update(tokenize=False, add_generation_prompt=gen, enable_thinking=self.enable_thinking)
        return str(self.tok.apply_chat_template(messages, **kw))

    def encode(self, text: str) -> list[int]:
        """Token ids of text the model generates (a demonstration's ``<tool_call>`` is a token)."""
        return list(self.tok.encode(text, add_special_tokens=False))

    def _count(self, n: int) -> None:
        if n:
            with self._lock:
                self.escaped += n

    def _encode(self, render, messages: list[dict]) -> tuple[list[int], int]:
        return encode_chat(self.tok, render, messages, allow_special=self.allow_special)

    def opening(self, messages: list[dict], tools=None) -> list[int]:
        """Token ids of the opening ``messages`` plus the assistant header."""
        tools = tools if tools is not None else self.tools
        ids, n = self._encode(lambda msgs: self._render(msgs, True, tools), messages)
        self._count(n)
        if not ids:
            raise TemplateError("env: the opening messages rendered to zero tokens")
        return ids

    def answer_text(self, messages: list[dict]) -> str:
        """The text an environment answer adds after the assistant's end-of-turn token: rendered
        after a probe exchange (a template may render the last assistant turn differently)."""
        return self._after_probe(self._render(_PROBE + list(messages), True))

    def _after_probe(self, text: str) -> str:
        at = text.find(_MARK)
        end = text.find(self.eos_text, at + len(_MARK)) if at >= 0 else -1
        if end < 0:
            raise TemplateError(
                "env: the chat template does not render an assistant turn as its content followed "
                f"by {self.eos_text!r}; a token delta cannot be taken"
            )
        return text[end + len(self.eos_text) :]

    def answer(self, messages: list[dict]) -> list[int]:
        """Token delta of an environment answer (after an assistant turn ending in eos)."""
        ids, n = self._answer(messages)
        self._count(n)
        return ids

    def _answer(self, messages: list[dict]) -> tuple[list[int], int]:
        return self._encode(self.answer_text, list(messages))

    def fit_answer(self, messages: list[dict], limit: int, side: str) -> tuple[list[int], bool]:
        """(token delta, truncated): contents cut token-wise on ``side`` ('left' keeps the end)
        until the delta has at most ``limit`` tokens (by characters first past ``CHARS_PER_TOKEN
        * limit``); ([], True) for side 'error' or when the template alone exceeds ``limit``."""
        cap = CHARS_PER_TOKEN * limit
        too_long = any(len(m["content"]) > cap for m in messages)
        if too_long and side == "error":
            return [], True
        if too_long:
            messages = [
                dict(m, content=m["content"][-cap:] if side == "left" else m["content"][:cap])
                for m in messages
            ]
        ids, n = self._answer(messages)
        if len(ids) <= limit:
            self._count(n)
            return ids, too_long
        if side == "error":
            return [], True
        overhead = len(self._answer([dict(m, content="") for m in messages])[0])
        content = [self._content_ids(m["content"]) for m in messages]
        budget = limit - overhead
        while budget > 0:
            each = max(budget // max(len(messages), 1), 0)
            cut = [c[-each:] if side == "left" else c[:each] for c in content] if each else []
            if not cut:
                break
            msgs = [dict(m, content=self.tok.decode(c)) for m, c in zip(messages, cut)]
            ids, n = self._answer(msgs)
            if len(ids) <= limit:
                self._count(n)
                return ids, True
            budget -= max(1, len(ids) - limit)
        return [], True

    def _content_ids(self, text: str) -> list[int]:
        if self.allow_special:
            return list(self.tok.encode(text, add_special_tokens=False))
        return encode_text(self.tok, text)
