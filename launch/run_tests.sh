#!/usr/bin/env bash
# Set up the environment (if needed), then lint (ruff), type-check (mypy) and run the whole test
# suite (pytest). Extra args go to pytest. Fails if any of the three fails; all three always run.
# --fast (first argument): the unit tier only (tests/unit: no subprocess, no server, few compiles;
# <= 3 minutes of pytest), `-m unit`.
set -euo pipefail
tier=()
if [[ "${1:-}" == "--fast" ]]; then
  shift
  tier=(-m unit)
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# the suite writes checkpoints, exports and compile caches under the temp dir (a full /tmp failed a
# CI run in session 11 with errors far from the cause): say it once up front
tmp="${TMPDIR:-/tmp}"
free_kib=$(df -Pk "$tmp" 2>/dev/null | awk 'NR == 2 {print $4}' || true)
if [[ -n "$free_kib" && "$free_kib" -lt $((4 * 1024 * 1024)) ]]; then
  echo "[tests] only $((free_kib / 1024)) MiB free under $tmp (need >= 4 GiB): free space or set TMPDIR" >&2
  exit 1
fi
bash launch/setup_env.sh
VENV="${DLC_JAX_VENV:-$ROOT/.venv}"
set +e
checks=0
echo "[tests] ruff check + ruff format --check (config: pyproject.toml)" >&2
"$VENV/bin/ruff" check dlc_jax tests || checks=1
"$VENV/bin/ruff" format --check dlc_jax tests || checks=1
echo "[tests] mypy dlc_jax" >&2
"$VENV/bin/mypy" dlc_jax || checks=1
# Tests run in parallel worker processes (pytest-xdist): DLC_JAX_TEST_WORKERS of them (default: the
# CPU count, at most 4; 0 = in this process). Most tests are single-threaded compiles or waits on a
# subprocess, so two workers on two cores finish the suite well before one does.
workers="${DLC_JAX_TEST_WORKERS:-$(n=$(nproc); echo $((n < 4 ? n : 4)))}"
par=()
[[ "$workers" != "0" ]] && par=(-n "$workers" --dist worksteal)
"$VENV/bin/python" -m pytest -q "${par[@]}" "${tier[@]}" "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "[tests] pytest collected no tests: failing" >&2
  exit 1
fi
if [[ $checks -ne 0 ]]; then
  echo "[tests] lint or type check failed (see above)" >&2
  [[ $rc -eq 0 ]] && rc=1
fi
exit $rc
