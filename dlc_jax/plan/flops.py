"""Analytic FLOPs of one DLC step, and what XLA's cost analysis is expected to see of them.

Convention (PaLM/Megatron MFU): a [m,k]x[k,n] matmul costs 2mkn, backward = 2x forward, so a train
step costs 6·N·tokens; attention adds 4·T·hd·H per token per layer forward (the full T x T square;
splash skips about half). The hardware also does: the remat recompute (per policy, less the MLP
down projection: rule 5); the log-prob chunks' vocabulary projection again in the backward pass
(vocab-parallel over ``StepShape.vocab_shards`` devices, else split along D by XLA); and the
theta_s forward when the batch has lagged tokens (counted once).

How XLA's ``cost_analysis()`` counts the per-device program (evidence: docs/bench/PLAN.md):

1. a while loop's body counts once: the micro-batch scan, the layer scan and the chunk map;
2. a Pallas kernel (splash attention) counts 0;
3. with more than one slice the backward layer body, and the train step's micro-batch body when
   there are several micro-batches, is peeled out of its loop and counts twice;
4. a collective matmul ("windowed einsum", fsdp/2 iterations) is seen at 4/fsdp of its FLOPs;
   which matmuls get one is the compiler's choice, so the count is a range from none
   (``xla_visible_*``) to all layer matmuls windowed (``xla_all_windowed_*``);
5. the remat recompute skips a layer's MLP down projection (the backward pass needs no output).
"""

from __future__ import annotations

import dataclasses

# XLA also counts the elementwise work (norms, softmax, RoPE, optimizer): up to this much above
ELEMENTWISE_SLACK = 1.08
MATCH_LOW = 0.93  # XLA / prediction within [MATCH_LOW, ELEMENTWISE_SLACK]: the prediction matches


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
    fsdp: int = 1  # size of the mesh's fsdp axis (collective matmuls loop over its shards)
    slices: int = 1  # TPU slices (data-parallel over DCN)
    # devices the log-prob path splits the vocabulary over (chunk_size is then per device); 0:
    # flattened chunks split along D by XLA
    vocab_shards: int = 0
    # devices a micro-batch's positions are split over (>= vocab_shards); 0: vocab_shards
    position_shards: int = 0


def model_matmul_params(cfg) -> dict[str, int]:
    """Matmul parameters a token multiplies: {'decoder', 'down', 'vocab'} (MoE: router + top-k)."""
    from dlc_jax.model.registry import family_of

    return family_of(cfg).matmul_params(cfg, active=True)


def layer_matmul_params(cfg) -> int:
    """Matmul parameters one token multiplies in one decoder layer (mean over layers)."""
    return model_matmul_params(cfg)["decoder"] // cfg.num_hidden_layers


def _parts(cfg, tokens: int, rows: int, seq_len: int) -> dict:
    h, hd = cfg.num_attention_heads, cfg.head_dim
    mm = model_matmul_params(cfg)
    return {
        "layers_fwd": 2.0 * tokens * mm["decoder"],
        "attn_fwd": 4.0 * cfg.num_hidden_layers * rows * seq_len * seq_len * h * hd,
        "vocab_fwd": 2.0 * tokens * mm["vocab"],
        # the MLP's down projection: the last matmul of a layer (see _remat_recompute)
        "down_fwd": 2.0 * tokens * mm["down"],
        "matmul_params": mm["decoder"] + mm["vocab"],
    }


def _remat_recompute(policy: str, layers: float, attn: float, down: float) -> float:
    """The layer forward work the backward pass redoes, less the MLP down projection (rule 5)."""
    return {
        "none": 0.0,
        "full": layers - down + attn,
        "save_dots": attn,
        "save_attn_out": layers - down,
        "save_dots_and_attn_out": 0.0,
    }.get(policy, 0.0)


