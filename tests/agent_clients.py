"""Test helpers: run the real agent clients against a server.

The clients are installed, at pinned versions, by ``scripts/setup.sh``:
Claude Code and OpenCode from the npm registry into ``CLIENTS_DIR``
(``~/.cache/vllm-continuum/clients/npm``), smolagents from PyPI into the
agents venv. Each runs as a user would run it, in a throw-away working
directory and a throw-away ``HOME`` (no user settings, no session files
left behind), with the environment it documents for a local server and its
own update checks, telemetry and other non-essential traffic turned off.

The scripted replies (``scripted_replies.py``, a logits processor in the
server) are chosen by ``SCRIPTS``: every client gets two tool calls and then
its final answer, each call carrying a marker the processor counts in the
next prompt.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

HERE = Path(__file__).resolve().parent
CLIENTS_DIR = Path(os.environ.get("CONTINUUM_CLIENTS", os.path.expanduser("~/.cache/vllm-continuum/clients")))
NPM_BIN = CLIENTS_DIR / "npm" / "node_modules" / ".bin"
# setup.sh writes why a client could not be installed here (the test skips with it).
INSTALL_ERRORS = CLIENTS_DIR / "install-errors.txt"
AGENT_VENV = Path(os.environ.get("CONTINUUM_AGENT_VENV", os.path.expanduser("~/.venvs/vllm-continuum-agents")))
SMOLAGENTS_RUNNER = HERE / "smolagents_runner.py"

# What each client's prompts hold (its system prompt), and its script.
CLAUDE_MATCH = "You are a Claude agent"  # claude -p: "You are a Claude agent, built on ..."
OPENCODE_MATCH = "You are opencode"
SMOLAGENTS_MATCH = "solve any task using code blobs"
FINAL_ANSWER = "The README says hello."
CALIBRATE_MATCH = "CALIBRATE-DECODE-SPEED"
CALIBRATE_REPLY = " ".join(["seven"] * 32)  # 32 tokens


def _hermes_call(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as hermes-format models write it (vLLM's ``hermes`` parser)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _shell_script(tool: str, tag: str) -> list[dict[str, str]]:
    return [
        {"reply": _hermes_call(tool, {"command": f"echo {tag}-1 && ls", "description": "List files"}),
         "marker": f"{tag}-1"},
        {"reply": _hermes_call(tool, {"command": f"echo {tag}-2 && cat README.md", "description": "Read README"}),
         "marker": f"{tag}-2"},
        {"reply": FINAL_ANSWER},
    ]


SCRIPTS: dict[str, Any] = {
    "scripts": [
        {"match": CLAUDE_MATCH, "steps": _shell_script("Bash", "ccstep")},
        {"match": OPENCODE_MATCH, "steps": _shell_script("bash", "ocstep")},
        # smolagents CodeAgent: Python between <code> tags; final_answer(...) ends it.
        {"match": SMOLAGENTS_MATCH, "steps": [
            {"reply": "Thought: I compute the value.\n<code>\nx = 6 * 7\nprint('sastep-1', x)\n</code>",
             "marker": "sastep-1"},
            {"reply": "Thought: I check it.\n<code>\nprint('sastep-2', x + 1)\n</code>", "marker": "sastep-2"},
            {"reply": "Thought: I have the answer.\n<code>\nfinal_answer(str(x))\n</code>"},
        ]},
        {"match": CALIBRATE_MATCH, "steps": [{"reply": CALIBRATE_REPLY}]},
    ],
    # A client's side requests (OpenCode's title, Claude Code's summaries).
    "default": "OK.",
}
SCRIPT_TURNS = 3  # two tool calls, then the final answer


def client_env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    """The test's environment without any client's own settings or keys,
    ``HOME`` (and XDG dirs) in ``home``, plus ``extra``."""
    drop = ("ANTHROPIC_", "CLAUDE_", "OPENAI_", "OPENCODE_", "CODEX_", "XDG_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update({
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "NO_COLOR": "1",
    })
    env.update(extra)
    return env


@dataclass
class ClientRun:
    """What one client run did."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float
    timeout_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return (f"exit {self.returncode} after {self.seconds:.0f}s (limit {self.timeout_s:.0f}s)\n"
                f"stdout: {self.stdout[-2000:]}\nstderr: {self.stderr[-2000:]}")


