#!/usr/bin/env bash
# Main job: set up (idempotent), then serve the embedded model with
# --scheduling-policy continuum and drive a short multi-turn agent session.
# Extra arguments go to vllm-continuum-demo (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${CONTINUUM_VENV:-$HOME/.venvs/vllm-continuum}
# Unbuffered: per-turn lines appear as they happen, also through a pipe.
PYTHONUNBUFFERED=1 exec "$VENV/bin/vllm-continuum-demo" "$@"
