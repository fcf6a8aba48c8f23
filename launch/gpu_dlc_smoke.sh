#!/usr/bin/env bash
# One prepared GPU check: a random Qwen3-0.6B-shaped model trained for a few DLC steps by the JAX
# trainer against a sampler on the same GPU host (loopback gRPC), recording the trainer's tokens/s
# and the weight-push seconds (gRPC chunks and the raw-socket data plane).
#
#   launch/gpu_dlc_smoke.sh OUT_DIR
#
# Environment knobs: BACKEND=auto|vllm|jax (auto: vLLM when importable, else our JAX sampler),
# STEPS (default 6), LAYERS/HIDDEN/INTERMEDIATE/HEADS/KV_HEADS/HEAD_DIM (default: Qwen3-0.6B's body),
# VOCAB (tokenizer size; the offline BPE tokenizer reaches ~4k, not Qwen3's 151,936),
# MAX_TOKENS (response length, default 256), PROMPTS (prompts per step, default 16), N (samples per
# prompt, default 8), PYTHON (default python3). Writes OUT_DIR/gpu_dlc_smoke.json and .md.
# On CPU, `LAYERS=2 HIDDEN=64 INTERMEDIATE=128 HEADS=2 KV_HEADS=1 HEAD_DIM=32 MAX_TOKENS=8 STEPS=3
# BACKEND=jax launch/gpu_dlc_smoke.sh /tmp/smoke` runs the same path in about a minute.
set -euo pipefail
OUT="${1:?usage: launch/gpu_dlc_smoke.sh OUT_DIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BACKEND="${BACKEND:-auto}"
if [[ "$BACKEND" == auto ]]; then
  if "$PY" -c "import vllm" 2>/dev/null; then BACKEND=vllm; else BACKEND=jax; fi
fi
STEPS="${STEPS:-6}"
export PYTHONUNBUFFERED=1
# trainer and sampler share one GPU: no process may grab 75% of its memory up front
export XLA_PYTHON_CLIENT_PREALLOCATE=false

echo "[gpu-smoke] backend=$BACKEND steps=$STEPS out=$OUT" >&2
"$PY" -c "import jax; print('[gpu-smoke] jax', jax.__version__, jax.devices())" >&2

MODEL="$OUT/model"
if [[ ! -f "$MODEL/config.json" ]]; then
  "$PY" -m dlc_jax.cli make-tiny "$MODEL" --tied --vocab "${VOCAB:-4096}" \
    --hidden "${HIDDEN:-1024}" --intermediate "${INTERMEDIATE:-3072}" --layers "${LAYERS:-28}" \
    --heads "${HEADS:-16}" --kv-heads "${KV_HEADS:-8}" --head-dim "${HEAD_DIM:-128}" --max-pos 4096
fi

MAX_TOKENS="${MAX_TOKENS:-256}"
MAX_LEN=$((MAX_TOKENS + 128))
"$PY" -m dlc_jax.cli sampler serve --backend "$BACKEND" --model "$MODEL" --dtype bfloat16 \
  --max-model-len "$MAX_LEN" --max-num-seqs 256 --max-n 64 --push-data-port 0 \
  > "$OUT/sampler.log" 2>&1 &
SAMPLER_PID=$!
trap 'kill $SAMPLER_PID 2>/dev/null || true' EXIT
ADDR=""
for _ in $(seq 1 600); do
  ADDR="$(sed -n 's/.*LISTENING \([^ ]*\).*/\1/p' "$OUT/sampler.log" | head -n 1)"
  [[ -n "$ADDR" ]] && break
  kill -0 "$SAMPLER_PID" 2>/dev/null || { cat "$OUT/sampler.log" >&2; exit 1; }
  sleep 0.5
done
[[ -n "$ADDR" ]] || { echo "[gpu-smoke] sampler did not start" >&2; exit 1; }
echo "[gpu-smoke] sampler at $ADDR" >&2

"$PY" -m dlc_jax.cli train --config configs/qwen3_0p6b_dlc.yaml \
  model.path="$MODEL" model.param_dtype=float32 model.compute_dtype=bfloat16 \
  mesh.data=1 mesh.fsdp=1 mesh.tensor=1 \
  data.source=arithmetic data.chat_template=false \
  sampler.backend="$BACKEND" sampler.address="$ADDR" sampler.dtype=bfloat16 \
  sampler.n="${N:-8}" sampler.max_tokens="$MAX_TOKENS" sampler.max_model_len="$MAX_LEN" \
  train.steps="$STEPS" train.batch_prompts="${PROMPTS:-16}" train.micro_batches=1 \
  optim.warmup=0 resync.policy=every_k resync.k=2 \
  checkpoint.dir="$OUT/ckpt" checkpoint.every=100000 checkpoint.resume=false checkpoint.overwrite=true \
  log.dir="$OUT/logs" log.tensorboard=false \
  2>&1 | tee "$OUT/train.log"

"$PY" - "$OUT" "$ADDR" "$BACKEND" <<'EOF'
import json, os, re, sys, time
from pathlib import Path

import jax.numpy as jnp

from dlc_jax.model import load_hf
from dlc_jax.sampler.client.client import SamplerClient

out, addr, backend = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
rows = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines() if line.strip()]
cfg = json.loads((out / "model" / "config.json").read_text())
model = load_hf(out / "model", param_dtype=jnp.float32, compute_dtype=jnp.bfloat16)
import jax
from flax import nnx
n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
client = SamplerClient(addr)
version = int(client.info()["version"]) + 100
push = {}
for transport in ("grpc", "socket"):
    times = []
    for _ in range(3):
        version += 1
        t0 = time.perf_counter()
        try:
            res = client.push_model(model, version, dtype="bfloat16", transport=transport)
        except TypeError:  # an older client without the transport argument
            res = client.push_model(model, version, dtype="bfloat16")
        times.append(time.perf_counter() - t0)
        assert res.ok, res.message
    push[transport] = {"best_s": min(times), "all_s": times, "bytes": int(res.bytes),
                       "gb_per_s": res.bytes / min(times) / 1e9}
# steps after the first two (compile) are steady state
steady = rows[2:] if len(rows) > 3 else rows[1:]
n_rows = int(os.environ.get("PROMPTS", "16")) * int(os.environ.get("N", "8"))
log = (out / "train.log").read_text()
train_push = [float(m.group(2)) for m in re.finditer(r"push: version (\d+).*? in ([\d.]+)s", log)]
resp = sum(r["response_len"] for r in steady) / max(len(steady), 1)
step_s = sum(r["step_s"] for r in steady) / max(len(steady), 1)
wait_s = sum(r.get("wait_s", 0.0) for r in steady) / max(len(steady), 1)
result = {
    "backend": backend, "device": str(jax.devices()[0]), "jax": jax.__version__,
    "params": int(n_params), "layers": cfg["num_hidden_layers"], "hidden": cfg["hidden_size"],
    "vocab": cfg["vocab_size"], "steps": len(rows), "steady_steps": len(steady),
    "mean_response_len": resp, "mean_step_s": step_s, "mean_wait_s": wait_s,
    "first_step_s": rows[0]["step_s"] if rows else None, "rows_per_step": n_rows,
    "response_tokens_per_s": n_rows * resp / step_s if step_s else None,
    "push_in_training_s": train_push, "push_direct": push,
    "metrics_last": rows[-1] if rows else None,
}
(out / "gpu_dlc_smoke.json").write_text(json.dumps(result, indent=2))
print(json.dumps({k: v for k, v in result.items() if k != "metrics_last"}, indent=2))
EOF
