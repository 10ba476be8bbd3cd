"""Unchanged agents end to end: the real mini-swe-agent against a real server.

mini-swe-agent 2.4.6 (its own venv, installed by ``scripts/setup.sh``) runs
three agents at once through litellm with native function calling and sends
**no job id and no last-step flag**; every command really runs in a
throw-away git repository. The server is ``vllm serve --scheduling-policy
continuum --enable-auto-tool-choice --tool-call-parser hermes`` on the
embedded model with a tools-aware ChatML template; tool calls are forced
with structured outputs passed through litellm's ``extra_body`` (see
``benchmarks/mswea_agents.py``), parsed by vLLM's hermes parser and executed
by the agent. (The cached-share comparison with ``fcfs`` under competing
traffic is a benchmark: ``vllm-continuum-mswea-ab``.)

Pins use a long TTL: every job ends by its finish action, so nothing here
waits for a TTL and no check races the machine's speed.
"""

from __future__ import annotations

import pytest
from harness import DEFAULT_MODEL, wait_for

from vllm_continuum_plugin.benchmarks.mswea_ab import AGENT_VENV, SCRIPT, run_agents, server_args
from vllm_continuum_plugin.benchmarks.server import VLLMServer

pytestmark = pytest.mark.e2e

AGENTS = 3
LONG_TTL_S = 600


def test_mini_swe_agent_unchanged_is_pinned_handed_over_and_ended():
    if not (AGENT_VENV / "bin" / "python").exists():
        pytest.fail(f"mini-swe-agent venv missing at {AGENT_VENV}: run scripts/setup.sh")
    # The pool holds every agent's context at once (3 x ~19 blocks of 71) and
    # pins may use all of it: no pin is trimmed or released under pressure,
    # whatever order the agents' turns interleave in.
    args = server_args("continuum", 72, LONG_TTL_S, max_pinned_fraction=1.0)
    with VLLMServer(DEFAULT_MODEL, args, served_name="smollm2") as server:
        agents = run_agents(server.url, AGENTS)
        for a in agents:
            assert a["exit_status"] == "Submitted", a
            assert [c["commands"] for c in a["calls"]] == [[cmd] for cmd in SCRIPT]  # really executed
            # Every later turn found its previous turn's KV (usage, per response).
            assert all(c["cached_tokens"] > 0 for c in a["calls"][1:]), a["calls"]
        turns = AGENTS * len(SCRIPT)
        metric = server.metric
        # Every agent's last turn (its finish action) ended its job: nothing
        # is left pinned although the TTL is 10 minutes.
        assert wait_for(lambda: metric("vllm_continuum:jobs_ended_total", reason="finish_action") == AGENTS)
        assert wait_for(lambda: metric("vllm_continuum:pinned_blocks") == 0)
        assert wait_for(lambda: metric("vllm:kv_cache_usage_perc") == 0.0)
        # Each agent was recognised as one job from its prefix alone ...
        assert metric("vllm_continuum:implicit_turns_total", event="started") == AGENTS
        assert metric("vllm_continuum:implicit_turns_total", event="continued") == turns - AGENTS
        # ... and each finished turn was pinned and taken over by its next turn.
        assert metric("vllm_continuum:pins_created") == turns - AGENTS
        assert metric("vllm_continuum:pins_released_total", reason="handoff") == turns - AGENTS
        assert metric("vllm_continuum:pins_released_total", reason="pressure") == 0
        hit = metric("vllm_continuum:pin_hit_tokens")
        assert hit >= sum(c["cached_tokens"] for a in agents for c in a["calls"][1:]) // 2
