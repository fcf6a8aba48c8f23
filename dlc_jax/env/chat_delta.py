"""Token ids of chat turns, rendered once and appended: the history is never re-tokenized.

`ChatDelta.opening(messages)` renders the opening messages with the tokenizer's chat template (and
the environment's tool schemas) plus the assistant header. `ChatDelta.answer(messages)` is the
token delta an environment answer adds after an assistant turn that ended with the end-of-turn
token: the template's text of (the answer + the next assistant header) after the assistant's
end-of-turn token, tokenized on its own. Because that delta starts right after a
special token, tokenizing it alone gives the tokens it has in context (the newline after
``<|im_end|>`` is kept: it belongs to the delta).

Qwen3's ``<think>`` blocks: the generated tokens of every turn stay in the history exactly as
sampled, thinking included; Qwen3's template would drop earlier turns' reasoning when re-rendering
a conversation, but here nothing is re-rendered, so later turns see (and the trainer trains on)
exactly what the sampler produced.
"""

from __future__ import annotations

from typing import Any

_MARK = "dlc-probe-7f3a"  # the probe assistant turn's content
_PROBE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK}]


class TemplateError(ValueError):
    """The chat template does not end an assistant turn with the end-of-turn token."""


class ChatDelta:
    """tokenizer: the HF tokenizer of the model; eos_id: the end-of-turn token the sampler stops
    on; tools: OpenAI-style function schemas for the opening prompt (None: none);
    enable_thinking: Qwen3's switch, passed to the template."""

    def __init__(
        self, tokenizer: Any, eos_id: int, *, tools=None, enable_thinking: bool = True
    ) -> None:
        self.tok = tokenizer
        self.eos_id = int(eos_id)
        self.eos_text = tokenizer.decode([self.eos_id])
        self.tools = tools
        self.enable_thinking = enable_thinking
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("env: the model's tokenizer has no chat template")

    def _render(self, messages: list[dict], gen: bool, tools=None) -> str:
        kw: dict[str, Any] = dict(tokenize=False, add_generation_prompt=gen)
        kw["enable_thinking"] = self.enable_thinking
        if tools:
            kw["tools"] = tools
        return str(self.tok.apply_chat_template(messages, **kw))

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def opening(self, messages: list[dict], tools=None) -> list[int]:
        """Token ids of the opening ``messages`` plus the assistant header."""
        ids = self.encode(self._render(messages, True, tools if tools is not None else self.tools))
        if not ids:
            raise TemplateError("env: the opening messages rendered to zero tokens")
        return ids

    def answer_text(self, messages: list[dict]) -> str:
        """The text an environment answer adds after the assistant's end-of-turn token: the
        template's rendering of (a probe exchange + ``messages`` + the assistant header) after the
        probe assistant turn's end-of-turn token. Only what follows that turn is taken, so a
        template that renders a last assistant turn differently from an earlier one (Qwen3 adds
        an empty ``<think>`` block to the last) still gives the right delta."""
        text = self._render(_PROBE + list(messages), True)
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
        return self.encode(self.answer_text(messages))

    def fit_answer(self, messages: list[dict], limit: int, side: str) -> tuple[list[int], bool]:
        """(token delta, truncated): the answer, its message contents cut token-wise on ``side``
        ('left' keeps the end, 'right' the start) until the delta has at most ``limit`` tokens.
        Side 'error' or an answer whose template tokens alone exceed ``limit``: ([], True)."""
        ids = self.answer(messages)
        if len(ids) <= limit:
            return ids, False
        if side == "error":
            return [], True
        overhead = len(self.answer([dict(m, content="") for m in messages]))
        content = [self.encode(m["content"]) for m in messages]
        budget = limit - overhead
        while budget > 0:
            each = max(budget // max(len(messages), 1), 0)
            cut = [c[-each:] if side == "left" else c[:each] for c in content] if each else []
            if not cut:
                break
            msgs = [dict(m, content=self.tok.decode(c)) for m, c in zip(messages, cut)]
            ids = self.answer(msgs)
            if len(ids) <= limit:
                return ids, True
            budget -= max(1, len(ids) - limit)
        return [], True
