# ruff: noqa: E501 (the templates hold markdown lines as they appear in docs/bench/PLAN.md)
"""Narrative sections of docs/bench/PLAN.md (`dlc-jax bench plan`): how the FLOPs are counted, the
compiler flags, the roofline, the vocabulary-parallel log-prob layout, the compute floor beside the
peer, the MoE FLOPs and the compile time (issue 30).

The figures of the committed plans are filled in from their JSON (`issue30_sections`, given the
cached plans by role); what no committed JSON holds any more (an overwritten compile, a measurement
outside the plan) stays in the text with the row and the machine's load it was measured at."""

from __future__ import annotations

from collections.abc import Mapping

from dlc_jax.plan.chips import GIB
from dlc_jax.plan.hlo_bytes import RULES as HLO_BYTES_RULES
from dlc_jax.rl.vocab_parallel import BACKWARD
from dlc_jax.tpu_flags import lacks_defaults

FLOPS_SECTION = [
    "### How the FLOPs are counted",
    "",
    "FLOPs/step is the analytic count of the whole step on all chips: 6·N·tokens for the "
    "matmuls (N = decoder matmul parameters + the vocabulary projection; backward = 2x "
    "forward), the attention score and value matmuls (4·T·head_dim·heads per token per layer, "
    "the full T x T square), the remat recompute (the layer forward again in the backward pass "
    "under remat_policy=full, less the MLP down projection: rule 5), the log-prob chunks' "
    "vocabulary projection again (each chunk is rematerialized) and one theta_s forward. MFU "
    "divides the same count without the recomputes.",
    "",
    "XLA's figure (`cost_analysis()['flops']` of each compiled per-device program) counts "
    "something else, by these rules, each measured by compiling small variants of the same "
    "programs (2-8 layers, 512-8,192 tokens) and reading the optimized HLO:",
    "",
    "1. a while loop's body is counted once, not times its trip count: the micro-batch scan, "
    "the layer scan (forward and backward) and the log-prob chunk map each add one iteration "
    "(2 and 4 scanned layers give the same figure; 2 micro-batches halve it);",
    "2. a Pallas kernel (splash attention) counts 0 (splash vs dense at the same shapes "
    "differs by exactly the attention matmuls); the remat recompute is counted;",
    "3. with 2 slices the compiler peels one iteration of the backward layer loop out of the "
    "loop (the HLO holds the backward layer's matmuls once in the program and once in the "
    "loop, for 2, 4 and 8 layers), so the backward layer body counts twice; with several "
    "micro-batches it does the same to the train step's micro-batch scan (2 and 4 "
    "micro-batches: one micro-batch's step outside the loop, one inside; the theta_s "
    "forward's micro-batch map is not peeled), so the micro-batch body counts twice as well;",
    "4. with the windowed-einsum switches on (libtpu's default; the project's flags turn them "
    "off since session 13, so no committed plan has such loops), when a slice has more than 4 "
    "FSDP shards and the activations are large, the compiler "
    "turns FSDP matmuls into collective matmuls (windowed einsums: `windowed_dot_general` "
    "loops of fsdp/2 iterations that interleave the weight all-gather or the gradient "
    "reduce-scatter with the matmul); their loop body holds 4 of the fsdp weight shards, so "
    "XLA sees 4/fsdp of such a matmul. The theta_s forward of every single-slice FSDP plan "
    "matches 'all layer matmuls windowed' to 1-3% (a tensor-parallel mesh windows fewer); in "
    "the train step only part of the matmuls are windowed (the compiler's cost model "
    "chooses), so the plan gives the range and the share the count implies. Evidence: "
    "Qwen3-1.7B dims with 2 layers, 8 x 8,192 on v5p-16, compiled with and without "
    "`xla_tpu_enable_windowed_einsum_for_all_gather` / `_for_reduce_scatter`: with them "
    "XLA/pred is 0.70 (train step) and 0.50 (theta_s forward, 1.01 of 'all windowed'); "
    "without them 1.00 and 1.00. With 2 slices (data over DCN) no matmul is windowed;",
    "5. the remat recompute does not redo a layer's last matmul, the MLP down projection: the "
    "backward pass does not need its output and the compiler drops it (the same compile "
    "without windowed einsums is 0.94x of a prediction that recomputes it, 1.00x of one that "
    "does not). The hardware does not run it either, so FLOPs/step leaves it out too.",
    "",
    "The columns XLA/pred and XLA vs rules show XLA's count over the prediction with no "
    "matmul windowed (rules 1-3 and 5), for the train step and the theta_s forward, and the "
    "share of the layer matmul FLOPs the count implies were windowed where rule 4 applies. "
    "Each plan's flops_note in the JSON says the same in words. XLA also counts elementwise "
    "work (norms, softmax, RoPE, the optimizer update) that the analytic count leaves out: a "
    "few percent at these sizes.",
    "",
]

