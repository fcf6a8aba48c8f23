"""The architecture the code must keep: the layers declared in pyproject.toml (import-linter's
``layers`` contract, `[tool.importlinter]`) and no import cycle between files anywhere in dlc_jax.

import-linter's own ``acyclic_siblings`` contract looks for cycles between the children of a
package (its subpackages squashed), not between files, so the file cycles are found here on its
import graph (grimp, the library it is built on): each strongly connected component of the module
graph is one cycle, named by its chain. Both count every import statement, function-local ones
too: an import moved into a function to dodge a cycle is still one.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"


def _components(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _chain(graph: grimp.ImportGraph, comp: list[str]) -> str:
    """One cycle through ``comp``'s first module, as ``a -> b -> ... -> a`` (each a direct import:
    line numbers from grimp)."""
    first = comp[0]
    nxt = sorted(set(graph.find_modules_directly_imported_by(first)) & set(comp))[0]
    path = [first, *graph.find_shortest_chain(importer=nxt, imported=first)]
    steps = []
    for a, b in zip(path, path[1:]):
        lines = sorted({d["line_number"] for d in graph.get_import_details(importer=a, imported=b)})
        steps.append(f"{a} -> {b} (l.{', l.'.join(map(str, lines))})")
    return f"{', '.join(comp)}:\n    " + "\n    ".join(steps)


def file_cycles(graph: grimp.ImportGraph) -> dict[frozenset[str], str]:
    """{modules of a cycle: its chain} of every import cycle between files of ``graph``."""
    return {frozenset(c): _chain(graph, c) for c in _components(graph)}


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("dlc_jax", cache_dir=None)


def test_dlc_jax_is_the_worktree_graphed(graph):
    import dlc_jax

    assert Path(dlc_jax.__file__).resolve().parent == ROOT / "dlc_jax"
    assert "dlc_jax.lora.adapters" in graph.modules


def test_no_import_cycles_between_files(graph):
    cycles = file_cycles(graph)
    assert not cycles, "import cycles between files:\n  " + "\n  ".join(cycles.values())


def test_the_cycle_finder_names_the_chain():
    g = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d"), ("p.e", "p.d")]:
        g.add_import(importer=a, imported=b, line_number=3, line_contents=f"import {b}")
    cycles = file_cycles(g)
    assert list(cycles) == [frozenset({"p.a", "p.b", "p.c"})]
    assert cycles[frozenset({"p.a", "p.b", "p.c"})].split("\n    ") == [
        "p.a, p.b, p.c:",
        "p.a -> p.b (l.3)",
        "p.b -> p.c (l.3)",
        "p.c -> p.a (l.3)",
    ]


def _layers() -> list[str]:
    import tomllib

    cfg = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in cfg if c["type"] == "layers"]
    return [m.strip() for layer in layers for m in layer.replace(":", "|").split("|")]


def test_every_part_of_dlc_jax_is_in_a_layer(graph):
    parts = set(graph.find_children("dlc_jax"))
    assert parts - set(_layers()) == set(), "give these a layer in pyproject.toml"


def test_layers_contract_is_kept():
    """import-linter's contracts of pyproject.toml, as `lint-imports` checks them; the failure
    message is its report: each offending import with its line (or the chain through others)."""
    import importlinter.api  # noqa: F401  (configures import-linter)
    from importlinter.application.use_cases import lint_imports

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        ok = lint_imports(config_filename=str(PYPROJECT), cache_dir=None, no_logo=True)
    report = out.getvalue()
    assert ok, report[report.find("Broken contracts") :] or report
    assert "BROKEN" not in report and "KEPT" in report
