#!/usr/bin/env bash
# Workstation side: set up or start the trainer on every worker of a TPU VM pod slice over
# `gcloud compute tpus tpu-vm ssh --worker=all`.
#
#   launch/tpu_pod_launch.sh setup                 # copy this checkout + install dlc_jax[tpu] on all workers
#   launch/tpu_pod_launch.sh train [k=v ...]       # run launch/tpu_pod_train.sh on all workers
#   launch/tpu_pod_launch.sh stop                  # stop the trainer on all workers
#
# The TPU compiler flags (LIBTPU_INIT_ARGS) are set on each worker by tpu_pod_train.sh from
# dlc_jax/tpu_flags.py: the same ones `dlc-jax plan` compiles with.
# Required environment: TPU_NAME, ZONE. Optional: PROJECT, REMOTE_DIR (default dlc_jax),
# DLC_SAMPLERS, DLC_TOKEN_FILE, DLC_TLS_ROOT_CERT, DLC_CONFIG (paths as seen on the workers).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
: "${TPU_NAME:?set TPU_NAME to the TPU VM name}"
: "${ZONE:?set ZONE to the TPU zone, e.g. us-west4-a}"
REMOTE_DIR="${REMOTE_DIR:-dlc_jax}"
gcloud_args=(--zone "$ZONE")
if [[ -n "${PROJECT:-}" ]]; then
  gcloud_args+=(--project "$PROJECT")
fi

on_all_workers() {
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${gcloud_args[@]}" --worker=all --command "$1"
}

cmd="${1:-train}"
shift || true
case "$cmd" in
  setup)
    tarball="$(mktemp -t dlc_jax.XXXXXX.tar.gz)"
    git -C "$ROOT" archive --format=tar.gz -o "$tarball" HEAD
    gcloud compute tpus tpu-vm scp "$tarball" "$TPU_NAME:dlc_jax.tar.gz" "${gcloud_args[@]}" --worker=all
    rm -f "$tarball"
    on_all_workers "mkdir -p $REMOTE_DIR && tar -xzf dlc_jax.tar.gz -C $REMOTE_DIR && cd $REMOTE_DIR && python3 -m venv .venv && .venv/bin/pip install -q -e '.[tpu]'"
    ;;
  train)
    env_prefix=""
    for var in DLC_CONFIG DLC_SAMPLERS DLC_TOKEN_FILE DLC_TLS_ROOT_CERT; do
      if [[ -n "${!var:-}" ]]; then
        env_prefix+="$var=$(printf '%q' "${!var}") "
      fi
    done
    extra=""
    if [[ $# -gt 0 ]]; then
      extra="$(printf ' %q' "$@")"
    fi
    on_all_workers "cd $REMOTE_DIR && ${env_prefix}nohup bash launch/tpu_pod_train.sh${extra} > train.out 2>&1 &"
    echo "started on all workers of $TPU_NAME; follow worker 0 with:"
    echo "  gcloud compute tpus tpu-vm ssh $TPU_NAME --zone $ZONE --worker=0 --command 'tail -f $REMOTE_DIR/train.out'"
    ;;
  stop)
    on_all_workers "pkill -f 'dlc-jax train' || true"
    ;;
  *)
    echo "usage: $0 setup|train|stop [overrides...]" >&2
    exit 2
    ;;
esac
