"""End to end: Claude Code's session id makes its turns one job on /v1/messages.

A real ``vllm serve --scheduling-policy continuum`` (the embedded
SmolLM2-135M-Instruct) gets Anthropic ``/v1/messages`` requests the way
Claude Code 2.1.x sends them: no plugin field, the session in the
``X-Claude-Code-Session-Id`` header, or only in ``metadata.user_id`` (a JSON
string). Replies carry no tool call, so without the session id these turns
would be chat traffic and never pinned: a pin on the first turn and a
hand-off to the second show that the session id became the job id.

No check races a TTL: the cold-start TTL outlives the test on any machine.
"""

from __future__ import annotations

import json
import os

import pytest
import requests
from harness import DEFAULT_MODEL, filler, wait_for

from vllm_continuum_plugin.benchmarks.server import VLLMServer

pytestmark = pytest.mark.e2e

LONG_TTL_S = 600
SYSTEM = "You are a coding agent. " + filler("context", 120)  # several 32-token blocks


@pytest.fixture(scope="module")
def server():
    if not os.path.isdir(DEFAULT_MODEL):
        pytest.fail(f"embedded model missing at {DEFAULT_MODEL}: run scripts/setup.sh")
    args = [
        "--scheduling-policy", "continuum", "--block-size", "32", "--num-gpu-blocks-override", "96",
        "--kv-cache-memory-bytes", "400000000", "--max-model-len", "2048", "--max-num-seqs", "4",
        "--enforce-eager",
        "--additional-config", json.dumps({"continuum": {"default_ttl_s": LONG_TTL_S, "max_ttl_s": LONG_TTL_S}}),
    ]
    with VLLMServer(DEFAULT_MODEL, args, served_name="smollm2") as srv:
        yield srv


def post_messages(server, messages: list[dict], headers: dict[str, str] | None = None,
                  metadata: dict | None = None) -> str:
    """One greedy 12-token /v1/messages turn; returns the reply text."""
    body = {"model": "smollm2", "max_tokens": 12, "temperature": 0.0, "system": SYSTEM, "messages": messages}
    if metadata is not None:
        body["metadata"] = metadata
    r = requests.post(server.url + "/v1/messages", json=body, headers=headers or {}, timeout=300)
    assert r.status_code == 200, r.text
    return "".join(block.get("text", "") for block in r.json()["content"])


def counters(server) -> tuple[float, float, float]:
    return (server.metric("vllm_continuum:pins_created"),
            server.metric("vllm_continuum:pins_released", reason="handoff"),
            server.metric("vllm_continuum:implicit_turns", event="started"))


def two_turns_are_one_job(server, **session) -> None:
    """Two turns of one conversation carrying ``session``: the first is
    pinned, the second takes the pin over, and no implicit job is involved."""
    created, handoffs, implicit = counters(server)
    messages = [{"role": "user", "content": "Find the bug in add(). " + filler("task", 40)}]
    reply = post_messages(server, messages, **session)
    assert wait_for(lambda: server.metric("vllm_continuum:pins_created") >= created + 1)
    assert server.metric("vllm_continuum:pinned_jobs") >= 1
    messages += [{"role": "assistant", "content": reply},
                 {"role": "user", "content": "Tool output: " + filler("output", 30)}]
    post_messages(server, messages, **session)
    assert wait_for(lambda: counters(server)[:2] == (created + 2, handoffs + 1)), counters(server)
    assert counters(server)[2] == implicit  # an explicit job, not prefix matching


def test_claude_code_session_header_makes_one_job(server):
    two_turns_are_one_job(server, headers={"X-Claude-Code-Session-Id": "3f1c2a9e-7d41-4b8e-9c55-0a6e2b1d4f10"})


def test_claude_code_metadata_user_id_makes_one_job(server):
    user_id = json.dumps({"device_id": "ab" * 32, "account_uuid": "",
                          "session_id": "8b0d5e21-1c3a-4f7e-a2d9-6e4c3b2a1f00"})
    two_turns_are_one_job(server, metadata={"user_id": user_id})


def test_a_malformed_user_id_is_served_untagged_and_a_bad_header_is_a_400(server):
    created = server.metric("vllm_continuum:pins_created")
    post_messages(server, [{"role": "user", "content": "hello"}], metadata={"user_id": '{"session_id": '})
    body = {"model": "smollm2", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    r = requests.post(server.url + "/v1/messages", json=body, timeout=300,
                      headers={"X-Claude-Code-Session-Id": "x" * 300})
    assert r.status_code == 400 and "X-Claude-Code-Session-Id" in r.text, r.text
    assert server.metric("vllm_continuum:pins_created") == created  # chat traffic: never pinned
