#!/usr/bin/env bash
# Convert a training checkpoint into an HF directory for serving (vLLM / transformers).
#   launch/export_hf.sh CHECKPOINT_DIR OUT_DIR [STEP]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DLC_JAX_VENV:-$ROOT/.venv}"
if [[ $# -lt 2 ]]; then
  echo "usage: $0 CHECKPOINT_DIR OUT_DIR [STEP]" >&2
  exit 2
fi
step=()
if [[ $# -ge 3 ]]; then
  step=(--step "$3")
fi
exec "$VENV/bin/dlc-jax" export --checkpoint "$1" --out "$2" --dtype "${DLC_DTYPE:-bfloat16}" "${step[@]}"
