"""Unchanged agents end to end: the real mini-swe-agent against a real server.

mini-swe-agent 2.4.6 (its own venv, installed by ``scripts/setup.sh``) runs
three agents at once through litellm with native function calling and sends
**no job id and no last-step flag**; every command really runs in a
throw-away git repository. The server is ``vllm serve --scheduling-policy
continuum --enable-auto-tool-choice --tool-call-parser hermes`` on the
embedded model with a tools-aware ChatML template; tool calls are forced
with structured outputs passed through litellm's ``extra_body`` (see
``benchmarks/mswea_agents.py``), parsed by vLLM's hermes parser and executed
by the agent. Competing one-shot traffic keeps the small pool under pressure.

The same agents run against stock ``fcfs`` for comparison. Pins use a long
TTL: every job ends by its finish action, so nothing here waits for a TTL
and no check races the machine's speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import openai
import pytest
from harness import DEFAULT_MODEL

from vllm_continuum_plugin.benchmarks.server import VLLMServer

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "benchmarks" / "mswea_agents.py"
TEMPLATE = REPO / "benchmarks" / "chatml_tools.jinja"
AGENT_VENV = Path(os.environ.get("CONTINUUM_AGENT_VENV", os.path.expanduser("~/.venvs/vllm-continuum-agents")))
AGENTS = 3
SCRIPT = ["ls", "cat README.md", "git status", "cat main.py", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
NUM_BLOCKS = 72  # at least max_model_len / block size + 1
LONG_TTL_S = 600


def serve(policy: str) -> VLLMServer:
    config = {"continuum": {"default_ttl_s": LONG_TTL_S, "max_ttl_s": LONG_TTL_S, "max_pinned_fraction": 0.8}}
    args = [
        "--scheduling-policy", policy, "--block-size", "32", "--num-gpu-blocks-override", str(NUM_BLOCKS),
        "--kv-cache-memory-bytes", "400000000", "--max-model-len", "2048", "--max-num-seqs", "8",
        "--enforce-eager", "--enable-prompt-tokens-details",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--chat-template", str(TEMPLATE),
        "--additional-config", json.dumps(config),
    ]
    return VLLMServer(DEFAULT_MODEL, args, served_name="smollm2")


def flood(url: str, stop: threading.Event) -> None:
    """Unrelated one-shot traffic (~600-token prompts) recycling the pool."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    filler = "Summarize this log line: worker restarted after timeout. " * 60
    sent = 0
    while not stop.is_set():
        client.completions.create(model="smollm2", prompt=f"{sent} {filler}", max_tokens=2)
        sent += 1


def run_agents(server: VLLMServer) -> list[dict]:
    stop = threading.Event()
    flooder = threading.Thread(target=flood, args=(server.url, stop), daemon=True)
    flooder.start()
    try:
        proc = subprocess.run(
            [str(AGENT_VENV / "bin" / "python"), str(RUNNER), "--url", server.url + "/v1",
             "--model", "smollm2", "--agents", str(AGENTS), "--script", ";;".join(SCRIPT)],
            capture_output=True, text=True, timeout=1800,
        )
    finally:
        stop.set()
        flooder.join(timeout=120)
    assert proc.returncode == 0, f"agents failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])["agents"]


def wait_for(predicate, timeout: float = 120.0) -> bool:
    """Poll: the plugin publishes its counters every 0.1 s from a thread."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def later_turn_cached_share(agents: list[dict]) -> float:
    later = [c for a in agents for c in a["calls"][1:]]
    return sum(c["cached_tokens"] for c in later) / sum(c["prompt_tokens"] for c in later)


@pytest.fixture(scope="module")
def agent_venv():
    python = AGENT_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"mini-swe-agent venv missing at {AGENT_VENV}: run scripts/setup.sh")
    return python


def test_mini_swe_agent_unchanged_is_pinned_handed_over_and_ended(agent_venv):
    with serve("continuum") as server:
        agents = run_agents(server)
        for a in agents:
            assert a["exit_status"] == "Submitted", a
            assert [c["commands"] for c in a["calls"]] == [[cmd] for cmd in SCRIPT]  # really executed
        turns = AGENTS * len(SCRIPT)
        metric = server.metric
        # Every agent's last turn (its finish action) ended its job: nothing
        # is left pinned although the TTL is 10 minutes.
        assert wait_for(lambda: metric("vllm_continuum:jobs_ended_total", reason="finish_action") == AGENTS)
        assert wait_for(lambda: metric("vllm_continuum:pinned_blocks") == 0)
        # Each agent was recognised as one job from its prefix alone ...
        assert metric("vllm_continuum:implicit_turns_total", event="started") == AGENTS
        assert metric("vllm_continuum:implicit_turns_total", event="continued") == turns - AGENTS
        # ... and its finished turns were pinned and taken over by its next turn.
        handoffs = metric("vllm_continuum:pins_released_total", reason="handoff")
        assert metric("vllm_continuum:pins_created") >= handoffs >= (turns - AGENTS) * 2 // 3, handoffs
        continuum_share = later_turn_cached_share(agents)
    with serve("fcfs") as server:
        fcfs_agents = run_agents(server)
        assert all(a["exit_status"] == "Submitted" for a in fcfs_agents)
        fcfs_share = later_turn_cached_share(fcfs_agents)
    print(f"\n[mini-swe-agent] later turns' cached share: continuum {continuum_share:.0%}, fcfs {fcfs_share:.0%}")
    assert continuum_share > fcfs_share