def run_client(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> ClientRun:
    """Run ``argv`` in its own process group; on timeout the whole group
    (the client and the commands it started) is killed by its id."""
    # PWD too: some clients (OpenCode) take their project directory from it.
    env = {**env, "PWD": str(cwd)}
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        out, err = out or "", (err or "") + f"\n[test] killed after {timeout_s:.0f}s"
    return ClientRun(proc.returncode, out, err, time.monotonic() - started, timeout_s)


def make_workdir(path: Path) -> Path:
    """A tiny project for the agent to look at."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "README.md").write_text("hello\n")
    (path / "main.py").write_text("print('hello')\n")
    return path


def require_client(binary: Path, what: str) -> None:
    """Skip the test when ``scripts/setup.sh`` could not install ``what``
    (its recorded reason: registry unreachable, ...); fail when it was never
    asked to."""
    import pytest

    if binary.exists() and os.access(binary, os.X_OK):
        return
    if INSTALL_ERRORS.exists():
        pytest.skip(f"{what} could not be installed by scripts/setup.sh: {' '.join(INSTALL_ERRORS.read_text().split())}")
    pytest.fail(f"{what} missing at {binary}: run CONTINUUM_AGENT_CLIENT_TESTS=1 bash scripts/setup.sh")


def run_claude_code(url: str, served_name: str, workdir: Path, home: Path, timeout_s: float) -> ClientRun:
    """``claude -p`` as documented for a gateway: ``ANTHROPIC_BASE_URL``,
    a dummy key, the served model for every model slot; non-essential traffic
    off. ``--tools Bash`` keeps the prompt inside the small model's context
    (the default tool set is ~10,300 tokens of schemas); ``--allowedTools
    Bash`` lets the commands run without an interactive prompt."""
    env = client_env(home, {
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "dummy",
        "ANTHROPIC_AUTH_TOKEN": "dummy",
        "ANTHROPIC_MODEL": served_name,
        "ANTHROPIC_SMALL_FAST_MODEL": served_name,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": served_name,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": served_name,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": served_name,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "512",
    })
    argv = [str(NPM_BIN / "claude"), "-p", "List the files, then read README.md and tell me what it says.",
            "--tools", "Bash", "--allowedTools", "Bash", "--output-format", "json", "--no-session-persistence"]
    run = run_client(argv, workdir, env, timeout_s)
    try:
        run.extra = json.loads(run.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        run.extra = {}
    return run


def run_opencode(url: str, served_name: str, workdir: Path, home: Path, timeout_s: float) -> ClientRun:
    """``opencode run`` with a custom OpenAI-compatible provider (its
    documented way to use a local server); model list fetching, updates,
    sharing, LSP downloads and default plugins off. Tools other than
    ``bash`` and ``read`` are disabled in the config to keep the prompt inside
    the small model's context."""
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"local": {
            "npm": "@ai-sdk/openai-compatible", "name": "vLLM",
            "options": {"baseURL": url + "/v1", "apiKey": "dummy"},
            "models": {served_name: {"name": served_name, "limit": {"context": 8192, "output": 512}}},
        }},
        "model": f"local/{served_name}",
        "small_model": f"local/{served_name}",
        "autoupdate": False,
        "share": "disabled",
        "tools": {t: False for t in ("edit", "glob", "grep", "skill", "task", "todowrite", "webfetch", "write")},
    }
    home.mkdir(parents=True, exist_ok=True)
    config_path = home / "opencode.json"
    config_path.write_text(json.dumps(config))
    env = client_env(home, {
        "OPENCODE_CONFIG": str(config_path),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    })
    argv = [str(NPM_BIN / "opencode"), "run", "List the files, then read README.md and tell me what it says."]
    return run_client(argv, workdir, env, timeout_s)


