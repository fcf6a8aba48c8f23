#!/usr/bin/env bash
# Set up the environment (if needed) and run the main job on its embedded default:
# a tiny Qwen3 trained with DLC on CPU against a real vLLM sampler on loopback.
# Extra args are passed to `dlc-jax train` (e.g. sampler.backend=jax).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash launch/setup_env.sh
VENV="${DLC_JAX_VENV:-$ROOT/.venv}"
exec "$VENV/bin/dlc-jax" train "$@"
