#!/usr/bin/env bash
# Set up the environment (if needed) and run the whole test suite. Extra args go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash launch/setup_env.sh
VENV="${DLC_JAX_VENV:-$ROOT/.venv}"
set +e
"$VENV/bin/python" -m pytest -q "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "[tests] pytest collected no tests: failing" >&2
  exit 1
fi
exit $rc
