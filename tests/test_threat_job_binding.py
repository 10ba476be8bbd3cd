"""A job id is no bearer token: job state is bound to the job's context.

The threat model of issue 23, finding 2, one test per attack. A victim runs an
agent job; another client sends requests under the victim's job id (an
explicit ``job_id`` or a session id) with a context of its own. Such a
request must not end the victim's job, have its arrival measured as the
victim's tool time, rank by the victim's first arrival or take the victim's
pin: it is a conversation of its own under the session id
(``conversations``, counted in ``session_conversations``), and what it does
acts on that conversation only. The victim's own turns still act on the
job, with or without a pin.

Real vLLM scheduler, no weights (``harness``); time is the manual clock.
"""

from __future__ import annotations

import logging

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

from vllm_continuum_plugin.conversations import MAX_CONVERSATIONS
from vllm_continuum_plugin.job_order import TIER_REST
from vllm_continuum_plugin.request_record import request_meta

EOS = 2
HERMES_CAT = tiny_tokens('<tool_call>\n{"name": "bash", "arguments": {"command": "cat main.py"}}\n</tool_call>') + [EOS]
PROSE = tiny_tokens("The bug is in add(): it subtracts.") + [EOS]
TTL_S = 60.0


def victim_first_turn(s, job: str = "victim", reply: list[int] = HERMES_CAT, **kwargs):
    prompt = prompt_of(11, 100)
    r = scripted(make_request(prompt, max_tokens=len(reply), job_id=job, is_last_step=False, **kwargs), reply)
    s.add_request(r)
    run_until_finished(s, [r])
    return prompt, r


def victim_next_prompt(prompt, first) -> list[int]:
    return list(prompt) + list(first.output_token_ids) + prompt_of(12, 30)


def foreign(s, job: str = "victim", reply: list[int] | None = None, finish: bool = True, **kwargs):
    """Another client's request under ``job`` with a context of its own."""
    reply = reply if reply is not None else [7] * 4
    r = scripted(make_request(prompt_of(77, 100), max_tokens=len(reply), job_id=job, **kwargs), reply)
    s.add_request(r)
    if finish:
        run_until_finished(s, [r])
    return r


def lapse_pin(s, job: str = "victim") -> None:
    """The victim's tool outlives its pin (the job holds no pin now)."""
    s.clock.advance(TTL_S + 1)
    step(s)
    assert job not in s.pins


def tool_samples(s) -> tuple[int, float]:
    h = s.continuum_metrics.snapshot()["tool_seconds"]
    return h["count"], h["sum"]


@pytest.fixture
def s():
    return make_scheduler(num_blocks=96, continuum={"ttl_policy": "fixed", "fixed_ttl_s": TTL_S})


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pin_lapsed"])
def test_a_foreign_last_step_does_not_end_the_victims_job(s, pinned):
    victim_first_turn(s)
    if not pinned:
        lapse_pin(s)
    pin = s.pins.get("victim")
    foreign(s, is_last_step=True)
    job = s.jobs.get("victim")
    assert job is not None and job.turns_finished == 1 and job.in_flight == 0
    assert s.pins.get("victim") is pin
    snap = s.continuum_metrics.snapshot()
    # What ended is the foreign request's own conversation.
    assert snap["conversations_started"] == 1 and snap["jobs_ended"]["last_step"] == 1
    assert s.conversations.keys_of("victim") == ["victim"]


