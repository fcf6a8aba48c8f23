"""docs/bench/PLAN.md and docs/bench/plan_peers.md regenerate from the committed JSONs (issue 30:
"the committed plan table regenerates from a fresh clone"). No compile: `dlc-jax bench plan
--cached-only` and `dlc-jax bench plan-peers --cached-only` render the cached per-row JSONs. A hand
edit of either markdown file, or a cached JSON out of step with the code that renders it, fails
here; regenerate with

    dlc-jax bench plan --size full --cached-only --out docs/bench
    dlc-jax bench plan-peers --size committed --cached-only --out docs/bench

Only the machine line (the load while rendering) and the wall time may differ."""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import shutil
from pathlib import Path

import pytest

from dlc_jax.bench import common, plan_bench, plan_notes, plan_peers
from dlc_jax.plan.hlo_bytes import RULES as HLO_BYTES_RULES
from dlc_jax.rl.vocab_parallel import BACKWARD
from dlc_jax.tpu_flags import DEFAULT_FLAGS

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "docs" / "bench"


def _lines(md: str) -> list[str]:
    return [line for line in md.split("\n") if not line.startswith("- machine: ")]


def _same_markdown(rendered: dict, committed: Path) -> None:
    diff = list(
        difflib.unified_diff(
            _lines(committed.read_text()),
            _lines(common.to_markdown(rendered)),
            f"{committed.name} (committed)",
            f"{committed.name} (rendered from the cached JSONs)",
            lineterm="",
        )
    )
    assert not diff, "\n".join(diff[:60])


def _same_json(rendered: dict, committed: Path) -> None:
    def comparable(r: dict) -> dict:
        return {k: v for k, v in r.items() if k not in ("machine", "wall_s", "_t0")}

    text = json.dumps(rendered, allow_nan=True, default=lambda x: x.tolist())
    assert comparable(json.loads(text)) == comparable(json.loads(committed.read_text()))


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(ROOT)  # the cached cases' keys and the notes name repo-relative paths


def test_plan_md_regenerates_from_the_committed_jsons(in_repo):
    cfg = plan_bench.SIZES["full"]
    res = plan_bench.run(dataclasses.replace(cfg, cached_only=True, write_cache=False))
    assert not [n for n in res["notes"] if n.startswith("not run yet")]
    _same_markdown(res, BENCH / "PLAN.md")
    _same_json(res, BENCH / "PLAN.json")


def test_plan_layout_column_comes_from_the_json(in_repo):
    res = plan_bench.run(
        dataclasses.replace(plan_bench.SIZES["full"], cached_only=True, write_cache=False)
    )
    layouts = {r["log-prob layout"] for r in res["rows"]}
    pattern = r"flattened \(old\)|vocab-parallel /[1-9]\d*( \(autodiff backward\))?"
    assert all(re.fullmatch(pattern, x) for x in layouts), layouts
    row = next(
        r
        for r in res["rows"]
        if (r["model"], r["rows x tokens"]) == ("Qwen3-8B", "64 x 16,384")
        and r["topology"].startswith("v5litepod-64")
    )
    assert row["log-prob layout"].startswith("vocab-parallel /64")
    old = {"analytic_flops": {}, "programs": {"train_step": {"oom": False}}}
    assert plan_bench.layout(old) == "flattened (old)"
    assert plan_notes.stale(old) == "no XLA flags"
    assert plan_notes.stale(dict(old, xla_flags={})) == "other XLA flags"
    flat = dict(old, xla_flags={"LIBTPU_INIT_ARGS": " ".join(DEFAULT_FLAGS)})
    assert plan_notes.stale(flat) == "flattened log-prob chunks"
    vp = dict(flat, analytic_flops={"logprob_vocab_shards": 8})
    assert plan_bench.layout(vp) == "vocab-parallel /8 (autodiff backward)"
    assert plan_notes.stale(vp) == "autodiff log-prob backward"
    walk1 = dict(vp, logprob_backward=BACKWARD)
    assert plan_bench.layout(walk1) == "vocab-parallel /8"
    assert plan_notes.stale(walk1) == "older HBM walk"
    today = dict(walk1, hlo_bytes_rules=HLO_BYTES_RULES)
    assert plan_bench.layout(today) == "vocab-parallel /8" and plan_notes.stale(today) == ""


def test_cached_plan_jsons_are_in_step_with_the_renderer(tmp_path, in_repo):
    """Rendering refreshes each cached JSON's analytic FLOPs and roofline with today's code; the
    committed JSONs must already hold what that writes."""
    shutil.copytree(BENCH / "plan", tmp_path / "plan")
    shutil.copytree(BENCH / "plan_peers", tmp_path / "plan_peers")
    cfg = dataclasses.replace(
        plan_bench.SIZES["full"], cached_only=True, cache_dir=str(tmp_path / "plan")
    )
    plan_bench.run(cfg)
    stale = [
        p.name
        for p in sorted((BENCH / "plan").glob("*.json"))
        if (tmp_path / "plan" / p.name).read_text() != p.read_text()
    ]
    assert not stale, f"re-render and commit: {stale}"


def test_plan_peers_md_regenerates_from_the_committed_jsons(in_repo):
    committed = json.loads((BENCH / "plan_peers.json").read_text())
    rows = tuple(tuple(r) for r in committed["config"]["rows"])
    cfg = dataclasses.replace(plan_peers.PlanPeersConfig(rows=rows), cached_only=True)
    res = plan_peers.run(cfg)
    assert len(res["rows"]) == len(rows)
    _same_markdown(res, BENCH / "plan_peers.md")
    _same_json(res, BENCH / "plan_peers.json")


def test_plan_peers_without_tunix_renders_our_rows_and_says_why(monkeypatch, tmp_path):
    """No tunix where --peer-site points: our rows, the peer columns empty, the install note, and
    no peer target (it raised KeyError on the placeholder peer after compiling our rows)."""
    row = ("1.7B:2", "v5p-16", 8, 4096)
    ours = json.loads(next((BENCH / "plan").glob("1.7B_v5p-16_8x4096_*.json")).read_text())
    monkeypatch.setattr(plan_peers, "peer_available", lambda site: "tunix not importable (x)")
    monkeypatch.setattr(plan_peers, "our_row", lambda cfg, *shape: ours)
    res = plan_peers.run(plan_peers.PlanPeersConfig(rows=(row,), cache_dir=str(tmp_path)))
    assert len(res["rows"]) == 1 and "peer: step peak GiB" not in res["rows"][0]
    assert res["rows"][0]["ours: roofline s (bound)"] != "n/a"
    assert res["notes"][0] == "tunix not importable (x)" and not res["targets"]


def test_the_peers_compute_is_a_grpo_step_with_whole_layer_remat_whatever_ours_runs():
    # ours: 100 = a GRPO step's 60 + remat 15 + chunk recompute 5 + theta_s forward 20
    full = {
        "hardware_flops": 100.0,
        "logprob_chunk_recompute": 5.0,
        "snapshot_forward": 20.0,
        "remat_recompute": 15.0,
        "remat_recompute_full": 15.0,
    }
    assert plan_notes.peer_flops(full) == 75.0
    assert plan_notes.compute_floor({"analytic_flops": full})["ratio"] == 100.0 / 75.0
    # ours under save_dots recomputes 3, not 15: the peer still recomputes its 15
    dots = dict(full, hardware_flops=88.0, remat_recompute=3.0)
    assert plan_notes.peer_flops(dots) == 75.0
    assert plan_notes.compute_floor({"analytic_flops": dots})["ratio"] == 88.0 / 75.0