def run_smolagents(url: str, served_name: str, workdir: Path, home: Path, timeout_s: float) -> ClientRun:
    """A stock smolagents ``CodeAgent`` (``smolagents_runner.py``, run by the
    agents venv's Python) with ``OpenAIServerModel`` at ``url``."""
    env = client_env(home, {})
    argv = [str(AGENT_VENV / "bin" / "python"), str(SMOLAGENTS_RUNNER), "--url", url + "/v1",
            "--model", served_name, "--task", "Compute six times seven."]
    run = run_client(argv, workdir, env, timeout_s)
    try:
        run.extra = json.loads(run.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        run.extra = {}
    return run


@dataclass
class Speed:
    """The server's measured speed on this machine, now."""

    prefill_tps: float
    decode_tps: float

    def budget_s(self, turns: int, prompt_tokens: int, reply_tokens: int, slack: float = 5.0,
                 client_s: float = 90.0) -> float:
        """A wall limit for a client run of ``turns`` turns of at most
        ``prompt_tokens`` prompt (none of it cached) and ``reply_tokens``
        reply each: ``slack`` times the engine time at the measured speed,
        plus ``client_s`` for the client itself (start-up, tools)."""
        engine_s = turns * (prompt_tokens / self.prefill_tps + reply_tokens / self.decode_tps)
        return client_s + slack * engine_s


def measure_speed(url: str, served_name: str, prompt_words: int = 600) -> Speed:
    """Prefill and decode speed of the server, measured with two requests:
    a fresh prompt with a 1-token reply, then the same prompt (cached) with
    a forced 32-token reply. Both include the HTTP round trip, so both
    underestimate the engine: the budgets they give are generous."""
    words = " ".join(f"w{i % 97}" for i in range(prompt_words))
    prompt = f"{CALIBRATE_MATCH} {time.time_ns()} {words}"
    body = {"model": served_name, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
    t0 = time.monotonic()
    r = requests.post(url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    prefill_s = time.monotonic() - t0
    prompt_tokens = r.json()["usage"]["prompt_tokens"]
    t0 = time.monotonic()
    r = requests.post(url + "/v1/completions", json={**body, "max_tokens": 64}, timeout=600)
    r.raise_for_status()
    decode_s = time.monotonic() - t0
    completion_tokens = r.json()["usage"]["completion_tokens"]
    return Speed(prefill_tps=prompt_tokens / prefill_s, decode_tps=completion_tokens / decode_s)


COUNTERS = {
    "pins_created": ("vllm_continuum:pins_created", {}),
    "handoffs": ("vllm_continuum:pins_released", {"reason": "handoff"}),
    "ttl_expired": ("vllm_continuum:pins_released", {"reason": "ttl"}),
    "pressure": ("vllm_continuum:pins_released", {"reason": "pressure"}),
    "released": ("vllm_continuum:pins_released", {}),
    "ended_final_answer": ("vllm_continuum:jobs_ended", {"reason": "final_answer"}),
    "ended_finish_action": ("vllm_continuum:jobs_ended", {"reason": "finish_action"}),
    "implicit_started": ("vllm_continuum:implicit_turns", {"event": "started"}),
    "implicit_continued": ("vllm_continuum:implicit_turns", {"event": "continued"}),
    "context_mismatches": ("vllm_continuum:context_mismatches", {}),
    "pin_hit_tokens": ("vllm_continuum:pin_hit_tokens", {}),
    # ContextServe only: decisions by class (the rules layer decides here).
    "decided_fast": ("vllm_continuum:decisions", {"speed": "fast"}),
    "fast_pins_in_time": ("vllm_continuum:fast_pins", {"outcome": "in_time"}),
}


def counters(server: Any) -> dict[str, float]:
    from vllm_continuum_plugin.benchmarks.server import metric_sum

    metrics = server.metrics()
    return {name: metric_sum(metrics, prefix, **labels) for name, (prefix, labels) in COUNTERS.items()}


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def decisions(log_path: Path, match: str) -> list[dict[str, Any]]:
    """The processor's decisions for prompts of ``match`` (see scripted_replies)."""
    if not log_path.exists():
        return []
    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["match"] == match]


def report(name: str, run: ClientRun, moved: dict[str, float], rows: list[dict[str, Any]]) -> str:
    """One line for the test log (pytest -s / -rA shows it)."""
    prompts = [r["prompt_tokens"] for r in rows]
    line = (f"[{name}] {run.seconds:.0f}s (limit {run.timeout_s:.0f}s), turns {len(rows)}, prompt tokens {prompts}, "
            + ", ".join(f"{k} {v:g}" for k, v in moved.items() if v))
    print(line, file=sys.stderr)
    return line
