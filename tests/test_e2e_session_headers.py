"""End to end: Claude Code's session id makes its turns one job on /v1/messages.

A real ``vllm serve --scheduling-policy continuum`` (the embedded
SmolLM2-135M-Instruct) gets Anthropic ``/v1/messages`` requests the way
Claude Code 2.1.x sends them: no plugin field, the session in the
``X-Claude-Code-Session-Id`` header, or only in ``metadata.user_id`` (a JSON
string), with a ``Bash`` tool offered as Claude Code offers its tools; and
with AIPerf's default ``X-Session-Affinity``.
Replies carry no tool call, so without the session id these turns would be
chat traffic and never pinned: a pin on the first turn and a hand-off to
the second show that the session id became the job id. Two conversations
under one session id (a sub-agent beside its main conversation) keep their
own pins, and a one-turn request that offers no tool (a session title)
keeps no pin once the agent's first turn arrives. A sub-agent Claude Code
names (``x-claude-code-agent-id``) ends at its answer.

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
        "--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--additional-config", json.dumps({"continuum": {"default_ttl_s": LONG_TTL_S, "max_ttl_s": LONG_TTL_S}}),
    ]
    with VLLMServer(DEFAULT_MODEL, args, served_name="smollm2") as srv:
        yield srv


BASH_TOOL = {"name": "Bash", "description": "Run a shell command.",
             "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                              "required": ["command"]}}


def post_messages(server, messages: list[dict], headers: dict[str, str] | None = None,
                  metadata: dict | None = None, tools: bool = True, system: str = SYSTEM, max_tokens: int = 12) -> str:
    """One greedy /v1/messages turn (the Bash tool offered unless ``tools``
    is False); returns the reply text."""
    body = {"model": "smollm2", "max_tokens": max_tokens, "temperature": 0.0, "system": system, "messages": messages}
    if tools:
        body["tools"] = [BASH_TOOL]
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


def test_aiperf_default_headers_make_one_job(server):
    """AIPerf 0.13 without ``--session-header``: its correlation id in
    ``X-Correlation-ID`` and ``X-Session-Affinity`` (a default session
    header of the plugin)."""
    conversation = "c0ffee00-1d3b-4e8f-9a7c-2b4d6e8f0a1c"
    two_turns_are_one_job(server, headers={"X-Correlation-ID": conversation, "X-Session-Affinity": conversation})


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


def test_two_conversations_under_one_session_keep_their_own_pins(server):
    # A sub-agent beside its main conversation: same session header,
    # interleaved turns, each takes over its own pin.
    headers = {"X-Claude-Code-Session-Id": "5d2e7f10-4b3a-4c8d-9e1f-2a3b4c5d6e7f"}
    created, handoffs, _ = counters(server)
    started = server.metric("vllm_continuum:session_conversations")
    talks = {name: [{"role": "user", "content": f"{name}: " + filler(name, 40)}] for name in ("main", "sub-agent")}
    for name, messages in talks.items():
        messages.append({"role": "assistant", "content": post_messages(server, messages, headers=headers)})
    assert wait_for(lambda: server.metric("vllm_continuum:pinned_jobs") >= 2)
    assert server.metric("vllm_continuum:session_conversations") == started + 1
    for name, messages in reversed(talks.items()):
        messages.append({"role": "user", "content": "Tool output: " + filler(f"{name} out", 30)})
        post_messages(server, messages, headers=headers)
    assert wait_for(lambda: counters(server)[:2] == (created + 4, handoffs + 2)), counters(server)
    assert server.metric("vllm_continuum:pins_released", reason="ttl") == 0


def test_a_title_request_before_the_agents_first_turn_keeps_no_pin(server):
    # OpenCode's order: a session title (one turn, no tools) under the
    # session's id, then the agent's first turn (tools offered).
    headers = {"X-Claude-Code-Session-Id": "0e9d8c7b-6a5f-4e3d-2c1b-0a9f8e7d6c5b"}
    created = server.metric("vllm_continuum:pins_created")
    ended = server.metric("vllm_continuum:jobs_ended", reason="final_answer")
    released = server.metric("vllm_continuum:pins_released", reason="last_step")
    # (4 tokens: a title in prose; the tiny model's longer replies open a
    # code fence, which reads as a code action.)
    title = post_messages(server, [{"role": "user", "content": "Fix add()"}], tools=False, headers=headers,
                          system="You write a short title for the user's task. " + filler("title rules", 60),
                          max_tokens=4)
    assert "```" not in title and "<code>" not in title, title
    # Alone under its id it may be a chat: pinned (requests run one after
    # the other, so the title has finished before the agent's turn arrives).
    assert wait_for(lambda: server.metric("vllm_continuum:pins_created") == created + 1)
    post_messages(server, [{"role": "user", "content": "Fix add(). " + filler("agent", 40)}], headers=headers)
    # The agent's first turn ended the title and released its pin; its own
    # turn is pinned.
    assert wait_for(lambda: server.metric("vllm_continuum:pins_created") == created + 2)
    assert wait_for(lambda: server.metric("vllm_continuum:jobs_ended", reason="final_answer") == ended + 1)
    assert server.metric("vllm_continuum:pins_released", reason="last_step") == released + 1


def test_a_claude_code_sub_agents_answer_ends_it_and_a_bad_agent_id_is_a_400(server):
    # Claude Code 2.1.328 sends x-claude-code-agent-id on every request of a
    # sub-agent (Task/Agent), beside the session header: the sub-agent's
    # answer goes to its parent, so it ends the sub-agent's job and keeps no
    # pin. Without the header the same answer, beside an agent's
    # conversation, would be pinned for a follow-up that never comes.
    session = {"X-Claude-Code-Session-Id": "7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d"}
    created = server.metric("vllm_continuum:pins_created")
    ended = server.metric("vllm_continuum:jobs_ended", reason="final_answer")
    post_messages(server, [{"role": "user", "content": "Fix add(). " + filler("main task", 40)}], headers=session)
    assert wait_for(lambda: server.metric("vllm_continuum:pins_created") == created + 1)
    # (4 tokens: prose; the tiny model's longer replies open a code fence,
    # which reads as a code action.)
    answer = post_messages(server, [{"role": "user", "content": "Fix the add bug"}], max_tokens=4,
                           system="You are a sub-agent. Report what you find. " + filler("sub-agent rules", 60),
                           headers={**session, "x-claude-code-agent-id": "a93945a99209facb3"})
    assert "```" not in answer and "<code>" not in answer, answer
    assert wait_for(lambda: server.metric("vllm_continuum:jobs_ended", reason="final_answer") == ended + 1)
    assert server.metric("vllm_continuum:pins_created") == created + 1
    body = {"model": "smollm2", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    r = requests.post(server.url + "/v1/messages", json=body, timeout=300,
                      headers={**session, "x-claude-code-agent-id": "x" * 300})
    assert r.status_code == 400 and "x-claude-code-agent-id" in r.text, r.text


def test_two_byte_identical_sessions_with_different_ids_each_hand_over_their_own_pin(server):
    # Retries, best-of-n, parallel runs of one task: the same bytes, only
    # the session id differs. Each session's next turn takes its own pin.
    created, handoffs, _ = counters(server)
    ttl = server.metric("vllm_continuum:pins_released", reason="ttl")
    sessions = [{"X-Claude-Code-Session-Id": f"7a6b5c4d-3e2f-4a1b-8c9d-00000000000{i}"} for i in (1, 2)]
    messages = [{"role": "user", "content": "Same task for both. " + filler("same", 40)}]
    replies = [post_messages(server, messages, headers=h) for h in sessions]
    # Greedy replies may still differ where the server runs bf16 (the second
    # session's prefill is a prefix-cache hit, with other rounding): both
    # next turns carry the first reply, so the sessions stay byte-identical.
    assert wait_for(lambda: server.metric("vllm_continuum:pins_created") >= created + 2)
    following = messages + [{"role": "assistant", "content": replies[0]},
                            {"role": "user", "content": "Tool output: " + filler("same out", 30)}]
    for h in sessions:
        post_messages(server, following, headers=h)
    assert wait_for(lambda: counters(server)[:2] == (created + 4, handoffs + 2)), counters(server)
    assert server.metric("vllm_continuum:pins_released", reason="ttl") == ttl
