#!/usr/bin/env bash
# Test job: set up (idempotent), then run the whole test suite: unit tests,
# real-scheduler tests, and end-to-end tests against a real `vllm serve`
# (replicas behind vllm-router, LMCache, vLLM's own offloading included);
# then the scheduler-level tests again on vLLM 0.33.0's own code
# (scripts/check_vllm_033.sh, the modules that touch vLLM; skipped with
# CONTINUUM_SKIP_VLLM033=1 or when pytest arguments are given).
# Extra arguments go to pytest (e.g. -m "not e2e" for the fast part only).
# The set-up's wall time is printed before the suite starts; pytest's
# closing line gives the suite's own ("N passed in Ss (h:mm:ss)").
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
bash scripts/setup.sh
echo "[tests] set-up took $(( $(date +%s) - t0 ))s; running the suite"
VENV=${CONTINUUM_VENV:-$HOME/.venvs/vllm-continuum}
rc=0
"$VENV/bin/python" -m pytest -ra --durations=25 "$@" || rc=$?
if [ $# -eq 0 ] && [ -z "${CONTINUUM_SKIP_VLLM033:-}" ]; then
  t1=$(date +%s)
  echo "[tests] the scheduler-level tests on vLLM 0.33.0 (scripts/check_vllm_033.sh)"
  bash scripts/check_vllm_033.sh || rc=$?
  echo "[tests] vLLM 0.33 check took $(( $(date +%s) - t1 ))s"
fi
exit $rc
