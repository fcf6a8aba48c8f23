#!/usr/bin/env bash
# Runs on EVERY worker of a TPU VM pod slice (same command everywhere; JAX finds its process id and
# the coordinator from the TPU metadata: distributed.mode=always). Started on all workers at once by
# launch/tpu_pod_launch.sh. Extra args are more `dlc-jax train` overrides (key.sub=value).
#
# Environment (all optional):
#   DLC_CONFIG            trainer config            (default configs/qwen3_1p7b_dlc.yaml)
#   DLC_SAMPLERS          comma-separated host:port list of the GPU samplers (default: config's sampler.address)
#   DLC_TOKEN_FILE        file with the samplers' bearer token       (default: none)
#   DLC_TLS_ROOT_CERT     PEM of the CA that signed the samplers' certs (default: plaintext gRPC)
#   DLC_JAX_VENV          virtualenv with dlc_jax installed (`pip install -e .[tpu]`) (default: ./.venv)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${DLC_JAX_VENV:-$ROOT/.venv}"
CONFIG="${DLC_CONFIG:-configs/qwen3_1p7b_dlc.yaml}"

overrides=(distributed.mode=always)
if [[ -n "${DLC_SAMPLERS:-}" ]]; then
  overrides+=("sampler.address=${DLC_SAMPLERS}")
fi
if [[ -n "${DLC_TOKEN_FILE:-}" ]]; then
  overrides+=("sampler.token_file=${DLC_TOKEN_FILE}")
fi
if [[ -n "${DLC_TLS_ROOT_CERT:-}" ]]; then
  overrides+=("sampler.tls_root_cert=${DLC_TLS_ROOT_CERT}")
fi

# The TPU compiler flags `dlc-jax plan` compiles with (dlc_jax/tpu_flags.py; `dlc-jax train` sets
# the same, plus the config's plan.libtpu_flags): exported so every process on the worker has them.
LIBTPU_INIT_ARGS="$("$VENV/bin/python" -m dlc_jax.tpu_flags)"
export LIBTPU_INIT_ARGS
echo "LIBTPU_INIT_ARGS=$LIBTPU_INIT_ARGS"

# Every worker keeps its own log file.
WORKER="${TPU_WORKER_ID:-$(hostname)}"
mkdir -p logs
"$VENV/bin/dlc-jax" train --config "$CONFIG" "${overrides[@]}" "$@" 2>&1 | tee "logs/train_worker_${WORKER}.log"