def _xla_view(cfg, s: StepShape, p: dict, mm_seen: float) -> dict:
    """Per-device FLOPs XLA is expected to report (rules 1-3), layer matmuls seen at ``mm_seen``."""
    layer_bodies = 1 if s.scanned_layers else cfg.num_hidden_layers
    per_body = float(s.micro_batches * cfg.num_hidden_layers)  # one layer of one micro-batch
    mm = p["layers_fwd"] / per_body * mm_seen
    down = p["down_fwd"] / per_body * mm_seen
    at = 0.0 if s.pallas_attention else p["attn_fwd"] / per_body
    fwd = mm + at
    bwd = 2.0 * fwd + _remat_recompute(s.remat_policy, mm, at, down)
    peeled = 2.0 if s.slices > 1 and s.scanned_layers else 1.0  # rule 3
    mb_peeled = 2.0 if s.slices > 1 and s.micro_batches > 1 else 1.0  # rule 3
    positions = s.rows * s.seq_len // s.micro_batches
    if s.vocab_shards:  # each device: chunk_size of its positions x all n devices' by V/n
        local = max(1, positions // (s.position_shards or s.vocab_shards))
        c = min(s.chunk_size, local)  # a device with fewer positions maps them in one chunk
        n_chunks = -(-local // c)
        chunk = p["vocab_fwd"] / (s.rows * s.seq_len) * c * s.chips
    else:
        n_chunks = max(1, -(-positions // s.chunk_size))
        chunk = p["vocab_fwd"] / (s.micro_batches * n_chunks)  # one log-prob chunk's projection
    layers_step = layer_bodies * (fwd + peeled * bwd) / s.chips
    layers_snap = layer_bodies * fwd / s.chips
    # the chunk map body: forward + remat forward + backward (2x) = 4 projections, split over the
    # chips or (XLA could not split a chunk) whole on each
    return {
        "train_step": mb_peeled * (layers_step + 4.0 * chunk / s.chips),
        "train_step_chunks_replicated": mb_peeled * (layers_step + 4.0 * chunk),
        "snapshot_forward": layers_snap + chunk / s.chips,
        "n_chunks": n_chunks,
        "peeled": peeled,
        "mb_peeled": mb_peeled,
    }


def windowed_fraction(fsdp: int) -> float:
    """Share of a collective matmul's FLOPs XLA counts: its loop body's 4 of fsdp shards."""
    return min(1.0, 4.0 / fsdp) if fsdp > 1 else 1.0


def step_flops(cfg, s: StepShape) -> dict:
    """Analytic FLOPs (whole step, all chips) and XLA's expected per-device view of them."""
    tokens = s.rows * s.seq_len
    p = _parts(cfg, tokens, s.rows, s.seq_len)
    train = 3.0 * (p["layers_fwd"] + p["attn_fwd"] + p["vocab_fwd"])
    remat = _remat_recompute(s.remat_policy, p["layers_fwd"], p["attn_fwd"], p["down_fwd"])
    logits_remat = p["vocab_fwd"]
    snapshot = (p["layers_fwd"] + p["attn_fwd"] + p["vocab_fwd"]) if s.snapshot_forward else 0.0
    model = train + snapshot  # useful work (MFU numerator): no recompute
    hardware = train + remat + logits_remat + snapshot
    full = _xla_view(cfg, s, p, 1.0)
    win = _xla_view(cfg, s, p, windowed_fraction(s.fsdp))
    return {
        "tokens": tokens,
        "matmul_params": p["matmul_params"],
        "six_n_tokens": 6.0 * p["matmul_params"] * tokens,
        "attention": 3.0 * p["attn_fwd"],
        "remat_recompute": remat,
        # a GRPO peer's with whole-layer remat, whatever our policy (plan-peers' compute floor)
        "remat_recompute_full": _remat_recompute(
            "full", p["layers_fwd"], p["attn_fwd"], p["down_fwd"]
        ),
        "logprob_chunk_recompute": logits_remat,
        "snapshot_forward": snapshot,
        "model_flops": model,
        "hardware_flops": hardware,
        "xla_visible_train_step_per_device": full["train_step"],
        "xla_visible_train_step_per_device_chunks_replicated": full["train_step_chunks_replicated"],
        "xla_visible_snapshot_forward_per_device": full["snapshot_forward"],
        "xla_all_windowed_train_step_per_device": win["train_step"],
        "xla_all_windowed_snapshot_forward_per_device": win["snapshot_forward"],
        "loops": {
            "micro_batch_scan": s.micro_batches,
            "layer_scan": cfg.num_hidden_layers if s.scanned_layers else 1,
            "logprob_chunks": full["n_chunks"],
            "backward_layer_bodies_counted": int(full["peeled"]) if s.scanned_layers else 0,
            "micro_batch_bodies_counted": int(full["mb_peeled"]),
            "collective_matmul_iterations": max(1, s.fsdp // 2),
        },
        # positions of one chunk (vocab-parallel: over the vocab_shards devices) and the devices
        "logprob_chunk_positions": s.chunk_size * max(1, s.vocab_shards),
        "logprob_vocab_shards": s.vocab_shards,
        "logprob_position_shards": s.position_shards,
    }


def chunks_replicated(fl: dict, xla_step: float) -> bool:
    """Whether XLA's step count is nearer log-prob chunks whole on every chip than split."""
    split = fl["xla_visible_train_step_per_device"]
    repl = fl["xla_visible_train_step_per_device_chunks_replicated"]
    return repl > 1.2 * split and abs(xla_step - repl) < abs(xla_step - split)


def windowed_share(pred: float, all_windowed: float, xla: float) -> float | None:
    """Share (0..1) of layer matmul FLOPs XLA's count implies ran as collective matmuls, or None
    outside the predicted range."""
    if pred <= all_windowed:
        return None
    share = (pred - xla) / (pred - all_windowed)
    return share if -0.05 <= share <= 1.05 else None


def _verdict(name: str, xla: float, pred: float, low: float) -> str:
    """One sentence: XLA's count of a program against the prediction (and the windowed range)."""
    ratio = xla / pred if pred else float("nan")
    text = f"{name}: XLA {xla:.3e}, predicted {pred:.3e} ({ratio:.2f}x)"
    if MATCH_LOW <= ratio <= ELEMENTWISE_SLACK:
        return text + (
            "; matches (XLA also counts the elementwise work: norms, softmax, RoPE, optimizer)"
            if ratio >= 1.0
            else "; matches"
        )
    share = windowed_share(pred, low, xla * (1.0 if ratio < MATCH_LOW else ELEMENTWISE_SLACK))
    if ratio < MATCH_LOW and share is not None:
        return text + (
            f"; the rest is collective matmuls (rule 4): XLA's count implies about "
            f"{100 * min(max(share, 0.0), 1.0):.0f}% of the layer matmul FLOPs ran as windowed "
            f"einsums, which it sees at {low / pred:.2f}x..1x (all windowed would be {low:.3e})"
        )
    return text + f"; NOT explained by the rules above (all windowed would be {low:.3e})"


def explain(fl: dict, xla_step: float, xla_snap: float, s: StepShape) -> str:
    """A paragraph: how XLA counts this step, what that predicts, and where XLA's count lies."""
    repl = chunks_replicated(fl, xla_step)
    key = "xla_visible_train_step_per_device" + ("_chunks_replicated" if repl else "")
    loops = fl["loops"]
    why = [f"XLA counts each loop body once (micro-batch scan x{loops['micro_batch_scan']}"]
    if loops["layer_scan"] > 1:
        why.append(f"layer scan x{loops['layer_scan']}")
    why.append(f"log-prob chunk map x{loops['logprob_chunks']} per micro-batch)")
    text = ", ".join(why) + "."
    if s.pallas_attention:
        text += " Splash attention is a Pallas kernel: 0 FLOPs to XLA."
    if loops.get("backward_layer_bodies_counted", 1) > 1:
        text += (
            f" With {s.slices} slices the compiler peels one backward layer iteration out of the "
            "loop (to overlap the gradient reduction over DCN): the backward layer body counts "
            "twice."
        )
    if loops.get("micro_batch_bodies_counted", 1) > 1:
        text += " It peels one micro-batch of the train step too: that body counts twice."
    if s.fsdp > 2:
        text += (
            f" A collective matmul (windowed einsum over fsdp={s.fsdp}) loops "
            f"{loops['collective_matmul_iterations']}x and counts once."
        )
    low = fl["xla_all_windowed_train_step_per_device"]
    text += " " + _verdict("train step", xla_step, fl[key], low)
    if xla_snap:
        text += "; " + _verdict(
            "theta_s forward",
            xla_snap,
            fl["xla_visible_snapshot_forward_per_device"],
            fl["xla_all_windowed_snapshot_forward_per_device"],
        )
    text += "."
    if repl:
        text += (
            f" The log-prob chunks ({fl['logprob_chunk_positions']} positions x vocabulary) are "
            f"computed whole on every chip rather than split over the chips: the chunk loop does "
            f"up to {s.chips}x the vocabulary projection's work (a micro-batch has fewer positions "
            "per chip than one chunk, or XLA could not split the chunk over the rows' devices)."
        )
    return text
