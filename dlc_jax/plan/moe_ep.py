"""Expert parallelism AOT-compiled for TPU: a tiny Qwen3-MoE train step and theta_s forward on an
abstract TPU slice with an `expert` mesh axis, and what the compiler reports per program: per-chip
memory, XLA's FLOPs against the analytic prediction, collective bytes by kind (a ragged all-to-all
at its static buffer), and the analytic dispatch bytes (uniform random routing).

    python -m dlc_jax.plan.moe_ep [--json FILE]   # the rows of docs/bench/moe_ep.md; needs libtpu
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

# tiny Qwen3-MoE: 2 scanned sparse layers, 8 experts top 2 (the shapes of the megablox AOT test)
TINY_MOE: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_experts=8,
    num_experts_per_tok=2,
)
ROWS, PROMPTS, SEQ, MICRO = 16, 4, 128, 2


def _config_yaml(model_dir: Path, fsdp: int, expert: int, dispatch: str, impl: str) -> str:
    return f"""
model: {{path: {model_dir}, param_dtype: float32, compute_dtype: bfloat16, remat: true,
        scan_layers: true, moe_impl: {impl}, moe_dispatch: {dispatch}}}
mesh: {{data: 1, fsdp: {fsdp}, tensor: 1, expert: {expert}}}
sampler: {{n: {ROWS // PROMPTS}, head_k: 4, max_model_len: {SEQ}}}
train: {{batch_prompts: {PROMPTS}, micro_batches: {MICRO}}}
resync: {{max_snapshots: 1}}
"""


def compile_tiny_moe(
    topology: str, *, fsdp: int, expert: int, dispatch: str = "allgather", impl: str = "auto"
) -> dict:
    """The module doc's figures (JSON-able) for `topology` (e.g. 'v5e:2x2'), (fsdp, expert) mesh."""
    import numpy as np

    from dlc_jax.model.config import Qwen3MoeConfig
    from dlc_jax.model.moe_a2a import dispatch_bytes
    from dlc_jax.model.moe_dispatch import resolve_moe_impl
    from dlc_jax.plan.abstract_state import abstract_run, model_config, plan_mesh
    from dlc_jax.plan.compile import compile_run
    from dlc_jax.plan.flops import StepShape, step_flops
    from dlc_jax.plan.report import logprob_split
    from dlc_jax.plan.topology import abstract_devices, parse_topology
    from dlc_jax.trainer.config import load_config
    from dlc_jax.trainer.step import step_config

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny_moe"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(Qwen3MoeConfig(**TINY_MOE).to_hf_dict()))
        cfg_path = Path(tmp) / "cfg.yaml"
        cfg_path.write_text(_config_yaml(model_dir, fsdp, expert, dispatch, impl))
        cfg = load_config(str(cfg_path), [])
        topo = parse_topology(topology, 1)
        mesh, _ = plan_mesh(cfg.mesh, abstract_devices(topo), 1)
        run = abstract_run(cfg, mesh)
        qc = model_config(cfg.model)
    scfg = step_config(cfg)
    programs = {}
    for name, rep in compile_run(run, scfg).items():  # the programs `dlc-jax plan` compiles
        if rep.oom:
            raise RuntimeError(rep.oom)
        d = rep.as_dict()
        keys = ("argument_bytes", "output_bytes", "temp_bytes", "peak_bytes", "xla_flops")
        programs[name] = {k: d[k] for k in (*keys, "collective_bytes", "compile_cpu_s")}
    chips = int(mesh.size)
    split = logprob_split(ROWS // MICRO, SEQ, dict(mesh.shape), qc.vocab_size, cfg.sampler)
    shape = StepShape(
        rows=ROWS,
        seq_len=SEQ,
        micro_batches=MICRO,
        chunk_size=scfg.chunk_size,
        chips=chips,
        remat_policy=run.model.remat_policy,
        scanned_layers=bool(run.model.scanned),
        pallas_attention=True,
        fsdp=mesh.shape["fsdp"],
        vocab_shards=split["vocab_shards"],
        position_shards=split["position_shards"],
    )
    fl = step_flops(qc, shape)
    programs["train_step"]["pred_flops"] = fl["xla_visible_train_step_per_device"]
    programs["snapshot_forward"]["pred_flops"] = fl["xla_visible_snapshot_forward_per_device"]
    # one micro-batch of one MoE layer, uniform random routing: analytic dispatch bytes
    n = ROWS // MICRO * SEQ // chips
    rng = np.random.RandomState(0)
    k, e = TINY_MOE["num_experts_per_tok"], TINY_MOE["num_experts"]
    routing = np.stack(
        [np.stack([rng.choice(e, k, replace=False) for _ in range(n)]) for _ in range(expert)]
    )
    return {
        "topology": topology,
        "mesh": dict(mesh.shape),
        "impl": resolve_moe_impl(qc.moe_impl, mesh),
        "dispatch": dispatch,
        "programs": programs,
        "dispatch_bytes_per_layer": dispatch_bytes(
            routing, devices=expert, num_experts=e, hidden=TINY_MOE["hidden_size"]
        )
        if expert > 1
        else {},
    }


ROWS_TO_COMPILE = (
    ("v5e:2x2", 4, 1, "allgather"),
    ("v5e:2x2", 2, 2, "allgather"),
    ("v5e:2x2", 2, 2, "all_to_all"),
    ("v5e:2x2", 1, 4, "allgather"),
    ("v5e:2x2", 1, 4, "all_to_all"),
)


def markdown(rows: list[dict]) -> str:
    mib = 1 << 20
    lines = [
        "| topology | mesh (fsdp x expert) | dispatch | program | XLA FLOPs / chip | predicted "
        "| XLA/pred | temporaries | peak / chip | collectives (HLO result bytes by kind) "
        "| compile CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for name, p in r["programs"].items():
            coll = ", ".join(
                f"{k} {v / 1024:.0f} KiB" for k, v in sorted(p["collective_bytes"].items())
            )
            lines.append(
                f"| {r['topology']} | {r['mesh']['fsdp']} x {r['mesh'].get('expert', 1)} "
                f"| {r['dispatch']} | {name} | {p['xla_flops']:.3e} | {p['pred_flops']:.3e} "
                f"| {p['xla_flops'] / p['pred_flops']:.2f} | {p['temp_bytes'] / mib:.1f} MiB "
                f"| {p['peak_bytes'] / mib:.1f} MiB | {coll} | {p['compile_cpu_s']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="", help="also write the rows as JSON here")
    a = ap.parse_args(argv)
    rows = []
    for topo, fsdp, expert, dispatch in ROWS_TO_COMPILE:
        rows.append(compile_tiny_moe(topo, fsdp=fsdp, expert=expert, dispatch=dispatch))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
