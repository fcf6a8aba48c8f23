"""The sampler package's shape (issue 31): no file imports itself back through others in
`dlc_jax.sampler` or the multi-host push (`trainer.distributed`, `trainer.shard_push`), no
`hasattr` probes on collaborators in `trainer/` or `sampler/`, and the one request path shared by
the remote and in-process samplers."""

from __future__ import annotations

import ast
import pathlib

import pytest

import dlc_jax

PKG = pathlib.Path(dlc_jax.__file__).parent


def _imports() -> dict[str, set[str]]:
    """module -> the dlc_jax modules it imports (anywhere in the file, lazily too)."""
    mods = {}
    for f in PKG.rglob("*.py"):
        parts = ("dlc_jax",) + f.relative_to(PKG).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph: dict[str, set[str]] = {}
    for name, f in mods.items():
        here = name.split(".") if f.name == "__init__.py" else name.split(".")[:-1]
        out = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                for a in node.names:
                    out.add(f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
        graph[name] = {m for m in out if m in mods and m != name}
    return graph


def _cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A chain of imports from `start` back to itself, or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in graph[node]:
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


def test_sampler_and_multihost_push_import_no_cycle():
    graph = _imports()
    owned = [m for m in graph if m.startswith("dlc_jax.sampler.")]
    owned += ["dlc_jax.trainer.distributed", "dlc_jax.trainer.shard_push"]
    cycles = [c for m in owned if (c := _cycle_through(graph, m))]
    assert not cycles, cycles[:3]


def test_no_hasattr_probes_in_trainer_or_sampler():
    probes = [
        f"{f.relative_to(PKG)}:{i}"
        for sub in ("trainer", "sampler")
        for f in sorted((PKG / sub).rglob("*.py"))
        for i, line in enumerate(f.read_text().splitlines(), 1)
        if "hasattr(" in line
    ]
    assert not probes, probes


def test_push_shards_takes_only_grpc_clients():
    """A sampler that merely has a `push_messages` attribute is not a gRPC sampler."""
    from dlc_jax.trainer.shard_push import push_shards

    class LooksLikeAClient:
        def push_messages(self, messages):
            raise AssertionError("never reached")

    with pytest.raises(TypeError, match="needs gRPC samplers, not LooksLikeAClient"):
        push_shards(LooksLikeAClient(), model=None, version=1, targets=[0])


def test_one_generate_request_for_remote_and_in_process_samplers():
    from dlc_jax.sampler.client.protocol import generate_request
    from dlc_jax.sampler.service.request_checks import validate_generate
    from dlc_jax.sampler.wire.types import SamplingParams

    params = SamplingParams(n=2, max_tokens=3)
    req = generate_request([[1, 2], [3]], params, None, "r1")
    assert req.request_id == "r1"
    assert [(p.slot_id, list(p.token_ids)) for p in req.prompts] == [(0, [1, 2]), (1, [3])]
    checked, got = validate_generate(
        req, vocab_size=8, max_model_len=16, max_n=2, max_head_k=0, max_prompts=4
    )
    assert checked == [(0, [1, 2]), (1, [3])] and got.n == 2
    with pytest.raises(ValueError, match="slot_ids has 1 entries for 2 prompts"):
        generate_request([[1], [2]], params, [5])
