"""Analytic FLOPs of one DLC step, and what XLA's cost analysis is expected to see of them.

Convention (PaLM/Megatron MFU): a [m,k]x[k,n] matmul costs 2mkn, backward = 2x forward. Per token
the dense part is 2 x (decoder matmul params + vocabulary projection) forward, so a train step costs
6·N·tokens; attention adds 4·T·hd·H per token per layer forward (the full T x T square, which a
dense/XLA kernel computes; a causal flash kernel such as splash skips about half). On top of that
the hardware does:

* remat recompute: the decoder forward again in the backward pass (policy ``full``; ``save_dots``
  saves the matmuls and recomputes attention; ``save_attn_out`` recomputes the matmuls; none with
  ``none`` / ``save_dots_and_attn_out``);
* the log-prob chunks (``dlc_jax.rl.token_logprobs``) are rematerialized: the vocabulary projection
  runs again in the backward pass;
* the theta_s forward (no gradient) when the batch has lagged tokens (DLC: one per lagged version;
  counted once here).

XLA's ``cost_analysis()`` of the compiled per-device program counts a while/scan body once (not
times its trip count) and counts a custom Pallas kernel (splash attention) as 0. With those two
rules the analytic count predicts XLA's figure (``xla_visible``), which is how the difference
between the two is explained in the plan.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class StepShape:
    rows: int
    seq_len: int
    micro_batches: int
    chunk_size: int  # positions per log-prob chunk (StepConfig.chunk_size)
    chips: int
    remat_policy: str  # none | full | save_dots | save_attn_out | save_dots_and_attn_out
    scanned_layers: bool
    pallas_attention: bool
    snapshot_forward: bool = True  # False for resync.policy=onpolicy (no theta_s forward)


def _parts(cfg, tokens: int, rows: int, seq_len: int) -> dict:
    d, f, h, kv, hd = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    )
    per_layer = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f
    return {
        "layers_fwd": 2.0 * tokens * cfg.num_hidden_layers * per_layer,
        "attn_fwd": 4.0 * cfg.num_hidden_layers * rows * seq_len * seq_len * h * hd,
        "vocab_fwd": 2.0 * tokens * cfg.vocab_size * d,
        "matmul_params": cfg.num_hidden_layers * per_layer + cfg.vocab_size * d,
    }


def _remat_recompute(policy: str, p: dict) -> float:
    return {
        "none": 0.0,
        "full": p["layers_fwd"] + p["attn_fwd"],
        "save_dots": p["attn_fwd"],
        "save_attn_out": p["layers_fwd"],
        "save_dots_and_attn_out": 0.0,
    }.get(policy, 0.0)


def step_flops(cfg, s: StepShape) -> dict:
    """Analytic FLOPs (whole step, all chips) and XLA's expected per-device view of them."""
    tokens = s.rows * s.seq_len
    p = _parts(cfg, tokens, s.rows, s.seq_len)
    train = 3.0 * (p["layers_fwd"] + p["attn_fwd"] + p["vocab_fwd"])
    remat = _remat_recompute(s.remat_policy, p)
    logits_remat = p["vocab_fwd"]
    snapshot = (p["layers_fwd"] + p["attn_fwd"] + p["vocab_fwd"]) if s.snapshot_forward else 0.0
    model = train + snapshot  # useful work (MFU numerator): no recompute
    hardware = train + remat + logits_remat + snapshot
    # XLA's view: per device, loop bodies once, Pallas attention 0. The log-prob map runs per
    # micro-batch over chunks of chunk_size positions; its body is either split over the chips or
    # (when XLA cannot split a chunk over the rows' devices) computed whole on every chip.
    mb_tokens = tokens // s.micro_batches
    n_chunks = max(1, -(-mb_tokens // s.chunk_size))
    layer_div = float(s.micro_batches) * (cfg.num_hidden_layers if s.scanned_layers else 1)
    attn_seen = 0.0 if s.pallas_attention else 1.0
    step_layers = 3.0 * (p["layers_fwd"] + attn_seen * p["attn_fwd"]) + (
        remat if not s.pallas_attention else _remat_recompute(s.remat_policy, dict(p, attn_fwd=0.0))
    )
    step_vocab_body = 4.0 * p["vocab_fwd"] / (s.micro_batches * n_chunks)
    xla_step = step_layers / layer_div / s.chips + step_vocab_body / s.chips
    xla_step_repl = step_layers / layer_div / s.chips + step_vocab_body
    no_remat_layers = 3.0 * (p["layers_fwd"] + attn_seen * p["attn_fwd"])
    xla_step_no_remat = no_remat_layers / layer_div / s.chips + step_vocab_body / s.chips
    snap_chunks = max(1, -(-mb_tokens // s.chunk_size))
    snap_layers = (p["layers_fwd"] + attn_seen * p["attn_fwd"]) / (
        s.micro_batches * (cfg.num_hidden_layers if s.scanned_layers else 1)
    )
    snap_vocab_body = p["vocab_fwd"] / (s.micro_batches * snap_chunks)
    xla_snap = (snap_layers + snap_vocab_body) / s.chips
    return {
        "tokens": tokens,
        "matmul_params": p["matmul_params"],
        "six_n_tokens": 6.0 * p["matmul_params"] * tokens,
        "attention": 3.0 * p["attn_fwd"],
        "remat_recompute": remat,
        "logprob_chunk_recompute": logits_remat,
        "snapshot_forward": snapshot,
        "model_flops": model,
        "hardware_flops": hardware,
        "xla_visible_train_step_per_device": xla_step,
        "xla_visible_train_step_per_device_chunks_replicated": xla_step_repl,
        "xla_visible_train_step_per_device_without_remat": xla_step_no_remat,
        "xla_visible_snapshot_forward_per_device": xla_snap,
        "loops": {
            "micro_batch_scan": s.micro_batches,
            "layer_scan": cfg.num_hidden_layers if s.scanned_layers else 1,
            "logprob_chunks": n_chunks,
        },
        "logprob_chunk_positions": s.chunk_size,
    }


def chunks_replicated(fl: dict, xla_step: float) -> bool:
    """Whether XLA's count of the train step is closer to the log-prob chunks computed whole on
    every chip than split over the chips (the chunk loop then does chips-times the vocabulary
    work)."""
    split = fl["xla_visible_train_step_per_device"]
    repl = fl["xla_visible_train_step_per_device_chunks_replicated"]
    return repl > 1.2 * split and abs(xla_step - repl) < abs(xla_step - split)


def explain(fl: dict, xla_step: float, xla_snap: float, s: StepShape) -> str:
    """One paragraph: why XLA's count differs from the analytic one; the predicted XLA count."""
    repl = chunks_replicated(fl, xla_step)
    key = "xla_visible_train_step_per_device" + ("_chunks_replicated" if repl else "")
    pred = fl[key]
    ratio = xla_step / pred if pred else float("nan")
    loops = fl["loops"]
    why = [f"XLA counts each loop body once: micro-batch scan x{loops['micro_batch_scan']}"]
    if loops["layer_scan"] > 1:
        why.append(f"layer scan x{loops['layer_scan']}")
    why.append(f"log-prob chunk map x{loops['logprob_chunks']} per micro-batch")
    text = "; ".join(why) + "."
    if s.pallas_attention:
        text += " Splash attention is a Pallas kernel, which XLA's cost analysis counts as 0 FLOPs."
    rest = (
        "the rest is elementwise work XLA counts and the analytic count leaves out: norms, "
        "softmax, RoPE, the optimizer update"
        if ratio >= 1
        else "XLA sees less than predicted"
    )
    text += (
        f" Under those rules the analytic count predicts {pred:.3e} FLOPs per device for the "
        f"train step; XLA reports {xla_step:.3e} ({ratio:.2f}x; {rest})."
    )
    no_remat = fl["xla_visible_train_step_per_device_without_remat"]
    if not repl and no_remat < pred and abs(math.log(xla_step / no_remat)) < abs(math.log(ratio)):
        text += (
            f" XLA's count is closer to the step without the remat recompute ({no_remat:.3e}, "
            f"{xla_step / no_remat:.2f}x): the recomputed layer forward is not visible in (or was "
            f"simplified out of) XLA's count of the backward loop; FLOPs/step keeps it."
        )
    best = min(
        (fl[k] for k in fl if k.startswith("xla_visible_train_step_per_device")),
        key=lambda v: abs(math.log(xla_step / v)) if v > 0 and xla_step > 0 else float("inf"),
    )
    if xla_step > 0 and not 0.8 <= xla_step / best <= 1.25:
        text += (
            f" Even the closest of these predictions is {xla_step / best:.2f}x off: the rest of "
            "the difference is not explained here (how XLA counts the nested micro-batch and "
            "layer loops and the partitioned program)."
        )
    if repl:
        text += (
            f" XLA's count matches the log-prob chunks ({fl['logprob_chunk_positions']} "
            "positions x vocabulary) "
            f"being computed whole on every chip rather than split over the chips: the chunk loop "
            f"does up to {s.chips}x the vocabulary projection's work (a micro-batch has fewer "
            "positions "
            f"per chip than one chunk, or XLA could not split the chunk over the rows' devices)."
        )
    return text
