"""Narrative sections of docs/bench/PLAN.md (`dlc-jax bench plan`): how the FLOPs are counted, the
compiler flags, the roofline, the MoE FLOPs and the compile time (issue 30). Text only; measured
figures name their row and the machine's load."""

from __future__ import annotations

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

ISSUE30_SECTIONS = [
    "### Compiler flags: what decided the collective matmuls (issue 30)",
    "",
    "The same headline row (1.7B, 8 x 32,768 on v5p-16) compiled on another machine with the same "
    "jax 0.10.2 / libtpu 0.0.42.1 counted 1.254e13 XLA FLOPs (none of the layer matmuls "
    "windowed) against 8.78e12 here (59% windowed). The switch is libtpu's "
    "`--xla_tpu_enable_windowed_einsum_for_all_gather` / `_for_reduce_scatter`, read from "
    "`LIBTPU_INIT_ARGS` only: on a small row (1.7B dims, 2 layers, 8 x 8,192, v5p-16) the train "
    "step counts 2.256e12 FLOPs with windowed loops in a plain environment and 3.184e12 (1.41x, "
    "no windowed loop) with both switches false, the other machine's signature (1.43x, none "
    "windowed). JAX's own `XLA_FLAGS` does not reach libtpu: `--xla_backend_optimization_level=0` "
    "(the tests' setting) gives the same 2.256e12, and a TPU flag there is fatal (`Unknown flags "
    "in XLA_FLAGS`). Which input set the switches off on that machine (an inherited "
    "`LIBTPU_INIT_ARGS`, or a libtpu default that depends on the host) could not be reproduced "
    "here; it no longer matters: `dlc-jax plan`, `dlc-jax train` and `launch/tpu_pod_train.sh` "
    "set one flag set (`dlc_jax/tpu_flags.py`: MaxText's FSDP set - async collective fusion of "
    "the all-gathers overlapped with compute, the DCN data-parallel all-reduce optimization - and "
    "both windowed-einsum switches on), over whatever the environment holds, and each plan JSON "
    "records it (`xla_flags`). `plan.libtpu_flags` in a config adds or overrides flags for both "
    "the plan and the run. A test plans a small row twice in fresh processes, once with the "
    "switches off in the environment, and checks peak bytes and FLOPs agree within 1%.",
    "",
    "With the flags the headline row's XLA FLOPs are the committed ones to 1e-6 (train step "
    "8.7818e12, theta_s forward 1.6811e12); its train-step temporaries are 9.66e9 bytes (8.91e9 "
    "before: the async-collective-fusion flags keep more gathered weights live) and its peak "
    "18.28e9 bytes per chip (17.53e9), 81% of HBM left.",
    "",
    "### Roofline step time",
    "",
    "Each compiled program gets a compute, an HBM and an ICI time against the chip's published "
    "ceilings (`dlc_jax/plan/chips.py`, sources in `bw_source`: v5p 459 TFLOP/s, 2,765 GB/s HBM, "
    "1,200 GB/s bidirectional ICI per chip; v5e 197 / 819 / 400; v6e 918 / 1,638 / 800; v4 275 / "
    "1,200 / 269 (the pod's all-reduce bandwidth per chip)); its bound is the largest and the "
    "step is the train step plus one theta_s forward (`dlc_jax/plan/roofline.py`). Compute uses "
    "the analytic FLOPs (what the hardware runs; XLA's count sees each loop body once); HBM uses "
    "XLA's bytes accessed scaled by the same undercount as its visible FLOPs; ICI uses FSDP's "
    "weight all-gathers (two in the train step, one in the forward, compute dtype) and the "
    "float32 gradient reduce-scatter. It assumes perfect overlap, so it is a lower bound; the "
    "old 40%-of-peak figure stays beside it for one release. Headline row: train step 3.08 s "
    "compute vs 1.19 s HBM vs 0.01 s ICI, theta_s forward 0.78 / 0.47 / 0.003 s: compute-bound, "
    "3.86 s (old: 9.65 s at 40%). Rows compiled before issue 30 carry no bytes-accessed figure: "
    "their HBM term is 0 (said in each JSON's roofline note) until they are recompiled.",
    "",
    "### The MoE FLOPs (30B-A3B 17.75x; 1.18 / 1.68 / 2.66x with the expert axis)",
    "",
    "Megablox's grouped matmuls carry their own cost estimate, 2*m*k*n over the m rows passed to "
    "the kernel (`gmm` and `tgmm` in jax's megablox). Measured on the tiny Qwen3-MoE's theta_s "
    "forward (8 experts, top 2, d 64, expert width 32): 6.71e7 FLOPs per call at fsdp 4 and "
    "1.68e7 at fsdp 16, exactly 2*m*64*32 for the device's own (token, slot) rows: the estimate "
    "is the active work of the rows it is given. With an expert axis of size e and the "
    "all-gather dispatch (`dlc_jax/model/moe_dispatch.py`), each device gathers its e peers' "
    "tokens and passes all e x rows to the kernel, zeroing the rows of other shards' experts; "
    "the kernel visits only its local groups' tiles, so the work stays the same while the "
    "estimate grows e-fold: 1.18 + 0.49 (e - 1) gives 1.67 and 2.65 for e = 2, 4 (measured 1.68, "
    "2.66; 1.18 at e = 1 is the tiny model's elementwise work). The all-to-all dispatch passes "
    "only routed rows and does not have this excess.",
    "",
    "30B-A3B (128 experts, top 8, no expert axis, fsdp 32): per device, XLA's count exceeds the "
    "prediction by 9.6e12 in the theta_s forward, 31x the active expert work of one counted "
    "layer body (2 x (4,096 tokens x 8) x 2,048 x 768 x 3 = 3.09e11), and by 4.08e13 in the "
    "train step, 132x = 4 grouped-matmul passes (forward, remat forward, the two backward "
    "kernels) x 33. So the expert matmuls are counted at about fsdp (32) times the rows they "
    "multiply. The tiny model at fsdp 4 and 16 does not show this factor, so what multiplies "
    "the count at 30B-A3B is not isolated (its compile, about 390 CPU-s, did not fit this "
    "session's loaded machine); with `ragged_dot` experts the forward is counted at 1.04x and "
    "the train step at 18.24x, the backward's lowering taking the same factor.",
    "",
    "The MoE rows' roofline therefore uses the analytic active work (8 of 128 experts, as the "
    "kernels run it), not XLA's count: 30B-A3B 64 x 8,192 on v5p-64, 2.19 s per step, "
    "compute-bound. Uncertainty: (1) the grouped matmul pads each expert's rows to the 128-row "
    "tile, up to 128 x 127 rows on 32,768 per device and layer body (+up to 50%, about +25% on "
    "average, on the expert matmuls); (2) the row predates bytes accessed, so its HBM term is "
    "not in the figure; (3) if the 32x above were work rather than counting (the expert "
    "matmuls replicated over the FSDP axis), the step would be up to 18x longer - the tiny "
    "model's per-device kernel estimates say counting, a 30B-A3B compile reading the kernels' "
    "HLO would settle it.",
    "",
    "### Compile time of the 1.7B x 32k plan",
    "",
    "With the flags, from a clean clone of this branch: 144.7 CPU-s for both programs (train "
    "step 117.1, theta_s forward 26.5), 962 s wall at a 1-minute load of 16.9-19.9 on the "
    "2-core machine (108 CPU-s / 58 s wall quiet before issue 30; 332 CPU-s on the other "
    "machine without windowed einsums). The wall target (<= 120 s quiet) is for a quiet "
    "machine: `git clone REPO /tmp/planclone && cd /tmp/planclone && PYTHONPATH=$PWD "
    "python -m dlc_jax.cli plan --config configs/qwen3_1p7b_dlc.yaml --topology v5p-16 "
    "train.batch_prompts=1 sampler.n=8 sampler.max_model_len=32768 train.micro_batches=1 "
    "mesh.data=1 mesh.fsdp=-1 mesh.tensor=1 --json /tmp/h.json` and read compile_s / "
    "compile_cpu_s / loadavg in the JSON.",
    "",
]

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
