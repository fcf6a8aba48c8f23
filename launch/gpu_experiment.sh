#!/usr/bin/env bash
# The smallest accelerator experiment, as one prepared script: preset `qwen3_0p6b_smoke` = Qwen3-0.6B's
# body (1024 wide, 16/8 heads, head_dim 128, MLP 3072) with 4 layers and the offline 4k tokenizer,
# random init + a short SFT warm-up on chain arithmetic, then 2 on-policy runs (noise threshold), TIS
# and DLC (1 seed each) under the collapse scenario (never-synced, int8 sampler), JAX sampler backend
# (no vLLM needed), KL on reference and own prefixes, report.md + plots.
#
#   launch/gpu_experiment.sh OUT_DIR [extra `dlc-jax experiment` args]
#
# The experiment (checkpoints, caches) lives in WORK_DIR (default /tmp/dlc_gpu_experiment; rerun
# with the same WORK_DIR to resume); OUT_DIR receives only what the report is made of (report.md,
# plots/, results/, noise.json, timings, model.json, prefixes.json) plus each run's train.log and
# metrics.jsonl, also when the experiment stops early. Regenerate the report from OUT_DIR with
#   dlc-jax experiment --preset qwen3_0p6b_smoke --out OUT_DIR --report-only
# Env: STEPS (default 8), PYTHON (default python3), RUN_TIMEOUT (seconds per run, default 300;
# 3600 with CPU_SMOKE), CPU_SMOKE=1 shrinks the model to 1 layer x 64 wide and the warm-up to 5
# steps (the same path on CPU, for testing the script; its numbers mean nothing).
set -euo pipefail
OUT="${1:?usage: launch/gpu_experiment.sh OUT_DIR [extra dlc-jax experiment args]}"
shift
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
WORK="${WORK_DIR:-/tmp/dlc_gpu_experiment}"
mkdir -p "$OUT" "$WORK"
OUT="$(cd "$OUT" && pwd)"
export PYTHONUNBUFFERED=1
# the trainer, the sampler and the evaluating process share one device: none may grab 75% of it up front
export XLA_PYTHON_CLIENT_PREALLOCATE=false
EXTRA=()
DEFAULT_TIMEOUT=300
if [[ "${CPU_SMOKE:-0}" == 1 ]]; then
  DEFAULT_TIMEOUT=3600
  EXTRA=(--warmup steps=5 --warmup eval_prompts=2 --warmup dims.hidden_size=64
         --warmup dims.intermediate_size=128 --warmup dims.num_hidden_layers=1
         --warmup dims.num_attention_heads=2 --warmup dims.num_key_value_heads=1 --warmup dims.head_dim=32)
fi

collect() {  # copy the light outputs to OUT_DIR (runs even when the experiment fails)
  for f in report.md noise.json model.json failures.json; do
    [[ -f "$WORK/$f" ]] && cp "$WORK/$f" "$OUT/"
  done
  for d in plots results; do
    [[ -d "$WORK/$d" ]] && rm -rf "${OUT:?}/$d" && cp -r "$WORK/$d" "$OUT/"
  done
  cp "$WORK"/timings_*.json "$OUT/" 2>/dev/null || true
  if [[ -f "$WORK/prefixes/prefixes.json" ]]; then mkdir -p "$OUT/prefixes" && cp "$WORK/prefixes/prefixes.json" "$OUT/prefixes/"; fi
  for r in "$WORK"/runs/*/; do
    [[ -d "$r" ]] || continue
    n="$(basename "$r")"; mkdir -p "$OUT/run_logs/$n"
    cp "$r/train.log" "$OUT/run_logs/$n/" 2>/dev/null || true
    cp "$r/logs/metrics.jsonl" "$OUT/run_logs/$n/" 2>/dev/null || true
  done
  return 0
}
trap collect EXIT

# preflight (seconds): every module the warm-up, trainer, sampler and report need, named if missing
"$PY" - <<'PY' 2>&1 | tee -a "$OUT/experiment.log"
import importlib, sys
need = ["jax", "flax", "optax", "orbax.checkpoint", "grain", "grpc", "numpy", "yaml", "matplotlib",
        "transformers", "torch", "tokenizers", "safetensors", "dlc_jax.trainer.loop",
        "dlc_jax.sampler.service.server", "dlc_jax.experiments.runner"]
missing = []
for m in need:
    try:
        importlib.import_module(m)
    except Exception as e:  # noqa: BLE001
        missing.append(f"{m} ({type(e).__name__}: {str(e)[:80]})")
if missing:
    sys.exit("[gpu-experiment] missing modules: " + "; ".join(missing))
import jax
print("[gpu-experiment] jax", jax.__version__, jax.devices())
PY
[[ ${PIPESTATUS[0]} -eq 0 ]] || exit 1
T0=$(date +%s)
"$PY" -m dlc_jax.cli experiment --preset qwen3_0p6b_smoke --out "$WORK" --steps "${STEPS:-8}" \
  --run-timeout "${RUN_TIMEOUT:-$DEFAULT_TIMEOUT}" "${EXTRA[@]}" "$@" 2>&1 | tee -a "$OUT/experiment.log"
echo "[gpu-experiment] done in $(( $(date +%s) - T0 )) s; report: $OUT/report.md" | tee -a "$OUT/experiment.log"
