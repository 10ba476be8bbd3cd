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
from harness import DEFAULT_MODEL, serve_args, wait_for

from vllm_continuum_plugin.benchmarks.server import VLLMServer

pytestmark = pytest.mark.e2e

LONG_TTL_S = 600  # the FAST rule's TTL: longer than any machine needs for a round trip


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not os.path.isdir(DEFAULT_MODEL):
        pytest.fail(f"embedded model missing at {DEFAULT_MODEL}: run scripts/setup.sh")
    rules = tmp_path_factory.mktemp("rules") / "rules.json"
    rules.write_text(json.dumps({"version": 1, "rules": [{"match": "ls", "class": "fast", "ttl_s": LONG_TTL_S}]}))
    args = serve_args("context_serve", 96, 400_000_000, 2048, {"rules_path": str(rules), "max_ttl_s": LONG_TTL_S})
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


def _flood(client, count: int, tag: str):
    """Another client's requests, one after another in a thread: by the end
    they have cycled through the pool, without ever needing the pinned
    blocks at once (that would be memory pressure, a different test)."""
    import threading

    errors: list = []

    def run() -> None:
        try:
            for i in range(count):
                client.completions.create(model="smollm2", prompt=f"{tag} {i} " + "lorem ipsum dolor " * 150,
                                          max_tokens=8, temperature=0.0)
        except Exception as e:  # reported by the caller
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def test_fast_pins_survive_round_trips_of_1_to_2_s_under_a_flood(server, client):
    # The shipped rules (`git status`, `cat` are FAST), no client hint, no TTL
    # override: the TTL is the rule's plus the client's round trip (cold
    # start: round_trip_default_s). The client takes 1.5 s, then 2 s, while
    # another client's traffic runs. The only time raced is the delivery of
    # one response and one request (milliseconds) against the TTL's slack
    # over the client's sleep (seconds): an engine step that runs past the
    # deadline still sees the next turn first.
    import time

    in_time = server.metric("vllm_continuum:fast_pins_total", outcome="in_time")
    expired = server.metric("vllm_continuum:fast_pins_total", outcome="expired")
    fast_rules = decisions(server, "fast", "rules")
    messages = [SYSTEM, {"role": "user", "content": "Check the repository state. " * 20}]
    prompts: list[int] = []
    floods = []
    for i, (command, gap) in enumerate([("git status", 1.5), ("cat main.py", 2.0), (None, None)]):
        last = command is None
        regex = r"```bash\necho done\n```" if last else "```bash\n" + command.replace(".", r"\.") + "\n```"
        r = turn(client, "round-trip-job", messages, regex, last=last)
        if prompts:  # the previous turn's pin was still there
            assert r.usage.prompt_tokens_details.cached_tokens >= prompts[-1] - 32, (i, r.usage)
        prompts.append(r.usage.prompt_tokens)
        if last:
            break
        floods.append(_flood(client, 4, f"flood{i}"))
        time.sleep(gap)
        messages += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": f"output of {command}: " + "M main.py " * 30}]
    for thread, errors in floods:
        thread.join()
        assert not errors
    assert wait_for(lambda: decisions(server, "fast", "rules") == fast_rules + 2)
    assert wait_for(lambda: server.metric("vllm_continuum:fast_pins_total", outcome="in_time") == in_time + 2)
    assert server.metric("vllm_continuum:fast_pins_total", outcome="expired") == expired
    # The last step ended the job: nothing stays pinned or allocated.
    assert wait_for(lambda: server.metric("vllm_continuum:pinned_blocks") == 0)
    assert wait_for(lambda: server.metric("vllm:kv_cache_usage_perc") == 0.0)
