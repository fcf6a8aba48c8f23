"""dlc_jax/experiments imports no module of its own in a circle (issue 31), counting imports
inside functions too: a function-local import that dodges a cycle at import time is still one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dlc_jax.experiments as pkg

pytestmark = pytest.mark.unit

PREFIX = "dlc_jax.experiments."


def _graph() -> dict[str, set[str]]:
    root = Path(pkg.__file__).parent
    names = {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {n: set() for n in names}
    for n in names:
        for node in ast.walk(ast.parse((root / f"{n}.py").read_text())):
            mods: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            for m in mods:
                if m.startswith(PREFIX) and m[len(PREFIX) :].split(".")[0] in names:
                    graph[n].add(m[len(PREFIX) :].split(".")[0])
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_experiments_modules_import_no_cycle():
    assert _cycle(_graph()) is None
