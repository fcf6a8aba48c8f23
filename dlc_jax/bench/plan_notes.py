# ruff: noqa: E501 (the templates hold markdown lines as they appear in docs/bench/PLAN.md)
"""Narrative sections of docs/bench/PLAN.md (`dlc-jax bench plan`): how the FLOPs are counted, the
compiler flags, the roofline, the vocabulary-parallel log-prob layout, the compute floor beside the
peer, the MoE FLOPs and the compile time (issue 30).

The figures of the committed plans are filled in from their JSON (`issue30_sections`, given the
cached plans by role); what no committed JSON holds any more (an overwritten compile, a measurement
outside the plan) stays in the text with the row and the machine's load it was measured at."""

from __future__ import annotations

from collections.abc import Mapping

from dlc_jax.rl.vocab_parallel import BACKWARD

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
    "4. when a slice has more than 4 FSDP shards and the activations are large, the compiler "
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

The same headline row (1.7B, 8 x 32,768 on v5p-16) compiled on another machine with the same jax 0.10.2 / libtpu 0.0.42.1 counted 1.254e13 XLA FLOPs (none of the layer matmuls windowed) against 8.78e12 here (59% windowed). The switch is libtpu's `--xla_tpu_enable_windowed_einsum_for_all_gather` / `_for_reduce_scatter`, read from `LIBTPU_INIT_ARGS` only: on a small row (1.7B dims, 2 layers, 8 x 8,192, v5p-16) the train step counts 2.256e12 FLOPs with windowed loops in a plain environment and 3.184e12 (1.41x, no windowed loop) with both switches false, the other machine's signature (1.43x, none windowed). JAX's own `XLA_FLAGS` does not reach libtpu: `--xla_backend_optimization_level=0` (the tests' setting) gives the same 2.256e12, and a TPU flag there is fatal (`Unknown flags in XLA_FLAGS`). Which input set the switches off on that machine (an inherited `LIBTPU_INIT_ARGS`, or a libtpu default that depends on the host) could not be reproduced here; it no longer matters: `dlc-jax plan`, `dlc-jax train` and `launch/tpu_pod_train.sh` set one flag set (`dlc_jax/tpu_flags.py`: MaxText's FSDP set - async collective fusion of the all-gathers overlapped with compute, the DCN data-parallel all-reduce optimization - and both windowed-einsum switches on), over whatever the environment holds, and each plan JSON records it (`xla_flags`). `plan.libtpu_flags` in a config adds or overrides flags for both the plan and the run. A test plans a small row twice in fresh processes, once with the switches off in the environment, and checks peak bytes and FLOPs agree within 1%.

With the flags the headline row's XLA FLOPs are the committed ones to 1e-6 (train step {h_xla_step}, theta_s forward {h_xla_fwd}); its train-step temporaries are {h_temps} bytes (8.91e9 before: the async-collective-fusion flags keep more gathered weights live) and its peak {h_peak} bytes per chip (17.53e9), {h_left} of HBM left.
"""

ROOFLINE_TEXT = """\
### Roofline step time

Each compiled program gets a compute, an HBM and an ICI time against the chip's published ceilings (`dlc_jax/plan/chips.py`, sources in `bw_source`: v5p 459 TFLOP/s, 2,765 GB/s HBM, 1,200 GB/s bidirectional ICI per chip; v5e 197 / 819 / 400; v6e 918 / 1,638 / 800; v4 275 / 1,200 / 269 (the pod's all-reduce bandwidth per chip)); its bound is the largest and the step is the train step plus one theta_s forward (`dlc_jax/plan/roofline.py`). Compute uses the analytic FLOPs (what the hardware runs; XLA's count sees each loop body once); HBM uses XLA's bytes accessed times the loop weighting of the HLO walk (`plan/hlo_bytes.py`: each while body times its trip count; see the log-prob section below; plans compiled before session 11 and the peer's cached compiles keep the older scaling by the same undercount as the visible FLOPs); ICI uses FSDP's weight all-gathers (two in the train step, one in the forward, compute dtype) and the float32 gradient reduce-scatter. It assumes perfect overlap, so it is a lower bound; the old 40%-of-peak figure stays beside it for one release. Headline row: train step {h_step_c} s compute vs {h_step_m} s HBM vs {h_step_i} s ICI, theta_s forward {h_fwd_c} / {h_fwd_m} / {h_fwd_i} s: {h_bound}, {h_roof} s (old: {h_old} s at {h_eff}). Rows compiled before issue 30 carry no bytes-accessed figure: their HBM term is 0 (said in each JSON's roofline note) until they are recompiled.

**The log-prob layout beside tunix's GRPO step (issue 30; session 10's diagnosis, fixed in session 11).**
The old log-prob path (`rl/logprobs.py`) flattened the batch to positions and mapped over chunks of 256
*contiguous* positions. With the rows sharded over FSDP and the LM head sharded along its hidden
dimension, XLA computed each chunk's logits as partial sums over D/8 on every chip and then all-reduced
the whole f32 chunk (the 8 x 4,096 row's theta_s forward: 155,582,464 bytes per loop body = 256 x
151,936 x 4; the train step twice that), and every chip then ran the softmax and its gradient on the
whole chunk, 8 times the work. The trainer now uses `rl/vocab_parallel.py` (Megatron-style
vocab-parallel log-softmax under `shard_map`): the LM head is resharded once per program from
[V, D/8] to [V/8, D] (an all-to-all, not a gather), each chunk all-gathers its hidden rows, every chip
computes [positions, V/8] f32 logits and the chips combine per-position scalars (max with `pmax`;
sum of exp, target and head logits, entropy term with `psum_scatter`, each chip receiving its own
positions' totals). In the backward pass each chip accumulates only its [V/8, D] share of the LM-head
gradient (no full-size f32 gradient per chip) and the hidden gradient is reduce-scattered per chunk.
`StepConfig.chunk_size` (256) is now positions per device per chunk: a vocab-parallel chunk is 256 x n
positions by V/n, so each chip's logits block is 256 x V f32 (155.6 MB for Qwen3, the figure the
report prints as `logits_chunk_bytes_per_chip`), as on one device, in n times fewer iterations: each
backward iteration re-reads and re-writes the [V/n, D] f32 gradient accumulator, which at 256
positions per chunk (128 chunks) was 4.1e10 of the 1.7B:2 8 x 4,096 train step's 1.8e11 loop-weighted
bytes. top-k / top-p (a sort over the whole vocabulary) and `vocab_chunk` fall back to the old path.
Tests: `tests/unit/test_rl_vocab_parallel.py` (the loop bodies of the compiled function and of the
trainer's `policy_logprobs` hold no vocabulary-sized collective, and do on the old layout; values and
gradients equal the reference on ragged shapes, a 2-axis mesh, bf16 hidden states).
Entropy in every path is now `log S - E[z - m]` (m the max logit): `lse - E[z]` subtracts two numbers of
the logits' size and lost about ulp(lse) in f32 (2.4e-4 at logits near 3,000, measured 0.37 relative
error on the old chunked path in that test, 7.7e-4 on the vocab-scan path).

**How the roofline counts HBM bytes now.** XLA's `bytes accessed` counts a loop body once. The old
roofline scaled a program's bytes by its FLOPs undercount (analytic / XLA), which weighs the 128-iteration
chunk loop and the 2-iteration layer scan alike. `plan/hlo_bytes.py` walks the optimized HLO instead:
each instruction outside a fused computation moves its operands and result, (dynamic) slices read only
the slice, in-place dynamic-update-slices write only the update, and a while body is multiplied by its
trip count (TPU HLO carries none in `backend_config`: the bound of the condition's `i < N`). Its
once-per-body total is XLA's figure to 1-10% (1.7B:2 8 x 4,096 train step: 1.920e10 vs 1.932e10 on the
old layout, 2.46e10 vs 2.71e10 on the new); the roofline multiplies XLA's bytes by the walk's
weighted / once ratio (`bytes_loop_scale` in the JSON). Programs compiled before the walk (the peer's
cached compiles, older plan rows) keep the FLOPs-undercount scaling. Under the new count the old
layout's 8 x 4,096 row needed 5.44e11 bytes in the train step (0.198 s) and 1.46e11 in the theta_s
forward (0.052 s).

| 1.7B:2 on v5p-16 | old layout (old HBM count) | old layout (HLO walk) | vocab-parallel (HLO walk) | tunix GRPO |
| --- | --- | --- | --- | --- |
| 8 x 4,096: train step s (bound) | 0.079 (memory) | 0.198 (memory) | {t4_step} | {t4_peer} |
| 8 x 4,096: theta_s forward s | 0.023 (memory) | 0.052 (memory) | {t4_fwd} | - |
| 8 x 4,096: roofline ours / peer | 3.74 | 9.7 | {t4_ratio} | |
| 8 x 32,768: train step s (bound) | 0.385 (compute) | - | {t32_step} | {t32_peer} |
| 8 x 32,768: theta_s forward s | 0.107 (memory) | - | {t32_fwd} | - |
| 8 x 32,768: roofline ours / peer | 1.44 | - | {t32_ratio} | |

Compiled memory of the new layout: train-step peak {t4_peak} bytes/chip at 8 x 4,096 (1.85e9 before),
{t32_peak} at 8 x 32,768 (6.36e9); plan totals {t4_total} (2.68e9) and {t32_total} (7.19e9). One open point: in the
1.7B:2 8 x 32,768 train step (not at 8 x 4,096) XLA combines the vocab-parallel LM-head gradient with
the tied embedding's scatter gradient by all-gathering the full f32 [151,936, 2,048] gradient
(1.245e9 bytes), scattering the lookup gradient into it and all-reducing it (another 1.245e9): a
transient full-size f32 LM-head gradient per chip that the old layout's compile did not have. The
step's peak still fell and its ICI cost is about 3 ms of a 0.48 s step; the untied 8B does not tie
the two gradients. A sharding constraint on the LM-head cotangent might steer it; not tried. The
tightest row of the table, Qwen3-8B 64 x 16,384 on v5litepod-64, was recompiled with it: plan total {e_total} bytes/chip
(15.68e9 before), {e_left} of HBM left (7%), train-step temporaries {e_temps} (10.55e9).{recompiled}
{n_old} of the table's {n_rows} rows were compiled with the old layout (column 'log-prob layout': flattened)
and are stale until recompiled (`dlc-jax bench plan --force`); they were compiled before
`logprob_vocab_shards` existed, so `refresh_flops` models them with 0 (flattened chunks), as they were
compiled.

**The 1.25x target is not reachable at 2 layers: the compute floor.** If both steps ran at the bf16
peak, ours / peer would be hardware FLOPs / (hardware FLOPs - log-prob chunk recompute - theta_s
forward) (`plan_peers.peer_roofline`): DLC's theta_s forward is a whole extra forward including the
vocabulary projection, and the chunked log-probs recompute the projection in the backward pass (the
peer keeps its full [B, T, V] logits instead: its step peak is 3x-5x ours). At 8 x 4,096 that is
{f4_hw} / {f4_peer} = {f4_ratio} (theta_s forward {f4_fwd}, chunk recompute {f4_chunk} of the peer's work); at
8 x 32,768, {f32_hw} / {f32_peer} = {f32_ratio} ({f32_fwd}, {f32_chunk}), which is where the 32k row now sits (both
programs compute-bound). With 2 decoder layers the vocabulary projection (2 x 2,048 x 151,936 per token)
is about 3x a layer pair's matmuls, so these two extras weigh far more than in the full 28-layer model.
The 0.6B rows cut to 2 layers on v5p-8 (`dlc-jax bench plan-peers --size 2-layers-all`) give the same
picture: 8 x 4,096 roofline {s4_ratio}x (floor {s4_floor}), 8 x 32,768 {s32_ratio}x (floor {s32_floor}, {s32_bound}). With all
28 layers the extras weigh less but the floor is still above 1.25x: from the analytic FLOPs of the
committed full-model plans, 1.7B 8 x 32,768 {F1_ratio} (theta_s forward {F1_fwd}, chunk recompute {F1_chunk}),
1.7B 8 x 4,096 {F2_ratio} ({F2_fwd}, {F2_chunk}), 0.6B 8 x 4,096 {F3_ratio} ({F3_fwd}, {F3_chunk}). The theta_s forward
alone is one layer pass and one vocabulary pass against the peer's four layer passes (forward, remat,
backward x2) and three vocabulary passes, so about +0.25 whatever the layout: the 1.25x target sits at
or below the compute floor of a DLC step beside a GRPO step without a reference forward, and is not
met by bending the layout; the honest comparison is the roofline against the floor per row. `docs/bench/plan_peers.md` prints the floor per row ("compute floor ours/peer"). What remains above the
floor at 8 x 4,096 ({t4_ratio} vs {f4_ratio}) is HBM traffic in the train step ({t4_hbm} bytes/chip, {t4_step_m} s against
{t4_step_c} s of compute) and the theta_s forward ({t4_fwd_m} s against {t4_fwd_c} s). The HLO walk of that train step
({t4_weighted} weighted bytes before the scaling to XLA's figure) puts 4.3e10 in the backward chunk loop
(16 iterations): per iteration the LM-head gradient accumulator [V/8, D] f32 (155.6 MB) is added into
(0.40e9) and relaid out and copied (0.62e9), the gradient of the target and head-logit gather (1 + 20
head ids per position on this config) is a scatter into a zeroed [2,048, V/8] f32 block (0.47e9), and
the softmax passes over that block (0.55e9); the layer scan and its collective matmuls hold 3.3e10,
the forward chunk loop 1.2e10, the code outside the loops 1.5e10. Larger chunks would cut the
accumulator's share (each chunk re-reads and re-writes it) at chunk_size x V x 4 bytes of logits per
chip; a one-hot gradient instead of the scatter would cost a pass over the block per head id.
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
configs' rows split evenly (factor 1). The 30B-A3B config is not changed here: its train step's
compile at another micro-batch count has not been run.

The MoE rows' roofline therefore uses the analytic active work (8 of 128 experts, as the kernels run it), not XLA's count: 30B-A3B 64 x 8,192 on v5p-64, {m_roof} s per step, {m_bound}. Uncertainty: (1) the grouped matmul pads each expert's rows to the 128-row tile, up to 128 x 127 rows on 32,768 per device and layer body (+up to 50%, about +25% on average, on the expert matmuls); (2) the row predates bytes accessed, so its HBM term is not in the figure; (3) if the 32x above were work rather than counting (the expert matmuls replicated over the FSDP axis), the step would be up to 18x longer - the tiny model's per-device kernel estimates say counting, a 30B-A3B compile reading the kernels' HLO would settle it.

### Compile time of the 1.7B x 32k plan

With the flags, from a clean clone of this branch: {c_cpu} CPU-s for both programs (train step {c_step}, theta_s forward {c_fwd}), {c_wall} s wall at a 1-minute load of 16.9-19.9 on the 2-core machine (108 CPU-s / 58 s wall quiet before issue 30; 332 CPU-s on the other machine without windowed einsums). The wall target (<= 120 s quiet) is for a quiet machine: `git clone REPO /tmp/planclone && cd /tmp/planclone && PYTHONPATH=$PWD python -m dlc_jax.cli plan --config configs/qwen3_1p7b_dlc.yaml --topology v5p-16 train.batch_prompts=1 sampler.n=8 sampler.max_model_len=32768 train.micro_batches=1 mesh.data=1 mesh.fsdp=-1 mesh.tensor=1 --json /tmp/h.json` and read compile_s / compile_cpu_s / loadavg in the JSON.
"""


def _e(x: float, digits: int = 2) -> str:
    """1.245e9-style: mantissa and a bare exponent."""
    m, ex = f"{x:.{digits}e}".split("e")
    return f"{m}e{int(ex)}"


def _e9(x: float) -> str:
    """Bytes as the text writes them: 18.28e9."""
    return f"{x / 1e9:.2f}e9"


def compute_floor(plan: dict) -> dict:
    """Ours / the peer if both ran at the bf16 peak: our hardware FLOPs over a GRPO step's (less
    the log-prob chunk recompute and the theta_s forward), and the two extras' shares of the peer's
    work (all chips)."""
    a = plan["analytic_flops"]
    peer = a["hardware_flops"] - a["logprob_chunk_recompute"] - a["snapshot_forward"]
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
            f"{tag}_hbm": _e(step["hbm_bytes_per_chip"]),
            f"{tag}_step_m": f"{step['seconds']['memory']:.3f}",
            f"{tag}_step_c": f"{step['seconds']['compute']:.3f}",
            f"{tag}_fwd_m": f"{fwd['seconds']['memory']:.3f}",
            f"{tag}_fwd_c": f"{fwd['seconds']['compute']:.3f}",
            f"{tag}_weighted": _e(ours["programs"]["train_step"].get("hlo_bytes_weighted") or 0),
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


def _row_name(plan: dict) -> str:
    c = plan["config"]
    model = c["model"].rsplit("/", 1)[-1]
    return f"{model} {c['rows']} x {c['seq_len']:,} on {plan['topology']['name']}"


def _vocab_parallel(v: dict, e: dict, table: list[dict]) -> None:
    """The 8B v5litepod-64 x 16,384 row recompiled with the layout, the others recompiled since,
    and how many are not."""
    others = [_row_name(r) for r in table if vocab_parallel(r) and r is not e]
    v.update(
        e_total=_e9(e["peak_bytes_per_chip"]["total"]),
        e_left=f"{100 * e['hbm_left_fraction']:.0f}%",
        e_temps=_e9(e["programs"]["train_step"]["temp_bytes"]),
        n_old=str(sum(1 for r in table if not vocab_parallel(r))),
        n_rows=str(len(table)),
        recompiled=f" Recompiled with it since: {'; '.join(others)}." if others else "",
    )


def vocab_parallel(plan: dict) -> int:
    """The devices the plan's log-prob chunks split the vocabulary over (rl.vocab_parallel), 0 when
    it was compiled with the flattened chunks (the old layout, or its top-k / top-p fallback)."""
    return int(plan["analytic_flops"].get("logprob_vocab_shards") or 0)


def stale(plan: dict) -> str:
    """Why a cached plan no longer shows today's trainer ('' when it does): compiled before the
    plan set its XLA flags, with the flattened log-prob chunks, or with autodiff's backward pass
    through the vocab-parallel chunks (``rl.vocab_parallel.BACKWARD``)."""
    if "xla_flags" not in plan:
        return "no XLA flags"
    if not vocab_parallel(plan) and not plan["programs"]["train_step"]["oom"]:
        return "flattened log-prob chunks"
    if vocab_parallel(plan) and plan.get("logprob_backward") != BACKWARD:
        return "autodiff log-prob backward"
    return ""


def issue30_sections(
    plans: Mapping[str, dict], peer_ratios: Mapping[str, dict], table: list[dict]
) -> list[str]:
    """The issue-30 sections with the committed plans' figures: ``plans`` by role (headline,
    8B_v5e_16k, moe, full_1.7B_4k, full_0.6B_4k, 1.7B:2_4k, 1.7B:2_32k, 0.6B:2_4k, 0.6B:2_32k),
    ``peer_ratios`` per 2-layer role ({"peer": tunix's roofline, "ratio", "floor", "bound"}),
    ``table``: the plans of every row of the table."""
    v: dict[str, str] = {}
    _headline(v, plans["headline"])
    for tag, role in (("t4", "1.7B:2_4k"), ("t32", "1.7B:2_32k")):
        _two_layer(v, tag, plans[role], peer_ratios.get(role, {}).get("ratio"))
        peer = peer_ratios.get(role, {}).get("peer")
        v[f"{tag}_peer"] = "n/a" if peer is None else _bound_s(peer)
    for tag, role in (("s4", "0.6B:2_4k"), ("s32", "0.6B:2_32k")):
        pr = peer_ratios.get(role, {})
        v[f"{tag}_ratio"] = f"{pr['ratio']:.2f}" if pr else "n/a"
        v[f"{tag}_floor"] = f"{pr['floor']:.2f}" if pr else "n/a"
        v[f"{tag}_bound"] = pr.get("bound", "n/a")
    _floor_fields(v, "f4", plans["1.7B:2_4k"], 2)
    _floor_fields(v, "f32", plans["1.7B:2_32k"], 2)
    for tag, role in (("F1", "headline"), ("F2", "full_1.7B_4k"), ("F3", "full_0.6B_4k")):
        _floor_fields(v, tag, plans[role], 3)
    _vocab_parallel(v, plans["8B_v5e_16k"], table)
    m = plans["moe"]
    bounds = {p["bound"] for p in m["roofline"]["programs"].values()}
    v.update(m_roof=f"{m['roofline']['step_s']:.2f}", m_bound=f"{'/'.join(sorted(bounds))}-bound")
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

    fl, chips = ours["analytic_flops"], peer["chips"]
    flops = (fl["hardware_flops"] - fl["logprob_chunk_recompute"] - fl["snapshot_forward"]) / chips
    coll = _fsdp_bytes(peer["params"], 2, peer["fsdp"], 2, peer["params"])
    # tunix unrolls its layers: no loop but the collective matmuls' hides work from XLA's count
    return program_roofline("grpo_step", flops, peer, flops, chip(peer["chip"]), coll)
