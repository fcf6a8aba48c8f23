#!/usr/bin/env bash
# Start one vLLM sampler on a GPU host, reachable by the TPU trainer (listens on 0.0.0.0).
# Start one per GPU host and list them all in the trainer's sampler.address (comma-separated).
#
# Environment (all optional):
#   DLC_MODEL           HF directory of the initial model          (default /data/models/Qwen3-1.7B)
#   DLC_TP              tensor-parallel size (GPUs on this host)   (default: all visible GPUs)
#   DLC_PORT            gRPC port                                   (default 50051)
#   DLC_DTYPE           float32 | bfloat16                          (default bfloat16)
#   DLC_MAX_MODEL_LEN   prompt + response tokens                    (default 2048)
#   DLC_TOKEN_FILE      bearer token every call must carry          (default: no auth)
#   DLC_TLS_CERT, DLC_TLS_KEY  server certificate and key (PEM)     (default: plaintext)
#   DLC_JAX_VENV        virtualenv with dlc_jax[sampler-gpu]        (default ./.venv)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${DLC_JAX_VENV:-$ROOT/.venv}"
MODEL="${DLC_MODEL:-/data/models/Qwen3-1.7B}"
if [[ -z "${DLC_TP:-}" ]]; then
  DLC_TP="$(nvidia-smi --list-gpus 2>/dev/null | wc -l)"
  if [[ "$DLC_TP" -lt 1 ]]; then
    DLC_TP=1
  fi
fi

auth=()
if [[ -n "${DLC_TOKEN_FILE:-}" ]]; then
  auth+=(--token-file "$DLC_TOKEN_FILE")
fi
if [[ -n "${DLC_TLS_CERT:-}" || -n "${DLC_TLS_KEY:-}" ]]; then
  : "${DLC_TLS_CERT:?DLC_TLS_CERT and DLC_TLS_KEY go together}"
  : "${DLC_TLS_KEY:?DLC_TLS_CERT and DLC_TLS_KEY go together}"
  auth+=(--tls-cert "$DLC_TLS_CERT" --tls-key "$DLC_TLS_KEY")
fi

exec "$VENV/bin/dlc-jax" sampler serve --backend vllm --model "$MODEL" \
  --tensor-parallel-size "$DLC_TP" --host 0.0.0.0 --port "${DLC_PORT:-50051}" \
  --dtype "${DLC_DTYPE:-bfloat16}" --max-model-len "${DLC_MAX_MODEL_LEN:-2048}" --max-head-k 20 \
  "${auth[@]}" "$@"
