"""Tool calling in Qwen3's format, and `ToolEnv`: an environment whose tools are Python functions.
Qwen3 (like Hermes / Qwen2.5) writes each call as JSON between tags on lines of their own:
``<tool_call>\n{"name": "calc", "arguments": {"expr": "3+5"}}\n</tool_call>``."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[str]]:
    """(well-formed calls in order, one error per malformed or unclosed ``<tool_call>`` block)."""
    calls, errors = [], []
    for m in _CALL.finditer(text):
        body = m.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            errors.append(f"tool call is not JSON ({e.msg}): {body[:80]!r}")
            continue
        args = obj.get("arguments", {}) if isinstance(obj, dict) else None
        if isinstance(args, str):  # some models emit the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            errors.append(f"tool call needs a string 'name': {body[:80]!r}")
        elif not isinstance(args, dict):
            errors.append(f"tool call 'arguments' must be an object: {body[:80]!r}")
        else:
            calls.append(ToolCall(obj["name"], args))
    if text.count("<tool_call>") > len(calls) + len(errors):
        errors.append("unclosed <tool_call>")
    return calls, errors


def format_tool_call(name: str, arguments: dict) -> str:
    """The text of one call in Qwen3's format (what a demonstration writes)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def function_schema(name: str, description: str, params: dict[str, str]) -> dict:
    """An OpenAI-style function schema with string parameters ``{name: description}``."""
    props = {k: {"type": "string", "description": d} for k, d in params.items()}
    schema = {"type": "object", "properties": props, "required": list(params)}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema},
    }


class ToolEnv:
    """A tool-using environment: a turn with tool calls gets one ``tool`` message per call and
    ``call_reward`` per well-formed call; a turn without is the final answer, scored by `score`.
    Subclasses set ``functions`` and ``tools`` (their schemas), implement `reset` and `score`."""

    functions: dict[str, Callable[..., Any]] = {}
    tools: list[dict] = []
    call_reward: float = 0.0

    def reset(self, row: dict) -> list[dict]:
        raise NotImplementedError

    def score(self, completion: str) -> float:
        raise NotImplementedError

    def step(self, completion: str) -> tuple[list[dict], float, bool]:
        calls, errors = parse_tool_calls(completion)
        if not calls and not errors:
            return [], float(self.score(completion)), True
        out = [{"role": "tool", "content": f"error: {e}"} for e in errors]
        for c in calls:
            fn = self.functions.get(c.name)
            if fn is None:
                out.append({"role": "tool", "content": f"error: unknown tool {c.name!r}"})
                continue
            try:
                out.append({"role": "tool", "content": str(fn(**c.arguments))})
            except Exception as e:  # noqa: BLE001 - a tool's failure is the model's answer
                out.append({"role": "tool", "content": f"error: {type(e).__name__}: {e}"})
        return out, self.call_reward * len(calls), False
