"""Build a pod plan: compile the run's programs for a topology, count what stays in HBM, project the
step time, and say in one line what to change when it does not fit. HBM per chip is the larger of
the train step phase (the step's peak + the theta_s snapshots, ``resync.max_snapshots`` copies of
the trained parameters) and the theta_s forward phase (params + optimizer state + snapshots + batch
+ the forward's outputs and temporaries); the plan fits when that is within usable HBM."""

from __future__ import annotations

import logging
import math
import os
import time

from dlc_jax.plan.chips import GIB
from dlc_jax.plan.hlo_bytes import RULES as HLO_BYTES_RULES
from dlc_jax.plan.resync import project_resync, resync_line, sampler_count
from dlc_jax.plan.roofline import roofline, roofline_line
from dlc_jax.rl.vocab_parallel import BACKWARD as LOGPROB_BACKWARD

log = logging.getLogger(__name__)


def gib(x: float) -> str:
    return f"{x / GIB:.2f} GiB"


def _remat_policy(model) -> str:
    return str(getattr(model, "remat_policy", "full" if getattr(model, "remat", False) else "none"))


def _pallas(qcfg, mesh, compute_dtype) -> bool:
    try:
        from dlc_jax.model.attention import resolve_impl
    except ImportError:
        return False
    return resolve_impl(getattr(qcfg, "attention_impl", "auto"), mesh, compute_dtype) == "splash"


def logprob_split(
    rows: int, seq_len: int, mesh_shape, vocab: int, sampler, slices: int = 1
) -> dict[str, int]:
    """StepShape's vocab_shards (devices the log-prob path splits the vocabulary over, less the data
    axis across slices; 0 for the flattened-chunk fallback: top-k / top-p, or nothing to split) and
    position_shards for a micro-batch of [rows, seq_len] on a mesh of {axis: size}."""
    from dlc_jax.model.sharding import logprob_axes
    from dlc_jax.rl.vocab_parallel import axis_names, truncates

    rows_axes, position_axes = logprob_axes(rows, seq_len, mesh_shape)
    axes = axis_names(rows_axes) + axis_names(position_axes)
    n = math.prod(mesh_shape[a] for a in axes if slices == 1 or a != "data")
    if n <= 1 or truncates(vocab, sampler.top_k, sampler.top_p):
        return {"vocab_shards": 0, "position_shards": 0}
    return {"vocab_shards": n, "position_shards": math.prod(mesh_shape[a] for a in axes)}


