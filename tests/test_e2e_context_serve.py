"""End to end: real `vllm serve --scheduling-policy context_serve`.

The embedded model is forced (structured outputs) to call a given command,
so each check exercises the real reply parsing and the layered predictor.
"""

from __future__ import annotations

import os
import time

import openai
import pytest
from harness import DEFAULT_MODEL

from vllm_continuum_plugin.benchmarks.server import VLLMServer

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server():
    if not os.path.isdir(DEFAULT_MODEL):
        pytest.fail(f"embedded model missing at {DEFAULT_MODEL}: run scripts/setup.sh")
    args = [
        "--scheduling-policy", "context_serve", "--block-size", "32", "--num-gpu-blocks-override", "96",
        "--kv-cache-memory-bytes", "400000000", "--max-model-len", "2048", "--enforce-eager",
        "--enable-prompt-tokens-details",
    ]
    with VLLMServer(DEFAULT_MODEL, args, served_name="smollm2") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def turn(client, job, messages, reply_regex, last=False):
    return client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=32, temperature=0.0,
        extra_body={"job_id": job, "is_last_step": last, "structured_outputs": {"regex": reply_regex}},
    )


def decisions(server, speed, layer):
    return server.metric("vllm_continuum:decisions_total", speed=speed, layer=layer)


def settle(server):
    time.sleep(0.3)  # the plugin publishes its counters every 0.1 s


SYSTEM = {"role": "system", "content": "You are a software agent. Answer with one ```bash block."}


def test_fast_tool_is_pinned_and_hit(server, client):
    messages = [SYSTEM, {"role": "user", "content": "What files are there? " * 20}]
    r = turn(client, "fast-job", messages, r"```bash\nls -la\n```")
    settle(server)
    assert decisions(server, "fast", "rules") == 1
    assert server.metric("vllm_continuum:pinned_blocks") > 0
    messages += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": "main.py test_main.py"}]
    r2 = turn(client, "fast-job", messages, r"```bash\ncat main\.py\n```", last=True)
    assert r2.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 32
    settle(server)
    assert server.metric("vllm_continuum:fast_pins_total", outcome="in_time") == 1


def test_slow_tool_is_freed_at_once(server, client):
    assert server.metric("vllm_continuum:pinned_blocks") == 0
    messages = [SYSTEM, {"role": "user", "content": "Install the dependencies. " * 20}]
    turn(client, "slow-job", messages, r"```bash\npip install -r requirements\.txt\n```")
    settle(server)
    assert decisions(server, "slow", "rules") == 1
    assert server.metric("vllm_continuum:pinned_blocks") == 0
    assert server.metric("vllm:kv_cache_usage_perc") == 0.0  # KV usage dropped right after the turn


def test_unknown_tool_falls_back_to_continuum_ttl(server, client):
    messages = [SYSTEM, {"role": "user", "content": "Say something. " * 20}]
    turn(client, "uncertain-job", messages, r"I am not sure what to run\.")
    settle(server)
    assert decisions(server, "uncertain", "fallback") == 1
    assert server.metric("vllm_continuum:pinned_blocks") > 0  # the CDF rule's cold-start TTL
    deadline = time.time() + 10
    while time.time() < deadline and server.metric("vllm_continuum:pinned_blocks") > 0:
        time.sleep(0.2)
    assert server.metric("vllm_continuum:pinned_blocks") == 0  # ... which lapses