FLAGS_TEXT = """\
### Compiler flags: what decided the collective matmuls (issue 30)

The same headline row (1.7B, 8 x 32,768 on v5p-16) compiled on another machine with the same jax 0.10.2 / libtpu 0.0.42.1 counted 1.254e13 XLA FLOPs (none of the layer matmuls windowed) against 8.78e12 here (59% windowed). The switch is libtpu's `--xla_tpu_enable_windowed_einsum_for_all_gather` / `_for_reduce_scatter`, read from `LIBTPU_INIT_ARGS` only (JAX's own `XLA_FLAGS` does not reach libtpu, and a TPU flag there is fatal). Which input set them off on that machine (an inherited `LIBTPU_INIT_ARGS`, or a libtpu default that depends on the host) could not be reproduced here; it no longer matters: `dlc-jax plan`, `dlc-jax train` and `launch/tpu_pod_train.sh` set one flag set (`dlc_jax/tpu_flags.py`: MaxText's FSDP set - async collective fusion of the all-gathers overlapped with compute, the DCN data-parallel all-reduce optimization - and both windowed-einsum switches stated), over whatever the environment holds, and each plan JSON records it (`xla_flags`). `plan.libtpu_flags` in a config adds or overrides flags for both the plan and the run. A test plans a small row in a fresh process with the switches set the other way in the environment and checks peak bytes and FLOPs agree with the committed plan within 1%.

**The switches are off (session 13).** Session 11 stated them on, libtpu's default. The HBM walk (rules 2) shows what that costs: the FSDP weights are sharded along the contracted (embedding) dimension, so each of the fsdp/2 steps of a bidirectional collective matmul adds its partial product into the whole output. The 1.7B theta_s forward at 8 x 4,096 on v5p-16 read and wrote each [4,096, 6,144] MLP output 4 times per layer: 1.75e11 loop-weighted bytes per chip with the switches on, 0.48e11 off (train step 4.99e11 and 2.22e11), the same peak. Off, every matmul writes its output once and the all-gathers stay asynchronous, overlapped with the previous layer's compute by the async-collective-fusion flags. MaxText's FSDP set leaves the switches out and its tuned TPU sets turn them off. Every row of the table was recompiled with them off; the rows that moved (roofline step s (train step / theta_s forward bound), plan peak GiB per chip):

| row | switches on (session 12) | off (now) |
| --- | --- | --- |
| 1.7B, 8 x 32,768, v5p-16 (headline) | 3.86 (compute / compute), 16.6 | {w_head} |
| 1.7B, 8 x 4,096, v5p-16 | 0.25 (memory / memory), 9.0 | {w_f17} |
| 1.7B, 32 x 4,096, v5litepod-32 | 1.77 (memory / memory), 4.5 | {w_v5e} |
| 8B, 64 x 16,384, v5p-64 (shipped) | 9.93 (compute / memory), 20.4 | {w_8b} |
| 30B-A3B, 64 x 8,192, v5p-64 (shipped) | 5.16 (memory / memory), 42.8 | {w_moe} |

The headline row with them off: XLA FLOPs train step {h_xla_step}, theta_s forward {h_xla_fwd}; train-step temporaries {h_temps} bytes; peak {h_peak} bytes per chip (17.80e9 with them on), {h_left} of HBM left.
"""