def build_plan(cfg, topo, *, efficiency: float = 0.4, nic_gbps: float = 100.0) -> dict:
    """The plan of ``cfg`` on ``topo`` as a JSON-able dict; ``nic_gbps``: for the resync time."""
    from dlc_jax import tpu_flags
    from dlc_jax.plan.abstract_state import (
        abstract_run,
        data_axis_spans_slices,
        param_count,
        per_chip_bytes,
        plan_mesh,
    )
    from dlc_jax.plan.compile import compile_run
    from dlc_jax.plan.flops import StepShape, chunks_replicated, explain, step_flops
    from dlc_jax.plan.topology import abstract_devices
    from dlc_jax.trainer.step import step_config

    # the compiler flags the run on the pod uses (libtpu reads them when it loads, just below)
    flags = compiler_flags(tpu_flags.apply(cfg.plan.libtpu_flags), tpu_flags.backend_loaded())
    t0, c0 = time.perf_counter(), time.process_time()
    mesh, mesh_note = plan_mesh(cfg.mesh, abstract_devices(topo), topo.num_slices)
    run = abstract_run(cfg, mesh)
    scfg = step_config(cfg)
    progs = compile_run(run, scfg)
    compile_s, compile_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    step, snap = progs["train_step"], progs["snapshot_forward"]

    params_b, opt_b, batch_b = (per_chip_bytes(t) for t in (run.params, run.opt_state, run.batch))
    snaps_b = cfg.resync.max_snapshots * per_chip_bytes(run.trained_params)  # LoRA: adapters
    resident = params_b + opt_b + snaps_b + batch_b
    step_total = resident + step.oom_required_bytes if step.oom else snaps_b + step.peak_bytes
    snap_extra = snap.oom_required_bytes if snap.oom else snap.output_bytes + snap.temp_bytes
    snap_total = resident + snap_extra
    peak = max(step_total, snap_total)
    chip = topo.chip
    usable = chip.hbm_usable_bytes
    fits = not step.oom and not snap.oom and peak <= usable

    model = run.model
    policy = _remat_policy(model)
    rows_mb, vocab = run.rows // cfg.train.micro_batches, run.qcfg.vocab_size
    shape = StepShape(
        rows=run.rows,
        seq_len=run.seq_len,
        micro_batches=cfg.train.micro_batches,
        chunk_size=scfg.chunk_size,
        chips=topo.chips,
        remat_policy=policy,
        scanned_layers=bool(getattr(model, "scanned", False)),
        pallas_attention=_pallas(run.qcfg, mesh, cfg.model.compute_dtype),
        snapshot_forward=cfg.resync.policy != "onpolicy",
        fsdp=int(dict(mesh.shape).get("fsdp", 1)),
        slices=topo.num_slices,
        **logprob_split(
            rows_mb, run.seq_len, dict(mesh.shape), vocab, cfg.sampler, topo.num_slices
        ),
    )
    fl = step_flops(run.qcfg, shape)
    peak_flops = chip.peak_bf16_flops * topo.chips
    projected = fl["hardware_flops"] / (peak_flops * efficiency)
    mfu = fl["model_flops"] / (projected * peak_flops)
    # one log-prob chunk's f32 logits on one chip: vocab-parallel [vs x chunk_size, V / vs], else
    # [chunk_size, V] spread over the chips
    vs = shape.vocab_shards
    chunk_logits = (
        scfg.chunk_size * vs * -(-run.qcfg.vocab_size // vs) * 4
        if vs
        else -(-scfg.chunk_size * run.qcfg.vocab_size * 4 // topo.chips)
    )
    result = {
        "config": {
            "model": cfg.model.path or cfg.model.preset,
            "rows": run.rows,
            "seq_len": run.seq_len,
            "tokens": run.rows * run.seq_len,
            "micro_batches": cfg.train.micro_batches,
            "param_dtype": cfg.model.param_dtype,
            "compute_dtype": cfg.model.compute_dtype,
            "remat_policy": policy,
            "scanned_layers": shape.scanned_layers,
            "attention": "splash (Pallas)"
            if shape.pallas_attention
            else str(getattr(run.qcfg, "attention_impl", "dense")),
            "head_k": cfg.sampler.head_k,
            "max_snapshots": cfg.resync.max_snapshots,
            "params": param_count(run.params),
            **_family_fields(run.qcfg),
            "trained_params": param_count(run.trained_params),
            "lora_rank": cfg.lora.rank,
        },
        "topology": {
            "name": topo.name,
            "accelerator_type": topo.accelerator_type,
            "topology": topo.topology_name,
            "slices": topo.num_slices,
            "chips": topo.chips,
            "mesh": dict(mesh.shape),
            "mesh_note": mesh_note,
            "data_axis_spans_slices": data_axis_spans_slices(mesh),
            "chip": chip.generation,
            "chip_source": chip.source,
        },
        "fits": fits,
        "xla_flags": flags,
        "logprob_backward": LOGPROB_BACKWARD,
        "hlo_bytes_rules": HLO_BYTES_RULES,
        "hbm_bytes_per_chip": usable,
        "hbm_published_bytes_per_chip": chip.hbm_published_bytes,
        "peak_bytes_per_chip": {
            "total": peak,
            "train_step_phase": step_total,
            "snapshot_forward_phase": snap_total,
            "train_step": step.peak_bytes,
            "snapshot_forward": snap.peak_bytes,
        },
        "hbm_left_fraction": 1.0 - peak / usable,
        "resident_bytes_per_chip": {
            "params": params_b,
            "optimizer_state": opt_b,
            "theta_s_snapshots": snaps_b,
            "batch": batch_b,
        },
        "logits_chunk_bytes_per_chip": chunk_logits,
        "programs": {k: v.as_dict() for k, v in progs.items()},
        "flops_per_step": fl["hardware_flops"],
        "model_flops_per_step": fl["model_flops"],
        "analytic_flops": fl,
        "xla_flops_per_device": {"train_step": step.xla_flops, "snapshot_forward": snap.xla_flops},
        "logprob_chunks_replicated": not step.oom and chunks_replicated(fl, step.xla_flops),
        "flops_note": explain(fl, step.xla_flops, snap.xla_flops, shape) if not step.oom else "",
        "efficiency": efficiency,
        "peak_bf16_flops_per_chip": chip.peak_bf16_flops,
        "projected_step_s": projected,
        "mfu": mfu,
        "compile_s": compile_s,
        "compile_cpu_s": compile_cpu_s,
        "loadavg": list(os.getloadavg()),
    }
    if not step.oom and not snap.oom:
        result["roofline"] = roofline(result, chip)
        result["roofline_step_s"] = result["roofline"]["step_s"]
    result["resync"] = _resync(cfg, topo, run.qcfg, result, nic_gbps)
    result["batch_replication"] = _batch_replication(cfg, run, mesh)
    if not fits:
        result["advice"] = advice(cfg, topo, result)
    return result


def compiler_flags(libtpu_args: str, backend_was_loaded: bool) -> dict:
    """What the compiles ran with: ``LIBTPU_INIT_ARGS``, ``XLA_FLAGS`` (JAX's XLA), versions."""
    import jax

    from dlc_jax.plan.libtpu import LIBTPU_VERSION

    return {
        "LIBTPU_INIT_ARGS": libtpu_args,
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        "jax": jax.__version__,
        "libtpu": LIBTPU_VERSION,
        # False: libtpu was loaded before the plan set its flags (the earlier load's flags ran)
        "set_before_libtpu_loaded": not backend_was_loaded,
    }


def _resync(cfg, topo, qcfg, result: dict, nic_gbps: float) -> dict:
    return project_resync(
        result["config"]["params"],
        cfg.sampler.dtype,
        sampler_count(cfg.sampler.address),
        max(1, topo.chips // math.prod(topo.chips_per_host_bounds)),  # trainer hosts
        nic_gbps,
        largest_tensor_params=qcfg.vocab_size * qcfg.hidden_size,
        step_s=result.get("roofline_step_s") or result["projected_step_s"],
    )


def _batch_replication(cfg, run, mesh) -> dict:
    """Rows per micro-batch against the batch-sharded chips: ``factor`` > 1 = each chip computes
    that many times its share, with a ``warning`` naming micro-batch counts that split evenly."""
    from dlc_jax.model.sharding import batch_replication

    m = cfg.train.micro_batches
    per_mb = run.rows // m
    factor = batch_replication(per_mb, mesh)
    out = {"rows_per_micro_batch": per_mb, "factor": factor}
    if factor > 1:
        even = [k for k in range(1, run.rows + 1) if run.rows % k == 0]
        even = [k for k in even if batch_replication(run.rows // k, mesh) == 1]
        fix = (
            f"use train.micro_batches in {even}" if even else "use more rows (train.batch_prompts)"
        )
        out["warning"] = (
            f"train.micro_batches={m} leaves {per_mb} rows per micro-batch, which the "
            f"batch-sharded chips cannot split: every chip computes {factor}x its share of every "
            f"micro-batch (model and kernels); {fix}"
        )
    return out


def advice(cfg, topo, r: dict) -> str:
    """One line: by how much the plan is over and what to change."""
    usable = r["hbm_bytes_per_chip"]
    peak = r["peak_bytes_per_chip"]["total"]
    res = r["resident_bytes_per_chip"]
    state = res["params"] + res["optimizer_state"] + res["theta_s_snapshots"]
    over = peak - usable
    head = (
        f"does not fit on {topo.name}: {gib(peak)} per chip needed, {gib(usable)} usable "
        f"(over by {gib(over)}, {100 * over / usable:.0f}%)"
    )
    tips = []
    if state >= usable:
        tips.append(
            f"the state alone (params + optimizer + {cfg.resync.max_snapshots} theta_s copies) is "
            f"{gib(state)}: use more chips (a larger --topology, FSDP over all of them) or fewer "
            f"copies (resync.max_snapshots)"
        )
    else:
        room = usable - state - res["batch"]
        temps = peak - state - res["batch"]
        factor = max(2, math.ceil(temps / max(room, 1)))
        rows, m = r["config"]["rows"], cfg.train.micro_batches
        cands = [k for k in range(m * factor, rows + 1) if rows % k == 0]
        if cands and m < rows:
            tips.append(
                f"train.micro_batches={cands[0]} (now {m}; activations scale with rows per "
                f"micro-batch, {gib(temps)} of them now)"
            )
        if r["config"]["remat_policy"] == "none":
            tips.append("model.remat=true model.remat_policy=full")
        tips.append(f"more chips (a larger --topology; now {topo.chips})")
    return head + "; try " + ", or ".join(tips)


def _family_fields(qcfg) -> dict:
    """The model family and, for a mixture of experts, the matmul parameters a token uses."""
    from dlc_jax.model.registry import family_of

    fam = family_of(qcfg)
    out: dict = {"model_type": fam.model_type}
    if fam.routed_experts:
        out["active_matmul_params"] = fam.matmul_params(qcfg, active=True)["decoder"]
        out["experts"] = f"{qcfg.num_experts_per_tok} of {qcfg.num_experts}"
    return out


def table(r: dict) -> str:
    c, t = r["config"], r["topology"]
    pk = r["peak_bytes_per_chip"]
    res = r["resident_bytes_per_chip"]
    lines = [
        f"plan: {c['model']} ({c['params'] / 1e9:.2f}B params"
        + (f", experts {c['experts']}" if "experts" in c else "")
        + f") on {t['name']}, {t['chips']} chips, mesh "
        f"{t['mesh']}" + (f" ({t['mesh_note']})" if t["mesh_note"] else ""),
        f"  batch {c['rows']} rows x {c['seq_len']} tokens, {c['micro_batches']} micro-batches, "
        f"params {c['param_dtype']}, compute {c['compute_dtype']}, remat {c['remat_policy']}, "
        f"scanned layers {c['scanned_layers']}, attention {c['attention']}, head K={c['head_k']}",
        "",
        f"  {'HBM per chip':<34}{'GiB':>10}",
        *[f"  {k:<34}{v / GIB:>10.2f}" for k, v in res.items()],
    ]
    for name, p in r["programs"].items():
        if p["oom"]:
            lines.append(f"  {name:<34}{'OOM':>10}  {p['oom']}")
            continue
        lines.append(
            f"  {name + ' args/out/temp':<34}{p['argument_bytes'] / GIB:>10.2f}"
            f"{p['output_bytes'] / GIB:>8.2f}{p['temp_bytes'] / GIB:>8.2f}   compile "
            f"{p['compile_s']:.1f} s"
        )
    lines += [
        f"  {'peak: train step phase':<34}{pk['train_step_phase'] / GIB:>10.2f}",
        f"  {'peak: theta_s forward phase':<34}{pk['snapshot_forward_phase'] / GIB:>10.2f}",
        f"  {'usable HBM':<34}{r['hbm_bytes_per_chip'] / GIB:>10.2f}   "
        f"({100 * r['hbm_left_fraction']:.0f}% left)",
        "",
        f"  FLOPs/step {r['flops_per_step']:.3e} (model {r['model_flops_per_step']:.3e}, "
        f"6*N*tokens {r['analytic_flops']['six_n_tokens']:.3e}); XLA per device: step "
        f"{r['xla_flops_per_device']['train_step']:.3e}, theta_s forward "
        f"{r['xla_flops_per_device']['snapshot_forward']:.3e}",
        f"  old projection (kept one release): step {r['projected_step_s']:.2f} s at "
        f"{100 * r['efficiency']:.0f}% of {r['peak_bf16_flops_per_chip'] / 1e12:.0f} TFLOP/s bf16 "
        f"per chip; MFU {100 * r['mfu']:.1f}%",
        f"  compile {r['compile_s']:.1f} s wall, {r['compile_cpu_s']:.1f} s CPU (load "
        f"{r['loadavg'][0]:.1f})",
        "  fits: " + ("yes" if r["fits"] else "NO"),
    ]
    if "roofline" in r:
        lines.insert(-3, roofline_line(r["roofline"]))
    if "resync" in r:
        lines.insert(-2, resync_line(r["resync"]))
    return "\n".join(lines)