@pytest.mark.parametrize(
    "hint",
    [{"tool_command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}, {"tool_name": "submit"}],
    ids=["finish_action_command", "tool_name_submit"],
)
def test_a_foreign_finish_action_does_not_end_the_victims_job(s, hint):
    victim_first_turn(s)
    foreign(s, is_last_step=False, extra=hint)
    assert s.jobs.get("victim") is not None and "victim" in s.pins
    assert s.conversations.keys_of("victim") == ["victim"]  # the foreign conversation ended, not the victim's


def test_a_foreign_final_answer_does_not_end_the_victims_job(s):
    victim_first_turn(s)  # called a tool: its next reply without one is its final answer
    other = foreign(s, reply=PROSE)
    job = s.jobs.get("victim")
    assert job is not None and job.had_tool_call and "victim" in s.pins
    assert s.continuum_metrics.snapshot()["jobs_ended"]["final_answer"] == 0
    # The foreign conversation has called no tool: its prose is no final
    # answer, it is pinned under its own key.
    (key,) = [k for k in s.conversations.keys_of("victim") if k != "victim"]
    assert s.pins.get(key).request_id == other.request_id


def test_a_foreign_session_id_last_step_does_not_end_the_victims_job(s):
    prompt = prompt_of(11, 100)
    first = scripted(make_request(prompt, max_tokens=len(HERMES_CAT), is_last_step=False), HERMES_CAT)
    first.session_id = "sess"  # what the API server passes for X-Session-ID
    s.add_request(first)
    run_until_finished(s, [first])
    other = make_request(prompt_of(77, 100), max_tokens=4, is_last_step=True)
    other.session_id = "sess"
    s.add_request(other)
    run_until_finished(s, [other])
    assert s.jobs.get("sess") is not None and "sess" in s.pins


def test_a_foreign_arrival_is_not_measured_as_the_victims_tool_time(s):
    victim_first_turn(s)
    s.clock.advance(0.5)
    other = foreign(s, finish=False)
    assert tool_samples(s) == (0, 0.0)
    job = s.jobs.get("victim")
    assert job.in_flight == 0  # the foreign request is no turn of the job
    run_until_finished(s, [other])
    assert s.jobs.get("victim").turns_finished == 1


def test_the_victims_next_turn_measures_its_real_tool_time(s):
    prompt, first = victim_first_turn(s)
    s.clock.advance(0.5)
    other = foreign(s, finish=False)  # still in flight when the victim comes back
    s.clock.advance(1.5)
    nxt = make_request(victim_next_prompt(prompt, first), max_tokens=4, job_id="victim", is_last_step=True)
    s.add_request(nxt)
    count, total = tool_samples(s)
    assert count == 1 and total == pytest.approx(2.0, abs=0.01)
    run_until_finished(s, [other, nxt])
    assert s.continuum_metrics.snapshot()["pins_released"]["last_step"] == 0  # handed over at admission
    assert s.jobs.get("victim") is None  # the victim's own last step ended it


def test_a_foreign_request_does_not_rank_by_the_victims_first_arrival(s):
    victim_first_turn(s)
    lapse_pin(s)
    other = foreign(s, finish=False)
    assert s.order.ranked_arrival(other) == other.arrival_time
    # It ranks as the first turn of a job of its own, which holds no pin.
    assert request_meta(other).job_id != "victim" and s.order.queue_key(other)[0] == TIER_REST
    run_until_finished(s, [other])


def test_a_foreign_request_is_a_conversation_of_its_own_and_logged(s, caplog):
    victim_first_turn(s)
    with caplog.at_level(logging.DEBUG, logger="vllm.continuum_plugin"):
        other = foreign(s, is_last_step=False)
    assert "conversation victim#1 starts beside 1 others" in caplog.text
    assert other.num_computed_tokens > 0  # it was served
    snap = s.continuum_metrics.snapshot()
    assert snap["conversations_started"] == 1 and snap["context_mismatches"] == 0
    assert s.pins.get("victim").request_id != other.request_id  # and kept nothing for the victim's job


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pin_lapsed"])
def test_the_victims_own_next_turn_still_acts_on_its_job(s, pinned):
    prompt, first = victim_first_turn(s)
    if not pinned:
        lapse_pin(s)
    nxt = make_request(victim_next_prompt(prompt, first), max_tokens=4, job_id="victim", is_last_step=True)
    s.add_request(nxt)
    run_until_finished(s, [nxt])
    assert s.jobs.get("victim") is None
    assert s.continuum_metrics.snapshot()["jobs_ended"]["last_step"] == 1
    assert s.continuum_metrics.snapshot()["context_mismatches"] == 0
    assert not s.running and len(s.pins) == 0 and free_blocks(s) == usable_blocks(s)


def test_overlapping_branches_of_one_job_are_conversations_that_each_keep_their_pin(s):
    # Two branches of one job id (sub-agents under one session id): each
    # next turn continues its own branch and takes over its own pin.
    a = make_request(prompt_of(21, 100), max_tokens=4, job_id="multi", is_last_step=False)
    b = make_request(prompt_of(22, 100), max_tokens=4, job_id="multi", is_last_step=False)
    s.add_request(a)
    s.add_request(b)
    run_until_finished(s, [a, b])
    keys = s.conversations.keys_of("multi")
    assert len(keys) == 2 and all(k in s.pins for k in keys)
    for branch in (a, b):
        nxt = make_request(list(branch.all_token_ids) + prompt_of(23, 10), max_tokens=4, job_id="multi",
                           is_last_step=False)
        s.add_request(nxt)
        run_until_finished(s, [nxt])
    assert [s.jobs.get(k).turns_finished for k in keys] == [2, 2]
    snap = s.continuum_metrics.snapshot()
    assert snap["pins_released"]["handoff"] == 2 and snap["context_mismatches"] == 0


def test_foreign_requests_cannot_push_a_pinned_conversation_out_of_its_session(s):
    prompt, first = victim_first_turn(s)
    for i in range(MAX_CONVERSATIONS + 3):  # more than a session holds: idle ones make room
        r = scripted(make_request(prompt_of(80 + i, 100), max_tokens=4, job_id="victim", is_last_step=False),
                     HERMES_CAT)
        s.add_request(r)
        run_until_finished(s, [r])
    assert "victim" in s.conversations.keys_of("victim") and len(s.conversations.keys_of("victim")) <= MAX_CONVERSATIONS
    nxt = make_request(victim_next_prompt(prompt, first), max_tokens=4, job_id="victim", is_last_step=True)
    s.add_request(nxt)
    run_until_finished(s, [nxt])
    assert s.continuum_metrics.snapshot()["pins_released"]["handoff"] >= 1
    assert s.jobs.get("victim") is None  # its own last step ended it