ROOFLINE_TEXT = """\
### Roofline step time

Each compiled program gets a compute, an HBM and an ICI time against the chip's published ceilings (`dlc_jax/plan/chips.py`, sources in `bw_source`: v5p 459 TFLOP/s, 2,765 GB/s HBM, 1,200 GB/s bidirectional ICI per chip; v5e 197 / 819 / 400; v6e 918 / 1,638 / 800; v4 275 / 1,200 / 269 (the pod's all-reduce bandwidth per chip)); its bound is the largest and the step is the train step plus one theta_s forward (`dlc_jax/plan/roofline.py`). Compute uses the analytic FLOPs (what the hardware runs; XLA's count sees each loop body once). HBM uses XLA's bytes accessed times the loop weighting of the optimized HLO (`plan/hlo_bytes.py`: each instruction outside a fused computation moves its operands and result, slices read only the slice, in-place dynamic-update-slices write only the update, and each while body counts its trip count times, read from the condition's `i < N`; `bytes_loop_scale` in the JSON), for our programs and the peer's alike. ICI uses FSDP's weight all-gathers (two in the train step, one in the forward, compute dtype) and the float32 gradient reduce-scatter. It assumes perfect overlap, so it is a lower bound; the old 40%-of-peak figure stays beside it for one release. Headline row: train step {h_step_c} s compute vs {h_step_m} s HBM vs {h_step_i} s ICI, theta_s forward {h_fwd_c} / {h_fwd_m} / {h_fwd_i} s: {h_bound}, {h_roof} s (old: {h_old} s at {h_eff}).

**The log-prob layout (sessions 10-12).** The trainer's log-probs (`rl/vocab_parallel.py`) are
vocabulary-parallel under `shard_map`: the LM head is resharded once per program from [V, D/n] to
[V/n, D] (an all-to-all), each chunk all-gathers its hidden rows, every chip computes
[256 x n positions, V/n] f32 logits (`logits_chunk_bytes_per_chip`: 155.6 MB for Qwen3, as on one
device) and the chips combine per-position scalars (`pmax` of the max; `psum_scatter` of the sum of
exp, the target and head logits and the entropy term). Its backward pass is written out
(`jax.custom_vjp`, session 12; the JSON's `logprob_backward`): per chunk one logits recompute and one
elementwise pass forming dz (target ids picked by comparison, nothing scattered), dz @ W
reduce-scattered to the rows' owners, dz^T @ h accumulated in f32 into each chip's [V/n, D] share of
the LM-head gradient. Before it, the flattened layout (`rl/logprobs.py`, now only for top-k / top-p
and `vocab_chunk`) all-reduced every chunk's whole f32 logits on every chip and ran the softmax n
times over; autodiff's backward through the vocab-parallel chunks scattered the picked ids'
cotangents into a zeroed [positions, V/n] f32 block and re-laid out the gradient accumulator every
iteration (0.6B:2, 16 x 4,096 on v5litepod-16: 8.57e10 loop-weighted bytes per chip with it,
6.05e10 written out, the same XLA FLOPs within 1%). Entropy is `log S - E[z - m]` (m the max logit),
not `lse - E[z]`, which lost ulp(lse) in f32. Tests: `tests/unit/test_rl_vocab_parallel.py` (no
vocabulary-sized collective in the loop bodies; values and gradients, a different cotangent per
position, equal the reference on ragged shapes, a 2-axis mesh, bf16 hidden states).

| 1.7B:2 on v5p-16 | flattened (session 10) | vocab-parallel, autodiff backward (session 11) | vocab-parallel, written-out backward (now) | tunix GRPO (now) |
| --- | --- | --- | --- | --- |
| 8 x 4,096: train step s (bound) | 0.198 (memory) | 0.045 (memory) | {t4_step} | {t4_peer} |
| 8 x 4,096: theta_s forward s | 0.052 (memory) | 0.012 (memory) | {t4_fwd} | - |
| 8 x 4,096: roofline ours / peer | 9.7 | 2.20 | {t4_ratio} | |
| 8 x 32,768: train step s (bound) | - | 0.385 (compute) | {t32_step} | {t32_peer} |
| 8 x 32,768: theta_s forward s | - | 0.097 (memory) | {t32_fwd} | - |
| 8 x 32,768: roofline ours / peer | - | 1.42 | {t32_ratio} | |

The earlier columns are the figures as measured then (HBM by the HLO walk, the peer's HBM scaled by
its FLOPs undercount); the last two are today's compiles. Compiled memory now: train-step peak
{t4_peak} bytes/chip at 8 x 4,096, {t32_peak} at 8 x 32,768; plan totals {t4_total} and {t32_total}
(with the resident theta_s copies). The tightest row of the table, Qwen3-8B 64 x 16,384 on
v5litepod-64: plan total {e_total} bytes/chip, {e_left} of HBM left, train-step temporaries {e_temps}
(15.68e9, 7% left on the flattened layout). {stale_rows}

**The 1.25x target against the compute floor.** If both steps ran at the bf16 peak, ours / peer
would be hardware FLOPs / (hardware FLOPs - log-prob chunk recompute - theta_s forward)
(`plan_notes.compute_floor`): DLC's theta_s forward is a whole extra forward including the
vocabulary projection, and the chunked log-probs recompute the projection in the backward pass (the
peer keeps its full [B, T, V] logits instead: its step peak is 3x-10x ours at 2 layers). For 1.7B:2 at 8 x 4,096
that is {f4_hw} / {f4_peer} = {f4_ratio} (theta_s forward {f4_fwd}, chunk recompute {f4_chunk} of the peer's work); at 8 x 32,768,
{f32_hw} / {f32_peer} = {f32_ratio} ({f32_fwd}, {f32_chunk}). Today's roofline ratios: {t4_ratio} at 8 x 4,096, below the floor
because tunix's step there is bound by HBM ({t4_peer_m} s of traffic by the same HLO walk against
{t4_peer_c} s of compute) and ours by compute; {t32_ratio} at 8 x 32,768, where both are
compute-bound and the ratio is the floor. The 0.6B rows cut to 2 layers on v5p-8 (4 chips, no
collective matmuls in the peer): 8 x 4,096 {s4_ratio}x (floor {s4_floor}; the peer compute-bound, our theta_s
forward HBM-bound), 8 x 32,768 {s32_ratio}x (floor {s32_floor}, {s32_bound}). With 2 decoder layers the vocabulary
projection (2 x 2,048 x 151,936 per token) is about 3x a layer pair's matmuls, so the two extras
weigh far more than in the full model; with all layers the floor is lower but still above 1.25x:
from the analytic FLOPs of the committed full-model plans, 1.7B 8 x 32,768 {F1_ratio} (theta_s forward {F1_fwd},
chunk recompute {F1_chunk}), 1.7B 8 x 4,096 {F2_ratio} ({F2_fwd}, {F2_chunk}), 0.6B 8 x 4,096 {F3_ratio} ({F3_fwd}, {F3_chunk}). The theta_s
forward alone is one layer pass and one vocabulary pass against the peer's four layer passes
(forward, remat, backward x2) and three vocabulary passes, about +0.25 whatever the layout: where
both steps are compute-bound the target is below DLC's floor and is not met by bending the layout;
the honest comparison is the roofline against the floor per row (`docs/bench/plan_peers.md`, column
"compute floor ours/peer"). {full_rows}

Nor by spending the memory our layout saves on recompute (session 13, switches off, compiled
memory and bytes): with `model.remat_policy=save_dots` (the layer matmuls' outputs kept, attention
recomputed) the whole 0.6B at 8 x 4,096 on v5p-8 projects 0.180 s against 0.187 s under full remat,
with a train-step peak of 9.59 GiB against 4.77 (the peer's: 9.27), and its train step turns
HBM-bound (0.142 s of traffic against 0.136 s of compute: the kept activations are written and read
back); the whole 1.7B at 8 x 4,096 on v5p-16 projects 0.186 s against 0.189 s, peak 9.73 GiB
against 5.79. Full remat stays the shipped policy.
"""

