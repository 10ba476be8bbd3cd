#!/usr/bin/env bash
# Test job: set up (idempotent), then run the whole test suite: unit tests,
# real-scheduler tests, and end-to-end tests against a real `vllm serve`.
# Extra arguments go to pytest (e.g. -m "not e2e" for the fast part only).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${CONTINUUM_VENV:-$HOME/.venvs/vllm-continuum}
exec "$VENV/bin/python" -m pytest -ra "$@"
