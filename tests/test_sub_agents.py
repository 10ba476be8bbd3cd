"""Several conversations under one session id, on a real vLLM scheduler.

Coding agents run sub-agents under their session id (Claude Code's ``Task``,
Codex sub-agents) and send side requests under it (OpenCode's session
title). Each conversation is a job of its own (``conversations``): a
sub-agent's turns take over the sub-agent's pins while the main
conversation's pin waits for the ``Task`` tool to return, and a one-turn
side request that offered the model no tools (a title) ends at its answer,
or when the agent's first turn arrives, instead of holding a pin. A lone
tool-less conversation (a chat under a session id) keeps its pin. Under both plugin policies (ContextServe's rules know
``Task`` is SLOW: the main conversation's turn is not pinned there), with a fixed 60 s TTL on the
manual clock (no check races the machine), every block is free at the end.

Real vLLM scheduler, no weights (``harness``).
"""

from __future__ import annotations

import pytest
from harness import (
    free_blocks,
    make_request,
    make_scheduler,
    prompt_of,
    run_until_finished,
    scripted,
    step,
    tiny_tokens,
    usable_blocks,
)

from vllm_continuum_plugin.metadata import AGENT_ID, TOOLS_OFFERED
from vllm_continuum_plugin.request_record import request_meta

EOS = 2
TTL_S = 60.0
SESSION = "cc-session"


def call(command: str) -> list[int]:
    return tiny_tokens('<tool_call>\n{"name": "Bash", "arguments": {"command": "' + command + '"}}\n</tool_call>') + [EOS]


TASK = tiny_tokens('<tool_call>\n{"name": "Task", "arguments": {"prompt": "find the bug"}}\n</tool_call>') + [EOS]
ANSWER = tiny_tokens("The bug is in add(): it subtracts.") + [EOS]
TITLE = tiny_tokens("Fix the add bug") + [EOS]


@pytest.fixture(params=["continuum", "context_serve"])
def s(request):
    return make_scheduler(request.param, num_blocks=160,
                          continuum={"ttl_policy": "fixed", "fixed_ttl_s": TTL_S, "default_ttl_s": TTL_S})


def turn(s, prompt: list[int], reply: list[int], extra: dict | None = None):
    r = scripted(make_request(prompt, max_tokens=len(reply), extra=extra), reply)
    r.session_id = SESSION  # what the API server passes for a session header
    s.add_request(r)
    return r


def finish(s, *requests) -> None:
    run_until_finished(s, list(requests))


def snap(s) -> dict:
    return s.continuum_metrics.snapshot()


def next_prompt(r, tool_output_seed: int) -> list[int]:
    return list(r.all_token_ids) + prompt_of(tool_output_seed, 20)


def assert_all_free(s) -> None:
    assert len(s.pins) == 0 and not s.running and not s.waiting
    assert free_blocks(s) == usable_blocks(s)


def test_a_sub_agent_and_its_main_conversation_keep_their_own_pins(s):
    # Main conversation: turn 1 calls Task (a sub-agent); under continuum
    # its pin waits (ContextServe's rules know Task is SLOW: not pinned).
    main1 = turn(s, prompt_of(1, 120), TASK)
    finish(s, main1)
    task_pinned = s.continuum_policy == "continuum"
    assert (SESSION in s.pins) is task_pinned
    main_pin = s.pins.get(SESSION)
    # The sub-agent: same session id, its own conversation; three turns.
    sub = turn(s, prompt_of(2, 80), call("grep -rn add src"))
    finish(s, sub)
    sub_key = request_meta(sub).job_id
    assert sub_key != SESSION and s.pins.get(SESSION) is main_pin
    for i, reply in enumerate([call("cat src/math.py"), ANSWER]):
        s.clock.advance(1.0)
        sub = turn(s, next_prompt(sub, 30 + i), reply)
        assert request_meta(sub).job_id == sub_key
        finish(s, sub)
        # The main conversation's pin is never touched by its sub-agent.
        assert s.pins.get(SESSION) is main_pin
    # The sub-agent's text answer after its tool calls ended its task: no pin
    # (the conversation stays known, as any answer's session may go on).
    assert sub_key not in s.pins
    assert snap(s)["jobs_ended"]["final_answer"] == 1
    # Main goes on with the Task's result: it takes over its own pin.
    s.clock.advance(1.0)
    main2 = turn(s, next_prompt(main1, 40), ANSWER)
    assert request_meta(main2).job_id == SESSION
    finish(s, main2)
    m = snap(s)
    # sub 1, sub 2 (and main 1 under continuum): all handed over.
    assert m["pins_created"] == m["pins_released"]["handoff"] == 2 + task_pinned
    assert m["pins_released"]["ttl"] == 0 and m["jobs_ended"]["final_answer"] == 2
    assert m["conversations_started"] == 1 and m["context_mismatches"] == 0
    assert_all_free(s)


