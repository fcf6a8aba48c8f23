"""`dlc-jax bench plan-peers`: our DLC step (`dlc-jax plan`: train step + theta_s forward) beside
tunix's GRPO learner step (`peer_grpo_step`, in a subprocess with tunix from ``--peer-site``), both
AOT-compiled for the same TPU slice on this CPU with the same flags. Targets: our step's peak HBM
<= the peer's; our roofline step <= 1.25x the peer's.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from dlc_jax.bench import common
from dlc_jax.bench.peers import import_error, side_env
from dlc_jax.bench.plan_bench import beside_peer, refresh_flops, run_case
from dlc_jax.bench.plan_cases import our_case, peer_json
from dlc_jax.bench.plan_notes import peer_roofline, stale
from dlc_jax.plan.chips import GIB
from dlc_jax.plan.hlo_bytes import RULES as HLO_BYTES_RULES
from dlc_jax.tpu_flags import lacks_defaults

INSTALL = (
    "pip install --target {site} --no-deps google-tunix google-metrax clu wrapt jaxtyping "
    "wadler_lindig perfetto  (or pip install '.[peers]' in a separate venv)"
)
ROWS = (("0.6B", "v5p-8", 8, 4096), ("0.6B", "v5p-8", 8, 32768))
ROWS_1P7B = (("1.7B", "v5p-16", 8, 4096), ("1.7B", "v5p-16", 8, 32768))
TWO_LAYERS = tuple((f"{model}:2", *rest) for model, *rest in ROWS_1P7B + ROWS)  # cut to 2 layers


@dataclasses.dataclass(frozen=True)
class PlanPeersConfig:
    rows: tuple = ROWS_1P7B + ROWS
    cache_dir: str = "docs/bench/plan_peers"
    plan_dir: str = "docs/bench/plan"
    peer_site: str = "/work/peer_site"
    force: bool = False
    timeout_s: int = 3600
    cached_only: bool = False  # render the cached JSONs only: no compile, no tunix import check


SIZES = {
    "full": PlanPeersConfig(),
    "1.7B": PlanPeersConfig(rows=ROWS_1P7B),
    "4k": PlanPeersConfig(rows=(ROWS_1P7B[0], ROWS[0])),
    "1.7B-4k": PlanPeersConfig(rows=(ROWS_1P7B[0],)),
    # both models with 2 of their layers: the per-layer comparison a loaded machine can compile
    "2-layers-4k": PlanPeersConfig(rows=TWO_LAYERS[:1]),
    "2-layers": PlanPeersConfig(rows=TWO_LAYERS[:2]),
    "0.6B-2-layers": PlanPeersConfig(rows=TWO_LAYERS[2:]),
    # the 1.7B and 0.6B rows, each model cut to 2 layers
    "2-layers-all": PlanPeersConfig(rows=TWO_LAYERS),
    # docs/bench/plan_peers.md: the 2-layer rows and the whole models at 8 x 4,096 (tunix's
    # unrolled 28-layer step compiles in about 140 s wall for 0.6B, 9 GB of host memory)
    "committed": PlanPeersConfig(rows=TWO_LAYERS + (ROWS[0], ROWS_1P7B[0])),
}


ARGS = common.Options(
    "plan-peers",
    SIZES,
    ("--force", "force", "recompile cached rows"),
    ("--peer-site", "peer_site", {"default": "", "help": "folder with tunix installed (--target)"}),
    ("--cached-only", "cached_only", "do not compile; render the cached JSONs"),
)
add_args, from_args = ARGS.add_args, ARGS.from_args


def peer_available(site: str) -> str:
    """'' when tunix imports from ``site``, else the one-line reason with the install command."""
    why = import_error("tunix.rl.algo_core, tunix.models.qwen3.model", side_env(site))
    return why and f"tunix not importable ({why}): {INSTALL.format(site=site)}"


def peer_row(cfg: PlanPeersConfig, model: str, topo: str, rows: int, length: int) -> dict:
    out = peer_json(cfg.cache_dir, model, topo, rows, length)
    if cfg.cached_only and not out.exists():
        raise RuntimeError(f"not cached: {out} (--cached-only)")
    # a compile walked with older HBM rules or made with other flags than ours is redone, so
    # both sides count alike
    cached = json.loads(out.read_text()) if out.exists() else None
    old = cached is not None and (
        cached.get("hlo_bytes_rules") != HLO_BYTES_RULES
        or lacks_defaults(cached.get("xla_flags", ""))
    )
    shape = [model, topo, str(rows), str(length)]
    cmd = [sys.executable, "-m", "dlc_jax.bench.peer_grpo_step", *shape]
    return common.cached_run(
        out,
        cmd,
        "peer compile",
        lambda r, proc, run: {**r, "loadavg_start": run["loadavg_start"]},
        force=cfg.force or (old and not cfg.cached_only),
        timeout_s=cfg.timeout_s,
        env=side_env(cfg.peer_site),
    )


def our_row(cfg: PlanPeersConfig, model: str, topo: str, rows: int, length: int) -> dict:
    case = our_case(cfg.cache_dir, model, topo, rows, length)
    if ":" in model:  # "1.7B:2": the model with 2 layers (config.json written next to the cache)
        name, layers = model.split(":")
        from dlc_jax.model import PRESETS

        path = Path(cfg.cache_dir) / "models" / f"Qwen3-{name}-{layers}layers"
        path.mkdir(parents=True, exist_ok=True)
        qcfg = PRESETS[f"Qwen3-{name}"].replace(num_hidden_layers=int(layers))
        text, config = json.dumps(qcfg.to_hf_dict(), sort_keys=True), path / "config.json"
        if not config.exists() or config.read_text() != text:
            config.write_text(text)
    path = Path(cfg.plan_dir) / f"{case.key}.json"
    if cfg.cached_only and not path.exists():
        raise RuntimeError(f"not cached: {path} (--cached-only)")
    old = path.exists() and bool(stale(json.loads(path.read_text())))
    force = cfg.force or (old and not cfg.cached_only)
    # today's analytic FLOPs and roofline over the cached compile
    return refresh_flops(run_case(case, Path(cfg.plan_dir), force, cfg.timeout_s))


COLUMNS = [
    "model",
    "slice",
    "rows x tokens",
    "ours: step peak GiB (+theta_s copies)",
    "peer: step peak GiB",
    "ours: XLA FLOPs/dev step+fwd",
    "peer: XLA FLOPs/dev",
    "ours: bytes accessed step+fwd",
    "peer: bytes accessed",
    "ours: roofline s (bound)",
    "peer: roofline s (bound)",
    "roofline ours/peer",
    "compute floor ours/peer",
]


def _row(model, topo, rows, length, ours, peer: dict | None) -> tuple[dict, dict | None]:
    """A table row, and our roofline beside the peer's (`plan_bench.beside_peer`; None without:
    the peer OOM or not run)."""
    name = f"Qwen3-{model}".replace(":", ", layers: ")
    row = {"model": name, "slice": topo, "rows x tokens": f"{rows} x {length:,}"}
    sp = ours["programs"]["train_step"]
    fw = ours["programs"]["snapshot_forward"]
    row["ours: step peak GiB (+theta_s copies)"] = (
        f"{sp['peak_bytes'] / GIB:.1f} ({ours['peak_bytes_per_chip']['total'] / GIB:.1f})"
    )
    row["ours: XLA FLOPs/dev step+fwd"] = f"{sp['xla_flops']:.2e}+{fw['xla_flops']:.2e}"
    ba = sp.get("xla_bytes_accessed", 0) + fw.get("xla_bytes_accessed", 0)
    row["ours: bytes accessed step+fwd"] = f"{ba:.2e}"
    rl = ours.get("roofline")
    row["ours: roofline s (bound)"] = (
        f"{rl['step_s']:.2f} ({'/'.join(p['bound'] for p in rl['programs'].values())})"
        if rl
        else "n/a"
    )
    if peer is None:  # the peer was not run (tunix missing: a note says why)
        return row, None
    if peer.get("oom"):
        row["peer: step peak GiB"] = "OOM: " + peer["oom"][:80]
        return row, None
    beside = beside_peer(ours, peer) if rl else None
    prl = beside["peer"] if beside else peer_roofline(peer, ours)
    row["peer: step peak GiB"] = f"{peer['peak_bytes'] / GIB:.1f}"
    row["peer: XLA FLOPs/dev"] = f"{peer['xla_flops']:.2e}"
    row["peer: bytes accessed"] = f"{peer['xla_bytes_accessed']:.2e}"
    row["peer: roofline s (bound)"] = f"{prl['projected_s']:.2f} ({prl['bound']})"
    if beside:
        row["roofline ours/peer"] = f"{beside['ratio']:.2f}"
        row["compute floor ours/peer"] = f"{beside['floor']:.2f}"
    return row, beside


def run(cfg: PlanPeersConfig) -> dict:
    res = common.new_result(
        "plan_peers", "Our DLC step vs tunix's GRPO learner step, AOT-compiled for TPU", COLUMNS
    )
    res["config"] = dataclasses.asdict(cfg)
    missing = "" if cfg.cached_only else peer_available(cfg.peer_site)
    if missing:
        res["notes"].append(missing)
    for model, topo, rows, length in cfg.rows:
        try:
            ours = our_row(cfg, model, topo, rows, length)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            res["notes"].append(f"{model} {topo} {rows}x{length}: our plan failed: {e}")
            continue
        peer: dict | None = None
        if not missing:
            try:
                peer = peer_row(cfg, model, topo, rows, length)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                res["notes"].append(f"{model} {topo} {rows}x{length}: peer did not compile: {e}")
                continue
        row, beside = _row(model, topo, rows, length, ours, peer)
        res["rows"].append(row)
        name = f"{model} {rows}x{length:,} on {topo}"
        if peer is not None and peer.get("peak_bytes"):
            peak = ours["programs"]["train_step"]["peak_bytes"] / peer["peak_bytes"]
            res["targets"].append(common.target(f"{name}: our step peak / peer's", peak, 1.0, "<="))
        if beside:
            what = f"{name}: our roofline step / peer's"
            res["targets"].append(common.target(what, beside["ratio"], 1.25, "<="))
    if any(":" in r[0] for r in cfg.rows):
        res["notes"].append(
            "layers: N rows are both models cut to N decoder layers, same widths, vocabulary, "
            "batch, length, slice and flags: tunix runs its layers as a Python loop (unrolled, no "
            "scan), so its full 28-layer step's HLO is about 14x its 2-layer one's; `--size full` "
            "compiles the whole models"
        )
    res["notes"] += [
        "peer: google-tunix 0.1.7 GRPO loss (tunix.rl.algo_core.grpo_loss_fn, beta 0: no "
        "reference forward) on tunix's Qwen3 (FSDP, splash attention, RematConfig.DECODER), "
        "512 prompt + the rest completion tokens per row, AdamW + clip as ours; per-row JSON in "
        f"{cfg.cache_dir}/",
        "ours: the plan's train step (its peak in the column; in brackets the plan's total with "
        "the resident theta_s copies) plus the theta_s forward (DLC's extra program)",
        "XLA FLOPs and bytes accessed are each compile's own count: ours sees each loop body "
        "once (layer scan, log-prob chunk map), tunix's unrolled layers are counted whole, so "
        "compare the roofline columns (which scale ours back to the work)",
        "roofline: each program's largest of compute (analytic FLOPs / bf16 peak), HBM (XLA bytes "
        "accessed with each loop body weighted by its trip count, the same HLO walk for both; "
        "a peer JSON compiled before the walk scales its bytes by its FLOPs undercount) / HBM "
        "bandwidth and ICI (FSDP gather + reduce-scatter / ICI bandwidth): docs/bench/PLAN.md",
        "compute floor: both steps' compute terms alone (the ratio if both ran at the bf16 peak): "
        "ours adds the theta_s forward and recomputes the log-prob chunks' vocabulary projection "
        "in the backward pass, so the roofline ratio falls below it only where the peer's step is "
        "bound by HBM and ours by compute (docs/bench/PLAN.md)",
    ]
    return common.finish(res)
