"""The narrative sections of docs/bench/PLAN.md (`dlc-jax bench plan`, issue 30): markdown
templates in ``plan_notes.md`` filled with the committed plans' figures (`issue30_sections`), and
the peer comparison's arithmetic (`peer_flops`, `compute_floor`, `peer_roofline`)."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from importlib import resources

from dlc_jax.plan.chips import GIB
from dlc_jax.plan.hlo_bytes import RULES as HLO_BYTES_RULES
from dlc_jax.rl.vocab_parallel import BACKWARD
from dlc_jax.tpu_flags import lacks_defaults


@functools.cache
def sections() -> dict[str, str]:
    """``plan_notes.md``'s sections by name (each runs to the next "<!-- NAME -->" line, one newline
    dropped), read on first use."""
    text = resources.files("dlc_jax.bench").joinpath("plan_notes.md").read_text()
    found = re.findall(r"^<!-- (\w+) -->\n(.*?)(?=^<!-- \w+ -->|\Z)", text, re.M | re.S)
    return {name: body[:-1] for name, body in found}


def _roof_peak(plan: dict) -> str:
    """'0.44 (compute / compute), 4.5': roofline step, train step / theta_s forward bound, GiB."""
    progs = plan["roofline"]["programs"]
    bounds = " / ".join(progs[k]["bound"] for k in ("train_step", "snapshot_forward"))
    gib = plan["peak_bytes_per_chip"]["total"] / GIB
    return f"{plan['roofline']['step_s']:.2f} ({bounds}), {gib:.1f}"


def _e(x: float, digits: int = 2) -> str:
    """1.245e9-style: mantissa and a bare exponent."""
    m, ex = f"{x:.{digits}e}".split("e")
    return f"{m}e{int(ex)}"


def _e9(x: float) -> str:
    """Bytes as the text writes them: 18.28e9."""
    return f"{x / 1e9:.2f}e9"


def peer_flops(a: dict) -> float:
    """A GRPO step's analytic FLOPs (all chips) of our plan's shape: ours less the log-prob chunk
    recompute and the theta_s forward, with whole-layer remat (tunix's RematConfig.DECODER)."""
    remat = a.get("remat_recompute_full", a["remat_recompute"]) - a["remat_recompute"]
    return a["hardware_flops"] - a["logprob_chunk_recompute"] - a["snapshot_forward"] + remat


def compute_floor(plan: dict) -> dict:
    """Ours / the peer if both ran at the bf16 peak (hardware FLOPs over `peer_flops`), and our two
    extras' shares of the peer's work (all chips)."""
    a = plan["analytic_flops"]
    peer = peer_flops(a)
    return {
        "hw": a["hardware_flops"],
        "peer": peer,
        "ratio": a["hardware_flops"] / peer,
        "fwd": a["snapshot_forward"] / peer,
        "chunk": a["logprob_chunk_recompute"] / peer,
    }


def _program_s(plan: dict, program: str) -> dict:
    return plan["roofline"]["programs"][program]


def _bound_s(p: dict) -> str:
    return f"{p['projected_s']:.3f} ({p['bound']})"


def _headline(v: dict, h: dict) -> None:
    x = h["xla_flops_per_device"]
    v.update(
        h_xla_step=_e(x["train_step"], 4),
        h_xla_fwd=_e(x["snapshot_forward"], 4),
        h_temps=_e9(h["programs"]["train_step"]["temp_bytes"]),
        h_peak=_e9(h["peak_bytes_per_chip"]["total"]),
        h_left=f"{100 * h['hbm_left_fraction']:.0f}%",
        h_roof=f"{h['roofline']['step_s']:.2f}",
        h_old=f"{h['projected_step_s']:.2f}",
        h_eff=f"{100 * h['efficiency']:.0f}%",
        c_cpu=f"{h['compile_cpu_s']:.1f}",
        c_step=f"{h['programs']['train_step']['compile_cpu_s']:.1f}",
        c_fwd=f"{h['programs']['snapshot_forward']['compile_cpu_s']:.1f}",
        c_wall=f"{h['compile_s']:.0f}",
        c_load=f"{(h.get('loadavg') or [float('nan')])[0]:.1f}",
    )
    bounds = {p["bound"] for p in h["roofline"]["programs"].values()}
    v["h_bound"] = f"{bounds.pop()}-bound" if len(bounds) == 1 else "mixed bounds"
    for tag, prog, digits in (("step", "train_step", 2), ("fwd", "snapshot_forward", 3)):
        s = _program_s(h, prog)["seconds"]
        v[f"h_{tag}_c"] = f"{s['compute']:.2f}"
        v[f"h_{tag}_m"] = f"{s['memory']:.2f}"
        v[f"h_{tag}_i"] = f"{s['collective']:.{digits}f}"


def _two_layer(v: dict, tag: str, ours: dict, beside: dict) -> None:
    """The vocab-parallel 1.7B:2 rows beside the peer (t4_*, t32_*; ``beside``: {} without)."""
    ratio, peer = beside.get("ratio"), beside.get("peer")
    v.update(
        {
            f"{tag}_step": _bound_s(_program_s(ours, "train_step")),
            f"{tag}_fwd": _bound_s(_program_s(ours, "snapshot_forward")),
            f"{tag}_ratio": "n/a" if ratio is None else f"{ratio:.2f}",
            f"{tag}_peak": _e9(ours["programs"]["train_step"]["peak_bytes"]),
            f"{tag}_total": _e9(ours["peak_bytes_per_chip"]["total"]),
            f"{tag}_peer": "n/a" if peer is None else _bound_s(peer),
        }
    )
    for term, key in (("m", "memory"), ("c", "compute")):
        v[f"{tag}_peer_{term}"] = "n/a" if peer is None else f"{peer['seconds'][key]:.3f}"


def _floor_fields(v: dict, tag: str, plan: dict, digits: int) -> None:
    f = compute_floor(plan)
    v.update(
        {
            f"{tag}_ratio": f"{f['ratio']:.{digits}f}",
            f"{tag}_fwd": f"+{f['fwd']:.{digits}f}",
            f"{tag}_chunk": f"+{f['chunk']:.{digits}f}",
            f"{tag}_hw": _e(f["hw"], 3),
            f"{tag}_peer": _e(f["peer"], 3),
        }
    )


def _tightest(v: dict, e: dict, table: list[dict]) -> None:
    """The 8B v5litepod-64 x 16,384 row, and how many rows predate today's trainer."""
    v.update(
        e_total=_e9(e["peak_bytes_per_chip"]["total"]),
        e_left=f"{100 * e['hbm_left_fraction']:.0f}%",
        e_temps=_e9(e["programs"]["train_step"]["temp_bytes"]),
    )
    n = sum(1 for r in table if stale(r))
    v["stale_rows"] = (
        f"{n} of the table's {len(table)} rows predate today's trainer (`plan_notes.stale`; "
        "`dlc-jax bench plan --stale` recompiles them)."
        if n
        else f"All {len(table)} rows of the table were compiled with today's trainer."
    )


def vocab_parallel(plan: dict) -> int:
    """The devices the plan's log-prob chunks split the vocabulary over (rl.vocab_parallel), 0 when
    it was compiled with the flattened chunks (the old layout, or its top-k / top-p fallback)."""
    return int(plan["analytic_flops"].get("logprob_vocab_shards") or 0)


def stale(plan: dict) -> str:
    """Why a cached plan no longer shows today's trainer ('' when it does): its XLA flags, log-prob
    layout, log-prob backward or HBM walk rules differ from today's."""
    if "xla_flags" not in plan:
        return "no XLA flags"
    if lacks_defaults(plan["xla_flags"].get("LIBTPU_INIT_ARGS", "")):
        return "other XLA flags"
    if not vocab_parallel(plan) and not plan["programs"]["train_step"]["oom"]:
        return "flattened log-prob chunks"
    if vocab_parallel(plan) and plan.get("logprob_backward") != BACKWARD:
        return "autodiff log-prob backward"
    if plan.get("hlo_bytes_rules") != HLO_BYTES_RULES:
        return "older HBM walk"
    return ""


def issue30_sections(
    plans: Mapping[str, dict], peer_ratios: Mapping[str, dict], table: list[dict]
) -> list[str]:
    """The issue-30 sections filled from ``plans`` by role (`plan_bench._issue30_notes`),
    ``peer_ratios`` by role ({"peer": tunix's roofline, "ratio", "floor", "bound"}) and ``table``,
    the plans of every row of the table."""
    v: dict[str, str] = {}
    _headline(v, plans["headline"])
    for tag, role in (
        ("head", "headline"),
        ("f17", "full_1.7B_4k"),
        ("v5e", "v5e_1.7B_4k"),
        ("8b", "8B_shipped"),
        ("moe", "moe"),
    ):
        v[f"w_{tag}"] = _roof_peak(plans[role])
    for tag, role in (("t4", "1.7B:2_4k"), ("t32", "1.7B:2_32k")):
        _two_layer(v, tag, plans[role], peer_ratios.get(role, {}))
    for tag, role in (("s4", "0.6B:2_4k"), ("s32", "0.6B:2_32k")):
        pr = peer_ratios.get(role, {})
        v[f"{tag}_ratio"] = f"{pr['ratio']:.2f}" if pr else "n/a"
        v[f"{tag}_floor"] = f"{pr['floor']:.2f}" if pr else "n/a"
        v[f"{tag}_bound"] = pr.get("bound", "n/a")
    full_models = {name: peer_ratios.get(f"full_{name}_4k") for name in ("1.7B", "0.6B")}
    full = [
        f"{name} {pr['ratio']:.2f}x (floor {pr['floor']:.2f}, ours {pr['bound']}, the peer "
        f"{pr['peer']['bound']}-bound)"
        for name, pr in full_models.items()
        if pr
    ]
    v["full_rows"] = (
        f"The whole models beside tunix at 8 x 4,096: {'; '.join(full)}. Tunix unrolls its layers, "
        "so its 28-layer step is a far larger compile (200-290 s wall here); the 32,768-token rows "
        "are not compiled at full depth: the peer's f32 [8, 32,768, 151,936] logits alone are "
        "19.9e9 bytes per chip on v5p-16 and 39.8e9 on v5p-8."
        if full
        else "The full-depth peer rows are not compiled: tunix unrolls its layers."
    )
    _floor_fields(v, "f4", plans["1.7B:2_4k"], 2)
    _floor_fields(v, "f32", plans["1.7B:2_32k"], 2)
    for tag, role in (("F1", "headline"), ("F2", "full_1.7B_4k"), ("F3", "full_0.6B_4k")):
        _floor_fields(v, tag, plans[role], 3)
    _tightest(v, plans["8B_v5e_16k"], table)
    m = plans["moe"]
    bounds = {p["bound"] for p in m["roofline"]["programs"].values()}
    v.update(
        m_roof=f"{m['roofline']['step_s']:.2f}",
        m_bound=f"{'/'.join(sorted(bounds))}-bound",
        m_peak=f"{m['peak_bytes_per_chip']['total'] / GIB:.1f}",
        m_left=f"{100 * m['hbm_left_fraction']:.0f}%",
        m_xla_step=_e(m["xla_flops_per_device"]["train_step"]),
        m_xla_fwd=_e(m["xla_flops_per_device"]["snapshot_forward"]),
        m_wall=f"{m['compile_s']:.0f}",
        m_cpu=f"{m['compile_cpu_s']:.0f}",
    )
    for tag, prog in (("step", "train_step"), ("fwd", "snapshot_forward")):
        sec = _program_s(m, prog)["seconds"]
        v[f"m_{tag}_c"], v[f"m_{tag}_m"] = f"{sec['compute']:.2f}", f"{sec['memory']:.2f}"
    return "\n".join(sections()[k] for k in ("FLAGS", "ROOFLINE", "MOE")).format(**v).split("\n")


def peer_roofline(peer: dict, ours: dict) -> dict:
    """The peer step's roofline with ours' rules: analytic FLOPs of a GRPO step of the same shape
    (train + whole-layer remat recompute; full logits, no log-prob chunk recompute, no theta_s
    forward), XLA's bytes accessed, FSDP collective bytes."""
    from dlc_jax.plan.chips import chip
    from dlc_jax.plan.roofline import _fsdp_bytes, program_roofline

    flops = peer_flops(ours["analytic_flops"]) / peer["chips"]
    coll = _fsdp_bytes(peer["params"], 2, peer["fsdp"], 2, peer["params"])
    # tunix unrolls its layers: no loop but the collective matmuls' hides work from XLA's count
    return program_roofline("grpo_step", flops, peer, flops, chip(peer["chip"]), coll)
