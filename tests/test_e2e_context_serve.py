"""End to end: real `vllm serve --scheduling-policy context_serve`.

The embedded model is forced (structured outputs) to call a given command,
so each check exercises the real reply parsing and the layered predictor.

No check races a TTL against the machine's speed: the FAST tool's rule (an
override rules file, which also exercises ``rules_path``) pins for
``LONG_TTL_S``, so its next turn arrives in time on any machine, and pins
are observed through counters (``pins_created``, ``pins_released{reason}``),
which cannot be missed the way a gauge read at the wrong moment can.
"""

from __future__ import annotations

import json
import os

import openai
import pytest
from harness import DEFAULT_MODEL, wait_for

from vllm_continuum_plugin.benchmarks.server import VLLMServer

pytestmark = pytest.mark.e2e

LONG_TTL_S = 600  # the FAST rule's TTL: longer than any machine needs for a round trip


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not os.path.isdir(DEFAULT_MODEL):
        pytest.fail(f"embedded model missing at {DEFAULT_MODEL}: run scripts/setup.sh")
    rules = tmp_path_factory.mktemp("rules") / "rules.json"
    rules.write_text(json.dumps({"version": 1, "rules": [{"match": "ls", "class": "fast", "ttl_s": LONG_TTL_S}]}))
    config = {"continuum": {"rules_path": str(rules), "max_ttl_s": LONG_TTL_S}}
    args = [
        "--scheduling-policy", "context_serve", "--block-size", "32", "--num-gpu-blocks-override", "96",
        "--kv-cache-memory-bytes", "400000000", "--max-model-len", "2048", "--enforce-eager",
        "--enable-prompt-tokens-details", "--additional-config", json.dumps(config),
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



SYSTEM = {"role": "system", "content": "You are a software agent. Answer with one ```bash block."}


def test_fast_tool_is_pinned_and_hit(server, client):
    created = server.metric("vllm_continuum:pins_created")
    messages = [SYSTEM, {"role": "user", "content": "What files are there? " * 20}]
    r = turn(client, "fast-job", messages, r"```bash\nls -la\n```")
    assert wait_for(lambda: decisions(server, "fast", "rules") == 1)
    assert wait_for(lambda: server.metric("vllm_continuum:pins_created") == created + 1)
    messages += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": "main.py test_main.py"}]
    r2 = turn(client, "fast-job", messages, r"```bash\ncat main\.py\n```", last=True)
    assert r2.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 32
    assert wait_for(lambda: server.metric("vllm_continuum:fast_pins_total", outcome="in_time") == 1)


def test_slow_tool_is_freed_at_once(server, client):
    assert wait_for(lambda: server.metric("vllm_continuum:pinned_blocks") == 0)
    created = server.metric("vllm_continuum:pins_created")
    messages = [SYSTEM, {"role": "user", "content": "Install the dependencies. " * 20}]
    turn(client, "slow-job", messages, r"```bash\npip install -r requirements\.txt\n```")
    # The decision and the (absent) pin are published together.
    assert wait_for(lambda: decisions(server, "slow", "rules") == 1)
    assert server.metric("vllm_continuum:pins_created") == created  # freed, never pinned
    assert server.metric("vllm_continuum:pinned_blocks") == 0
    assert wait_for(lambda: server.metric("vllm:kv_cache_usage_perc") == 0.0)


def test_unknown_tool_falls_back_to_continuum_ttl(server, client):
    created = server.metric("vllm_continuum:pins_created")
    lapsed = server.metric("vllm_continuum:pins_released_total", reason="ttl")
    messages = [SYSTEM, {"role": "user", "content": "Say something. " * 20}]
    turn(client, "uncertain-job", messages, r"I am not sure what to run\.")
    assert wait_for(lambda: decisions(server, "uncertain", "fallback") == 1)
    # Pinned for the CDF rule's cold-start TTL (2 s) ...
    assert wait_for(lambda: server.metric("vllm_continuum:pins_created") == created + 1)
    # ... which lapses, with no other traffic: every block is free again.
    assert wait_for(lambda: server.metric("vllm_continuum:pins_released_total", reason="ttl") == lapsed + 1)
    assert wait_for(lambda: server.metric("vllm_continuum:pinned_blocks") == 0)
    assert wait_for(lambda: server.metric("vllm:kv_cache_usage_perc") == 0.0)
