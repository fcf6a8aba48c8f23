"""A calculator tool environment on chain arithmetic (``env.fn:
dlc_jax.env.builtin.calculator:Calculator``): the model adds the terms of a ``prompt`` like
``"3+5+2="`` by calling ``calc`` for the partial sums, then answers ``#### 10``; the final answer
scores ``correct`` when its number equals the row's ``answer``, else ``incorrect``."""

from __future__ import annotations

import ast
import itertools
import operator
import re
import zlib

from dlc_jax.data.answers import candidate_answer, parse_number
from dlc_jax.env.tool_calls import ToolEnv, format_tool_call, function_schema

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_EXPR = re.compile(r"^[0-9+\-* ()]{1,64}$")


def calc(expr: str) -> str:
    """The integer value of ``expr`` (digits, + - *, parentheses; at most 64 characters)."""
    if not isinstance(expr, str) or not _EXPR.match(expr):
        raise ValueError(f"calc takes an expression of digits and + - * ( ), got {expr!r:.40}")

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"calc: unsupported expression {expr!r:.40}")

    return str(ev(ast.parse(expr, mode="eval")))


CALC_SCHEMA = function_schema("calc", "Evaluate an integer expression", {"expr": "e.g. 3+5"})


def terms_of(prompt: str) -> list[int]:
    """``"3+5+2="`` -> ``[3, 5, 2]``."""
    body = prompt.strip().rstrip("=").strip()
    if not re.fullmatch(r"\d+(\+\d+)+", body):
        raise ValueError(f"calculator: expected a prompt like '3+5+2=', got {prompt!r:.60}")
    return [int(x) for x in body.split("+")]


class Calculator(ToolEnv):
    """system: an optional system message (the tiny model runs without one); correct / incorrect:
    rewards of the final answer; call_reward: per well-formed call."""

    tools = [CALC_SCHEMA]

    def __init__(
        self,
        system: str = "",
        correct: float = 1.0,
        incorrect: float = 0.0,
        call_reward: float = 0.0,
        demo_direct: float = 0.0,
    ) -> None:
        if not 0.0 <= demo_direct <= 1.0:
            raise ValueError(f"Calculator: demo_direct must be in [0, 1], got {demo_direct}")
        self.demo_direct = float(demo_direct)
        self.functions = {"calc": calc}
        self.system = system
        self.correct = float(correct)
        self.incorrect = float(incorrect)
        self.call_reward = float(call_reward)
        self.answer = ""

    def reset(self, row: dict) -> list[dict]:
        self.answer = str(row["answer"]).strip()
        sys = [{"role": "system", "content": self.system}] if self.system else []
        return sys + [{"role": "user", "content": str(row["prompt"])}]

    def score(self, completion: str) -> float:
        cand = candidate_answer(completion)
        got = parse_number(cand) if cand is not None else None
        ok = got is not None and got == parse_number(self.answer)
        return self.correct if ok else self.incorrect

    def demonstration(self, row: dict) -> list[str]:
        """The expert's turns for ``row``: ``calc`` on each partial sum, then ``#### total``; for a
        ``demo_direct`` share of the rows (by prompt hash) the total alone, so RL has a choice."""
        prompt = str(row["prompt"])
        terms = terms_of(prompt)
        if zlib.crc32(prompt.encode()) % 1000 < 1000 * self.demo_direct:
            return [f"#### {sum(terms)}"]
        sums = itertools.accumulate(terms)
        turns = [format_tool_call("calc", {"expr": f"{a}+{t}"}) for a, t in zip(sums, terms[1:])]
        return turns + [f"#### {sum(terms)}"]
