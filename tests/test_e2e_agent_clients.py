"""End to end: the real coding-agent clients, unchanged, against a real server.

Claude Code (npm ``@anthropic-ai/claude-code``, ``claude -p`` on
``/v1/messages``), OpenCode (npm ``opencode-ai``, ``opencode run`` on
``/v1/chat/completions``) and a smolagents ``CodeAgent`` (PyPI
``smolagents``), at the versions ``scripts/setup.sh`` pins, each run once
against ``vllm serve --scheduling-policy continuum`` and once against
``--scheduling-policy context_serve``, on the embedded SmolLM2-135M.

A 135M model writes no valid tool call, so the replies are forced on the
server side by a test-only logits processor (``scripted_replies.py``,
loaded with ``--logits-processors``): two tool calls in hermes format, then
a final answer, the step chosen from the markers already in the prompt.
Everything else is real: the client (its prompts, headers, tool execution),
vLLM's API server, chat template and ``hermes`` tool parser, the plugin and
the engine. Each test checks on ``/metrics`` that

* the turns were one job: explicit by the client's own session id (Claude
  Code's ``X-Claude-Code-Session-Id``, OpenCode's ``X-Session-Id``; no
  implicit job, no context mismatch) or implicit by prefix (smolagents);
* every non-final turn's pin was handed over to the next turn (>= 90% is
  the bar; two of two here), none lapsed;
* the job ended at its last turn (``jobs_ended{reason=final_answer}`` for a
  text answer, ``finish_action`` for smolagents' ``final_answer(...)``);
* nothing is pinned and every block is free afterwards.

OpenCode first asks for a session title under the same session id: a
conversation of its own, which offers the model no tool and so ends at its
answer without a pin (``jobs_ended{reason=final_answer}`` counts it). Pins use a long TTL (600 s), so no check races the machine's speed; each
client's wall limit is derived from the server's speed measured when it
started (``agent_clients.measure_speed``).

Opt-in (``CONTINUUM_AGENT_CLIENT_TESTS=1``): two server starts and six
client runs take several minutes on a 2-core CPU (docs/testing.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from agent_clients import (
    AGENT_VENV,
    CLAUDE_MATCH,
    FINAL_ANSWER,
    NPM_BIN,
    OPENCODE_MATCH,
    SCRIPT_TURNS,
    SCRIPTS,
    SMOLAGENTS_MATCH,
    counters,
    decisions,
    delta,
    make_workdir,
    measure_speed,
    report,
    require_client,
    run_claude_code,
    run_opencode,
    run_smolagents,
)
from harness import DEFAULT_MODEL, wait_for

import vllm_continuum_plugin.benchmarks as benchmarks_pkg
from vllm_continuum_plugin.benchmarks.server import VLLMServer

OPT_IN = "CONTINUUM_AGENT_CLIENT_TESTS"
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get(OPT_IN) != "1",
                       reason=f"opt-in: set {OPT_IN}=1 (real agent CLIs, several minutes; docs/testing.md)"),
]

HERE = Path(__file__).resolve().parent
CHAT_TEMPLATE = Path(benchmarks_pkg.__file__).resolve().parent / "chatml_tools.jinja"
LONG_TTL_S = 600
SERVED = "smollm2"
MAX_MODEL_LEN = 8192  # SmolLM2's positions; Claude Code's -p prompt with --tools Bash is ~3,300 tokens
NUM_BLOCKS = 320  # 32-token blocks: one 8,192-token sequence plus room


def start_server(tmp: Path, policy: str, plugin_config: dict) -> tuple[VLLMServer, Path]:
    if not os.path.isdir(DEFAULT_MODEL):
        pytest.fail(f"embedded model missing at {DEFAULT_MODEL}: run scripts/setup.sh")
    scripts = tmp / "scripts.json"
    scripts.write_text(json.dumps(SCRIPTS))
    log = tmp / "decisions.jsonl"
    args = [
        "--scheduling-policy", policy, "--block-size", "32", "--num-gpu-blocks-override", str(NUM_BLOCKS),
        "--kv-cache-memory-bytes", "600000000", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "4",
        "--enforce-eager", "--enable-prompt-tokens-details",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--chat-template", str(CHAT_TEMPLATE),
        "--logits-processors", "scripted_replies:ScriptedReplies",
        "--additional-config", json.dumps({"continuum": plugin_config}),
    ]
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p),
        "CONTINUUM_SCRIPTED_REPLIES": str(scripts),
        "CONTINUUM_SCRIPTED_REPLIES_LOG": str(log),
    }
    server = VLLMServer(DEFAULT_MODEL, args, served_name=SERVED, env=env)
    server.start()
    return server, log


@pytest.fixture(scope="class")
def continuum(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("continuum")
    server, log = start_server(tmp, "continuum", {"default_ttl_s": LONG_TTL_S, "max_ttl_s": LONG_TTL_S})
    try:
        speed = measure_speed(server.url, SERVED)
        print(f"[continuum] prefill {speed.prefill_tps:.0f} tok/s, decode {speed.decode_tps:.1f} tok/s")
        yield server, log, speed, tmp
    finally:
        server.stop()


@pytest.fixture(scope="class")
def context_serve(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("context_serve")
    # The scripted commands are FAST by rule, pinned for the long TTL.
    rules = tmp / "rules.json"
    rules.write_text(json.dumps({"version": 1, "rules": [
        {"match": m, "class": "fast", "ttl_s": LONG_TTL_S} for m in ("echo", "ls", "cat")]}))
    server, log = start_server(tmp, "context_serve", {"rules_path": str(rules), "default_ttl_s": LONG_TTL_S,
                                                      "max_ttl_s": LONG_TTL_S})
    try:
        speed = measure_speed(server.url, SERVED)
        print(f"[context_serve] prefill {speed.prefill_tps:.0f} tok/s, decode {speed.decode_tps:.1f} tok/s")
        yield server, log, speed, tmp
    finally:
        server.stop()


def assert_all_free(server) -> None:
    assert wait_for(lambda: server.metric("vllm_continuum:pinned_blocks") == 0), "blocks left pinned"
    assert server.metric("vllm_continuum:pinned_jobs") == 0
    assert wait_for(lambda: server.metric("vllm:kv_cache_usage_perc") == 0.0), "KV blocks still in use"


def assert_one_job_handed_over(moved: dict[str, float], explicit: bool, ended_by: str, side_requests: int = 0) -> None:
    """``side_requests``: one-turn conversations beside the job under its
    session id (a title), each ended at its answer without a pin."""
    non_final = SCRIPT_TURNS - 1
    assert moved["pins_created"] == non_final, moved
    # >= 90% of the non-final turns handed over rather than lapsed.
    assert moved["handoffs"] >= 0.9 * non_final, moved
    assert moved["ttl_expired"] == 0 and moved["pressure"] == 0, moved
    assert moved[f"ended_{ended_by}"] == 1 + side_requests, moved  # the job ended at its last turn
    assert moved["released"] == moved["pins_created"], moved  # every pin accounted for
    if explicit:  # the client's session id made them one job: no prefix matching involved
        assert moved["implicit_started"] == 0 and moved["context_mismatches"] == 0, moved
    else:  # recognised by prefix alone
        assert moved["implicit_started"] == 1 and moved["implicit_continued"] == non_final, moved


def scripted_steps(log: Path, match: str) -> list[int]:
    return [r["step"] for r in decisions(log, match)]


def claude_code_session(server, log, speed, tmp) -> dict[str, float]:
    require_client(NPM_BIN / "claude", "Claude Code")
    before = counters(server)
    # ~3,300-token prompts, ~45-token replies (measured: 3,212 / 3,291 / 3,368).
    run = run_claude_code(server.url, SERVED, make_workdir(tmp / "cc-work"), tmp / "cc-home",
                          timeout_s=speed.budget_s(SCRIPT_TURNS, 3600, 64))
    assert run.returncode == 0, run.describe()
    assert run.extra.get("result") == FINAL_ANSWER and run.extra.get("num_turns") == SCRIPT_TURNS, run.describe()
    assert scripted_steps(log, CLAUDE_MATCH) == list(range(SCRIPT_TURNS))
    wait_for(lambda: delta(counters(server), before)["released"] >= SCRIPT_TURNS - 1, timeout=30)
    moved = delta(counters(server), before)
    report("claude-code", run, moved, decisions(log, CLAUDE_MATCH))
    assert_one_job_handed_over(moved, explicit=True, ended_by="final_answer")
    assert_all_free(server)
    return moved


def smolagents_session(server, log, speed, tmp) -> dict[str, float]:
    if not (AGENT_VENV / "bin" / "python").exists():
        pytest.fail(f"agents venv missing at {AGENT_VENV}: run scripts/setup.sh")
    before = counters(server)
    run = run_smolagents(server.url, SERVED, make_workdir(tmp / "sa-work"), tmp / "sa-home",
                         timeout_s=speed.budget_s(SCRIPT_TURNS, 2700, 40))
    assert run.returncode == 0, run.describe()
    assert run.extra.get("answer") == "42", run.describe()
    assert [s["observation"].split("\n")[1] for s in run.extra["steps"][:2]] == ["sastep-1 42", "sastep-2 43"]
    assert scripted_steps(log, SMOLAGENTS_MATCH)[-SCRIPT_TURNS:] == list(range(SCRIPT_TURNS))
    wait_for(lambda: delta(counters(server), before)["released"] >= SCRIPT_TURNS - 1, timeout=30)
    moved = delta(counters(server), before)
    report("smolagents", run, moved, decisions(log, SMOLAGENTS_MATCH))
    assert_one_job_handed_over(moved, explicit=False, ended_by="finish_action")
    assert_all_free(server)
    return moved


def opencode_session(server, log, speed, tmp) -> dict[str, float]:
    require_client(NPM_BIN / "opencode", "OpenCode")
    before = counters(server)
    before_side = decisions(log, "")
    run = run_opencode(server.url, SERVED, make_workdir(tmp / "oc-work"), tmp / "oc-home",
                       timeout_s=speed.budget_s(SCRIPT_TURNS + 1, 4400, 64))
    assert run.returncode == 0, run.describe()
    assert FINAL_ANSWER in run.stdout, run.describe()
    assert scripted_steps(log, OPENCODE_MATCH)[-SCRIPT_TURNS:] == list(range(SCRIPT_TURNS))
    wait_for(lambda: delta(counters(server), before)["released"] >= SCRIPT_TURNS - 1, timeout=30)
    moved = delta(counters(server), before)
    report("opencode", run, moved, decisions(log, OPENCODE_MATCH))
    # Prompts no script matched: OpenCode's title request, a conversation of
    # its own that offered no tool and ended at its answer.
    titles = len(decisions(log, "")[len(before_side):])
    assert titles == 1, decisions(log, "")[len(before_side):]
    assert_one_job_handed_over(moved, explicit=True, ended_by="final_answer", side_requests=titles)
    assert_all_free(server)
    return moved


class TestContinuum:
    def test_claude_code(self, continuum):
        claude_code_session(*continuum)

    def test_smolagents_code_agent(self, continuum):
        smolagents_session(*continuum)

    def test_opencode(self, continuum):
        opencode_session(*continuum)


class TestContextServe:
    def test_claude_code(self, context_serve):
        moved = claude_code_session(*context_serve)
        # ContextServe classified both commands FAST (the rules layer) and
        # each FAST pin was taken over in time.
        assert moved["decided_fast"] >= SCRIPT_TURNS - 1 and moved["fast_pins_in_time"] == SCRIPT_TURNS - 1, moved

    def test_smolagents_code_agent(self, context_serve):
        smolagents_session(*context_serve)

    def test_opencode(self, context_serve):
        opencode_session(*context_serve)
