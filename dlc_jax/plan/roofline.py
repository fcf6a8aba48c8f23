"""Roofline step time of a plan (docs/bench/PLAN.md, "Roofline step time"): per program and chip,
compute (the analytic FLOPs, not XLA's count), HBM (XLA's ``bytes accessed`` scaled by the HLO
walk's loop weighting, or by the FLOPs' undercount for programs compiled without it) and FSDP
collectives (weight all-gathers per pass, a float32 gradient reduce-scatter, over ICI) against
the chip's ceilings. A program's time is the largest of the three (perfect overlap: a lower
bound); the step is train step + one theta_s forward. Left out: DCN, host work."""

from __future__ import annotations

# ProgramReport's HLO walk (plan.hlo_bytes): bytes with loop bodies once / times their trips
HLO_BYTES = ("hlo_bytes_once", "hlo_bytes_weighted")


def _fsdp_bytes(params: int, compute_bytes: int, fsdp: int, passes: int, grads: int) -> float:
    """Bytes arriving at one chip: ``passes`` all-gathers of the weights, one reduce-scatter of
    ``grads`` float32 gradients (the trained parameters; LoRA: the adapters)."""
    if fsdp <= 1:
        return 0.0
    share = (fsdp - 1) / fsdp
    return share * (params * compute_bytes * passes + grads * 4)


def program_roofline(
    name: str,
    flops: float,
    prog: dict,
    xla_pred: float,
    chip,
    coll_bytes: float,
    unseen_flops: float = 0.0,
) -> dict:
    """One program's roofline; ``flops``: analytic per chip; ``xla_pred``: the rules' prediction
    of XLA's count, none windowed; ``unseen_flops``: the part XLA never sees (Pallas kernels)."""
    xla = float(prog.get("xla_flops") or 0.0)
    seen = min(xla, xla_pred) if xla and xla_pred else (xla or xla_pred)
    scale = max(flops - unseen_flops, 0.0) / seen if seen else 1.0
    # the program's arguments and outputs (parameters, optimizer state, batch) are read and
    # written outside the loops: counted once, not scaled
    once = float(prog.get("argument_bytes") or 0) + float(prog.get("output_bytes") or 0)
    seen_bytes = float(prog.get("xla_bytes_accessed") or 0.0)
    hlo_once, hlo_weighted = (float(prog.get(k) or 0.0) for k in HLO_BYTES)
    if hlo_once > 0:  # each loop body's bytes times its own trip count (hlo_bytes)
        bytes_scale = hlo_weighted / hlo_once
        hbm = seen_bytes * bytes_scale
    else:  # compiled before the HLO walk: the FLOPs' undercount stands in for the loops'
        bytes_scale = scale
        hbm = max(seen_bytes - once, 0.0) * scale + min(once, seen_bytes)
    t = {
        "compute": flops / chip.peak_bf16_flops,
        "memory": hbm / chip.hbm_bytes_per_s if chip.hbm_bytes_per_s else 0.0,
        "collective": coll_bytes / chip.ici_bytes_per_s if chip.ici_bytes_per_s else 0.0,
    }
    bound = max(t, key=lambda k: t[k])
    return {
        "flops_per_chip": flops,
        "hbm_bytes_per_chip": hbm,
        "collective_bytes_per_chip": coll_bytes,
        "collective_bytes_hlo": prog.get("collective_bytes", {}),
        "loop_scale": scale,
        "bytes_loop_scale": bytes_scale,
        "seconds": {k: round(v, 6) for k, v in t.items()},
        "bound": bound,
        "projected_s": t[bound],
        "name": name,
    }


def roofline(result: dict, chip) -> dict:
    """The roofline of a plan ``result`` (``report.build_plan``'s dict, before this key)."""
    fl, chips = result["analytic_flops"], result["topology"]["chips"]
    c = result["config"]
    params, grads = c["params"], c.get("trained_params", c["params"])
    compute_bytes = 2 if c["compute_dtype"] in ("bfloat16", "float16") else 4
    fsdp = int(result["topology"]["mesh"].get("fsdp", 1))
    # splash attention (Pallas) is invisible to XLA: its FLOPs stay out of the bytes' loop scale
    attn_fwd = fl["attention"] / 3 / chips if "splash" in str(c.get("attention")) else 0.0
    attn_step = attn_fwd * (4 if c.get("remat_policy") in ("full", "save_dots") else 3)
    progs = result["programs"]
    snap_flops = fl["snapshot_forward"] / chips
    step_flops = fl["hardware_flops"] / chips - snap_flops
    out = {
        "chip": {
            "peak_bf16_flops": chip.peak_bf16_flops,
            "hbm_bytes_per_s": chip.hbm_bytes_per_s,
            "ici_bytes_per_s": chip.ici_bytes_per_s,
            "source": chip.bw_source,
        },
        "programs": {
            "train_step": program_roofline(
                "train_step",
                step_flops,
                progs["train_step"],
                fl["xla_visible_train_step_per_device"],
                chip,
                _fsdp_bytes(params, compute_bytes, fsdp, 2, grads),
                attn_step,
            ),
        },
    }
    if snap_flops:
        out["programs"]["snapshot_forward"] = program_roofline(
            "snapshot_forward",
            snap_flops,
            progs["snapshot_forward"],
            fl["xla_visible_snapshot_forward_per_device"],
            chip,
            _fsdp_bytes(params, compute_bytes, fsdp, 1, 0),
            attn_fwd,
        )
    out["step_s"] = sum(p["projected_s"] for p in out["programs"].values())
    out["mfu"] = fl["model_flops"] / (out["step_s"] * chip.peak_bf16_flops * chips)
    return out


def roofline_line(r: dict) -> str:
    parts = [f"{n} {p['projected_s']:.2f} s ({p['bound']}-bound)" for n, p in r["programs"].items()]
    return f"  roofline step {r['step_s']:.2f} s = {' + '.join(parts)}; MFU {100 * r['mfu']:.0f}%"
