#!/usr/bin/env bash
# Test job: set up (idempotent), then run the whole test suite: unit tests,
# real-scheduler tests, and end-to-end tests against a real `vllm serve`.
# Extra arguments go to pytest (e.g. -m "not e2e" for the fast part only).
# The set-up's wall time is printed before the suite starts; pytest's
# closing line gives the suite's own ("N passed in Ss (h:mm:ss)").
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
bash scripts/setup.sh
echo "[tests] set-up took $(( $(date +%s) - t0 ))s; running the suite"
VENV=${CONTINUUM_VENV:-$HOME/.venvs/vllm-continuum}
exec "$VENV/bin/python" -m pytest -ra "$@"