@pytest.mark.parametrize("named", [True, False], ids=["agent_id", "no_agent_id"])
def test_a_named_sub_agents_answer_ends_it_for_good(s, named):
    # Claude Code names each sub-agent (x-claude-code-agent-id -> agent_id):
    # its answer is the parent's Task result, never followed up, so the
    # sub-agent's job is over (state forgotten, its blocks first out of the
    # prefix cache). Unnamed, the same answer is one a user might follow up:
    # the conversation stays known.
    extra = {AGENT_ID: "a93945a99209facb3"} if named else None
    main1 = turn(s, prompt_of(1, 120), TASK)
    finish(s, main1)
    sub = turn(s, prompt_of(2, 80), call("grep -rn add src"), extra)
    finish(s, sub)
    sub_key = request_meta(sub).job_id
    assert sub_key != SESSION and sub_key in s.pins
    s.clock.advance(1.0)
    sub2 = turn(s, next_prompt(sub, 30), ANSWER, extra)
    finish(s, sub2)
    assert request_meta(sub2).job_id == sub_key and sub_key not in s.pins
    assert snap(s)["jobs_ended"]["final_answer"] == 1
    assert (s.jobs.get(sub_key) is None) is named
    assert (sub_key in s.conversations.keys_of(SESSION)) is not named
    s.clock.advance(1.0)
    main2 = turn(s, next_prompt(main1, 40), ANSWER)
    assert request_meta(main2).job_id == SESSION
    finish(s, main2)
    assert_all_free(s)


def test_two_concurrent_conversations_under_one_session_hand_over_their_own_pins(s):
    a1 = turn(s, prompt_of(3, 100), call("ls"))
    b1 = turn(s, prompt_of(4, 100), call("pwd"))
    finish(s, a1, b1)
    keys = {request_meta(a1).job_id, request_meta(b1).job_id}
    assert len(keys) == 2 and all(k in s.pins for k in keys)
    # Interleaved next turns: each continues its own conversation.
    a2 = turn(s, next_prompt(a1, 50), call("cat a"))
    b2 = turn(s, next_prompt(b1, 51), call("cat b"))
    finish(s, a2, b2)
    assert {request_meta(a2).job_id, request_meta(b2).job_id} == keys
    assert snap(s)["pins_released"]["handoff"] == 2 and all(k in s.pins for k in keys)
    a3 = turn(s, next_prompt(a2, 52), ANSWER)
    b3 = turn(s, next_prompt(b2, 53), ANSWER)
    finish(s, a3, b3)
    m = snap(s)
    assert m["pins_released"]["handoff"] == 4 and m["pins_released"]["ttl"] == 0
    assert m["jobs_ended"]["final_answer"] == 2
    assert_all_free(s)


@pytest.mark.parametrize("title_first", [True, False], ids=["title_finishes_first", "title_overlaps"])
def test_a_side_request_without_tools_ends_and_keeps_no_pin_once_the_agent_arrives(s, title_first):
    # OpenCode asks for a session title (no tools offered) under the session id.
    title = turn(s, prompt_of(5, 60), TITLE, {TOOLS_OFFERED: False})
    if title_first:
        finish(s, title)
        assert len(s.pins) == 1  # alone, it may be a chat: pinned for now
    main1 = turn(s, prompt_of(6, 120), call("ls"), {TOOLS_OFFERED: True})
    # The agent's first turn ended the finished title (it had its one turn).
    assert snap(s)["jobs_ended"]["final_answer"] == int(title_first)
    finish(s, title, main1)
    assert snap(s)["jobs_ended"]["final_answer"] == 1  # the title, either way
    assert len(s.pins) == 1 and s.pins.get(request_meta(main1).job_id).request_id == main1.request_id
    main2 = turn(s, next_prompt(main1, 60), ANSWER, {TOOLS_OFFERED: True})
    finish(s, main2)
    m = snap(s)
    assert m["pins_created"] == 1 + title_first and m["pins_released"]["handoff"] == 1
    assert m["pins_released"]["last_step"] == int(title_first) and m["jobs_ended"]["final_answer"] == 2
    assert_all_free(s)


def test_a_lone_chat_under_a_session_id_keeps_its_pin_between_turns(s):
    # No tools offered, no sibling: a person reads the answer and replies.
    c1 = turn(s, prompt_of(9, 80), TITLE, {TOOLS_OFFERED: False})
    finish(s, c1)
    assert len(s.pins) == 1
    c2 = turn(s, next_prompt(c1, 70), TITLE, {TOOLS_OFFERED: False})
    finish(s, c2)
    m = snap(s)
    assert m["pins_released"]["handoff"] == 1 and m["jobs_ended"]["final_answer"] == 0


def test_another_scopes_agent_does_not_end_a_chat_under_the_same_id(s):
    c1 = turn(s, prompt_of(10, 80), TITLE, {TOOLS_OFFERED: False, "continuum_scope": "alice"})
    finish(s, c1)
    other = turn(s, prompt_of(11, 80), call("ls"), {TOOLS_OFFERED: True, "continuum_scope": "mallory"})
    finish(s, other)
    assert s.pins.get(SESSION).request_id == c1.request_id
    assert snap(s)["jobs_ended"]["final_answer"] == 0


def test_lapsed_and_abandoned_conversations_leave_every_block_free(s):
    a = turn(s, prompt_of(7, 100), call("ls src"))
    b = turn(s, prompt_of(8, 100), call("cat README.md"))
    finish(s, a, b)
    assert len(s.pins) == 2
    s.clock.advance(TTL_S + 1)  # neither comes back
    step(s)
    assert snap(s)["pins_released"]["ttl"] == 2
    assert_all_free(s)