MOE_TEXT = """\
### The MoE FLOPs (30B-A3B 17.75x; 1.18 / 1.68 / 2.66x with the expert axis)

Megablox's grouped matmuls carry their own cost estimate, 2*m*k*n over the m rows passed to the kernel (`gmm` and `tgmm` in jax's megablox). Measured on the tiny Qwen3-MoE's theta_s forward (8 experts, top 2, d 64, expert width 32): 6.71e7 FLOPs per call at fsdp 4 and 1.68e7 at fsdp 16, exactly 2*m*64*32 for the device's own (token, slot) rows: the estimate is the active work of the rows it is given. With an expert axis of size e and the all-gather dispatch (`dlc_jax/model/moe_dispatch.py`), each device gathers its e peers' tokens and passes all e x rows to the kernel, zeroing the rows of other shards' experts; the kernel visits only its local groups' tiles, so the work stays the same while the estimate grows e-fold: 1.18 + 0.49 (e - 1) gives 1.67 and 2.65 for e = 2, 4 (measured 1.68, 2.66; 1.18 at e = 1 is the tiny model's elementwise work). The all-to-all dispatch passes only routed rows and does not have this excess.

30B-A3B (128 experts, top 8, no expert axis, fsdp 32): per device, XLA's count exceeds the prediction by 9.6e12 in the theta_s forward, 31x the active expert work of one counted layer body (2 x (4,096 tokens x 8) x 2,048 x 768 x 3 = 3.09e11), and by 4.08e13 in the train step, 132x = 4 grouped-matmul passes (forward, remat forward, the two backward kernels) x 33. So the expert matmuls are counted at about fsdp (32) times the rows they multiply. The tiny model at fsdp 4 and 16 does not show this factor, so what multiplies the count at 30B-A3B is not isolated (its compile, about 390 CPU-s, did not fit this session's loaded machine); with `ragged_dot` experts the forward is counted at 1.04x and the train step at 18.24x, the backward's lowering taking the same factor.

**Isolated (session 9): the 32x is work, not counting.** The row runs 8 prompts x 8 samples = 64 rows in
`train.micro_batches: 4`, so 16 rows per micro-batch on 32 batch-sharded chips (data 1 x fsdp 32).
16 does not divide by 32, so the batch dimension replicates (`model.sharding.logical_to_spec`:
indivisible dims replicate) and every chip computes all 16 rows of every micro-batch, in the model and
in the kernels under `shard_map` (`moe_dispatch.py` splits tokens by the batch spec). The theta_s
forward alone, compiled for v5p-64 in 19 s (35 CPU-s, load 0.5): each grouped matmul gets
bf16[1048576, 2048] rows per chip (16 x 8,192 tokens x top 8) where an even split gives 32,768, and
splash attention gets all 16 rows; XLA counts 1.010e13 FLOPs, the committed figure. With
`train.micro_batches=1` (64 rows: 2 per chip) the same compile gives the kernels 131,072 rows per
chip (2 x 8,192 x 8) and 1.329e12 FLOPs for the same loop body, 7.6x less for 8x fewer rows per
chip. So the row as configured would really run about 32x the expert and attention work per chip;
megablox's estimate (2*m*k*n over the rows it is given) was right. `dlc-jax plan` now reports
`batch_replication` (`rows_per_micro_batch`, `factor`) in every plan JSON and prints a warning naming
the micro-batch counts that split evenly (here 1 or 2) when the factor is above 1
(`model.sharding.batch_replication`, `tests/unit/test_plan_batch_replication.py`); the other
configs' rows split evenly (factor 1).

**The shipped 30B-A3B config now runs 2 micro-batches (session 12)**: 32 rows each, one per chip
(`batch_replication` factor 1). Its plan: peak {m_peak} GiB per chip ({m_left} of HBM left; 70.1 GiB with 4
micro-batches), XLA's FLOPs per device {m_xla_step} in the train step and {m_xla_fwd} in the theta_s forward
(4.26e13 and 1.01e13 with 4: the 32x replication gone), compile {m_wall} s wall ({m_cpu} CPU-s).

The MoE row's roofline takes compute from the analytic active work (8 of 128 experts, as the kernels
run it), not XLA's count, and HBM from the HLO walk like every row: 30B-A3B 64 x 8,192 on v5p-64,
{m_roof} s per step, {m_bound} (train step {m_step_c} s compute / {m_step_m} s HBM, theta_s forward
{m_fwd_c} / {m_fwd_m} s). Diagnosed on the model cut to 2 layers: the walk first counted the buffers that
the async collective fusions thread through each window step of the collective matmuls (the next
layer's gathered experts, bf16 [128, 2,048, 768], 403 MB, read and rewritten whole per step: 1.04e12
weighted bytes in that train step); they alias their operands in place and now count as neither
(3.82e11; `plan/hlo_bytes.py`, rules 2 in the JSON; the dense rows moved by about 1%). What the walk
still cannot see, the remaining uncertainty: (1) the grouped matmul pads each expert's rows to the
128-row tile (up to 128 x 127 rows on the 65,536 (token, expert) rows per device, micro-batch and
layer: +up to 25%, about +12% on average, on the expert matmuls' compute); (2) a Pallas kernel (megablox, splash) is a custom call
whose operands the walk counts once per call as XLA does, whatever tiles the kernel re-reads
inside; (3) the roofline assumes perfect overlap of compute, HBM and ICI, so it is a lower bound.

### Compile time of the 1.7B x 32k plan

With the flags, from a fresh clone: {c_cpu} CPU-s for both programs (train step {c_step}, theta_s forward {c_fwd}), {c_wall} s wall at a 1-minute load of {c_load} on the 2-core machine (target <= 120 s quiet; 332 CPU-s on the other machine without windowed einsums, 108 CPU-s / 58 s wall before issue 30). To repeat it: `git clone REPO /tmp/planclone && cd /tmp/planclone && PYTHONPATH=$PWD python -m dlc_jax.cli plan --config configs/qwen3_1p7b_dlc.yaml --topology v5p-16 train.batch_prompts=1 sampler.n=8 sampler.max_model_len=32768 train.micro_batches=1 mesh.data=1 mesh.fsdp=-1 mesh.tensor=1 --json /tmp/h.json` and read compile_s / compile_cpu_s / loadavg in the JSON.
"""


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
    recompute and the theta_s forward, with whole-layer remat (tunix's RematConfig.DECODER)
    whatever remat policy our plan ran."""
    remat = a.get("remat_recompute_full", a["remat_recompute"]) - a["remat_recompute"]
    return a["hardware_flops"] - a["logprob_chunk_recompute"] - a["snapshot_forward"] + remat


def compute_floor(plan: dict) -> dict:
    """Ours / the peer if both ran at the bf16 peak: our hardware FLOPs over a GRPO step's (less
    the log-prob chunk recompute and the theta_s forward), and the two extras' shares of the peer's
    work (all chips)."""
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
    for tag, prog, digits in (("step", "train_step", 2), ("fwd", "snapshot_forward", 2)):
        s = _program_s(h, prog)["seconds"]
        v[f"h_{tag}_c"] = f"{s['compute']:.2f}"
        v[f"h_{tag}_m"] = f"{s['memory']:.2f}"
        v[f"h_{tag}_i"] = f"{s['collective']:.{digits if tag == 'step' else 3}f}"


def _two_layer(v: dict, tag: str, ours: dict, ratio: float | None) -> None:
    """The vocab-parallel 1.7B:2 rows beside the peer (t4_*, t32_*)."""
    step, fwd = _program_s(ours, "train_step"), _program_s(ours, "snapshot_forward")
    v.update(
        {
            f"{tag}_step": _bound_s(step),
            f"{tag}_fwd": _bound_s(fwd),
            f"{tag}_ratio": "n/a" if ratio is None else f"{ratio:.2f}",
            f"{tag}_peak": _e9(ours["programs"]["train_step"]["peak_bytes"]),
            f"{tag}_total": _e9(ours["peak_bytes_per_chip"]["total"]),
        }
    )


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
    """Why a cached plan no longer shows today's trainer ('' when it does): compiled before the
    plan set its XLA flags, with the flattened log-prob chunks, with autodiff's backward pass
    through the vocab-parallel chunks (``rl.vocab_parallel.BACKWARD``), with an older HBM walk
    (``plan.hlo_bytes.RULES``) or with other libtpu flags than ``tpu_flags.DEFAULT_FLAGS``."""
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
    """The issue-30 sections with the committed plans' figures: ``plans`` by role (headline,
    8B_v5e_16k, moe, full_1.7B_4k, full_0.6B_4k, v5e_1.7B_4k, 8B_shipped, 1.7B:2_4k, 1.7B:2_32k,
    0.6B:2_4k, 0.6B:2_32k),
    ``peer_ratios`` per 2-layer role ({"peer": tunix's roofline, "ratio", "floor", "bound"}),
    ``table``: the plans of every row of the table."""
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
        _two_layer(v, tag, plans[role], peer_ratios.get(role, {}).get("ratio"))
        peer = peer_ratios.get(role, {}).get("peer")
        v[f"{tag}_peer"] = "n/a" if peer is None else _bound_s(peer)
        for term, key in (("m", "memory"), ("c", "compute")):
            v[f"{tag}_peer_{term}"] = "n/a" if peer is None else f"{peer['seconds'][key]:.3f}"
    for tag, role in (("s4", "0.6B:2_4k"), ("s32", "0.6B:2_32k")):
        pr = peer_ratios.get(role, {})
        v[f"{tag}_ratio"] = f"{pr['ratio']:.2f}" if pr else "n/a"
        v[f"{tag}_floor"] = f"{pr['floor']:.2f}" if pr else "n/a"
        v[f"{tag}_bound"] = pr.get("bound", "n/a")
    full = [
        f"{name} {pr['ratio']:.2f}x (floor {pr['floor']:.2f}, ours {pr['bound']}, the peer "
        f"{pr['peer']['bound']}-bound)"
        for name, pr in (
            ("1.7B", peer_ratios.get("full_1.7B_4k")),
            ("0.6B", peer_ratios.get("full_0.6B_4k")),
        )
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
    return "\n".join((FLAGS_TEXT, ROOFLINE_TEXT, MOE_TEXT)).format(**v).split("\n")


# the MoE rows as measured in sessions 5-6 (kept verbatim below the target details)
MOE_HISTORY = [
    "**MoE experts on TPU now run as the megablox grouped matmul** (`moe_impl: auto` = megablox on TPU",  # noqa: E501 (verbatim table rows)
    "devices, issue 22; `dlc_jax/model/moe_dispatch.py`). The 30B-A3B row above was compiled with",
    "`ragged_dot` experts. **Re-run with the kernel** (session 6, same config, `moe_impl: auto` =",
    "megablox, no expert axis; `docs/bench/plan/30B-A3B_v5p-64_64x8192_megablox.json`; compile 2,822 s",  # noqa: E501 (verbatim table rows)
    "wall, 385 CPU s at load 9-16): it fits as before, 73.1 GiB peak per chip (train step temporaries",  # noqa: E501 (verbatim table rows)
    "44.7 GiB, theta_s forward phase 29.7 GiB vs 26.8), projected 5.48 s per step. XLA's FLOPs count is",  # noqa: E501 (verbatim table rows)
    "still far above the prediction: train step 4.257e+13 per device = 17.75x (18.24x with ragged_dot),",  # noqa: E501 (verbatim table rows)
    "and the theta_s forward now 1.010e+13 = 21.4x (1.04x with ragged_dot). The megablox kernels' cost",  # noqa: E501 (verbatim table rows)
    "estimate is 2·m·k·n over their input rows (n tokens x top-k on a device without an expert axis,",  # noqa: E501 (verbatim table rows)
    "the active work), so this excess is not the kernel's estimate of active work; not diagnosed in",  # noqa: E501 (verbatim table rows)
    "this session (the tiny model counts 1.18x with the kernel, below). A tiny Qwen3-MoE train step (d=64, 8 experts, top 2, 2 scanned",  # noqa: E501 (verbatim table rows)
    "layers, 16 x 128 tokens, 2 micro-batches, 4 v5e chips, fsdp 4;",
    "measured in session 5; expert-parallel meshes and the all-to-all dispatch: `docs/bench/moe_ep.md`),",  # noqa: E501 (verbatim table rows)
    "AOT-compiled both ways (load-independent counts):",
    "",
    "| experts | XLA FLOPs / device | predicted | XLA/pred | step temporaries | peak / chip | compile CPU s |",  # noqa: E501 (verbatim table rows)
    "|---|---|---|---|---|---|---|",
    "| ragged_dot | 1.571e+08 | 9.123e+07 | 1.72 | 11.9 MiB | 15.6 MiB | 17.7 |",
    "| megablox (auto) | 1.080e+08 | 9.123e+07 | 1.18 | 11.2 MiB | 14.9 MiB | 14.3 |",
    "",
    "The megablox kernels carry their own FLOPs estimate (2·m·k·n over the padded pair rows), which",  # noqa: E501 (verbatim table rows)
    "XLA's count appears to include; the rest of the 1.18x is elementwise work at d=64 (as for the dense tiny",  # noqa: E501 (verbatim table rows)
    "model). At 8 experts ragged's dense lowering costs 1.7x; at 128 experts it was the 18x above.",
]


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
