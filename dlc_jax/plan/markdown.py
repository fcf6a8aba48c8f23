"""Markdown renderings of plans: one plan's section, and the comparison table of many."""

from __future__ import annotations

import math

from dlc_jax.plan.chips import GIB

TABLE_COLUMNS = (
    "model",
    "topology",
    "rows x tokens",
    "micro-batches",
    "remat",
    "fits",
    "peak GiB/chip",
    "HBM left",
    "step temps GiB",
    "FLOPs/step",
    "XLA/pred",
    "roofline step s (bound)",
    "roofline MFU",
    "old step s @eff",
    "compile s (CPU s)",
)


def _row(r: dict) -> dict:
    c, t = r["config"], r["topology"]
    step = r["programs"]["train_step"]
    return {
        "model": c["model"].rstrip("/").split("/")[-1]
        + (f" + LoRA r{c['lora_rank']}" if c.get("lora_rank") else ""),
        "topology": t["name"],
        "rows x tokens": f"{c['rows']} x {c['seq_len']:,}",
        "micro-batches": str(c["micro_batches"]),
        "remat": c["remat_policy"],
        "fits": "yes" if r["fits"] else "**no**",
        "peak GiB/chip": f"{r['peak_bytes_per_chip']['total'] / GIB:.1f}",
        "HBM left": f"{100 * r['hbm_left_fraction']:.0f}%",
        "step temps GiB": ("OOM " + f"{step['oom_required_bytes'] / GIB:.1f}")
        if step["oom"]
        else f"{step['temp_bytes'] / GIB:.1f}",
        "FLOPs/step": f"{r['flops_per_step']:.2e}",
        "XLA/pred": _xla_ratio(r),
        "roofline step s (bound)": _roofline(r),
        "roofline MFU": f"{100 * r['roofline']['mfu']:.0f}%" if "roofline" in r else "n/a",
        "old step s @eff": f"{r['projected_step_s']:.2f} @{100 * r['efficiency']:.0f}%",
        "compile s (CPU s)": f"{r['compile_s']:.0f} ({r.get('compile_cpu_s', 0):.0f})",
    }


def _roofline(r: dict) -> str:
    """The roofline step and each program's bound (c: compute, m: HBM, i: ICI collectives)."""
    rl = r.get("roofline")
    if not rl:
        return "n/a"
    bounds = "/".join(p["bound"][0] for p in rl["programs"].values())
    return f"{rl['step_s']:.2f} ({bounds})"


def _xla_ratio(r: dict) -> str:
    """XLA's per-device count of the train step over the closest analytic prediction of it."""
    xla = r["xla_flops_per_device"]["train_step"]
    preds = [v for k, v in r["analytic_flops"].items() if k.startswith("xla_visible_train_step")]
    if not xla or not preds:
        return "n/a"
    best = min(preds, key=lambda v: abs(math.log(xla / v)) if v > 0 else float("inf"))
    return f"{xla / best:.2f}"


def plans_table(results: list[dict]) -> str:
    out = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    out += ["| " + " | ".join(row[c] for c in TABLE_COLUMNS) + " |" for row in map(_row, results)]
    return "\n".join(out)


def plan_markdown(r: dict) -> str:
    """One plan: the summary row, HBM breakdown, programs, FLOPs and their explanation."""
    res = r["resident_bytes_per_chip"]
    lines = [
        f"### {r['config']['model']} on {r['topology']['name']}",
        "",
        plans_table([r]),
        "",
        "| HBM per chip | GiB |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v / GIB:.2f} |" for k, v in res.items()]
    for name, p in r["programs"].items():
        if p["oom"]:
            lines.append(f"| {name} | out of HBM: {p['oom']} |")
        else:
            lines.append(
                f"| {name}: arguments / outputs / temporaries | {p['argument_bytes'] / GIB:.2f} / "
                f"{p['output_bytes'] / GIB:.2f} / {p['temp_bytes'] / GIB:.2f} |"
            )
    pk = r["peak_bytes_per_chip"]
    lines += [
        f"| peak, train step phase | {pk['train_step_phase'] / GIB:.2f} |",
        f"| peak, theta_s forward phase | {pk['snapshot_forward_phase'] / GIB:.2f} |",
        f"| usable HBM | {r['hbm_bytes_per_chip'] / GIB:.2f} |",
        "",
    ]
    a = r["analytic_flops"]
    lines += [
        f"FLOPs per step (analytic, all chips): {r['flops_per_step']:.3e} = train "
        f"{a['six_n_tokens']:.3e} (6·N·tokens) + attention {a['attention']:.3e} + remat recompute "
        f"{a['remat_recompute']:.3e} + log-prob chunk recompute "
        f"{a['logprob_chunk_recompute']:.3e} + "
        f"theta_s forward {a['snapshot_forward']:.3e}. XLA (per device): train step "
        f"{r['xla_flops_per_device']['train_step']:.3e}, theta_s forward "
        f"{r['xla_flops_per_device']['snapshot_forward']:.3e}. {r['flops_note']}",
        "",
    ]
    if not r["fits"]:
        lines += [f"Does not fit: {r['advice']}", ""]
    return "\n".join(lines)
