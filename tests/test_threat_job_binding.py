"""A job id is no bearer token: job state is bound to the job's context.

The threat model of issue 23, finding 2, one test per attack. A victim runs an
agent job; another client sends requests under the victim's job id (an
explicit ``job_id`` or a session id) with a context of its own. Such a
request must not end the victim's job, have its arrival measured as the
victim's tool time, rank by the victim's first arrival or take the victim's
pin: it is served as stock (counted in ``context_mismatches``). The victim's
own turns still act on the job, with or without a pin.

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
    assert s.continuum_metrics.snapshot()["jobs_ended"]["last_step"] == 0
    assert s.pins.get("victim") is pin
    assert s.continuum_metrics.snapshot()["context_mismatches"] == 1


@pytest.mark.parametrize(
    "hint",
    [{"tool_command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}, {"tool_name": "submit"}],
    ids=["finish_action_command", "tool_name_submit"],
)
def test_a_foreign_finish_action_does_not_end_the_victims_job(s, hint):
    victim_first_turn(s)
    foreign(s, is_last_step=False, extra=hint)
    assert s.jobs.get("victim") is not None
    assert s.continuum_metrics.snapshot()["jobs_ended"]["finish_action"] == 0
    assert "victim" in s.pins


def test_a_foreign_final_answer_does_not_end_the_victims_job(s):
    victim_first_turn(s)  # called a tool: its next reply without one is its final answer
    foreign(s, reply=PROSE)
    job = s.jobs.get("victim")
    assert job is not None and job.had_tool_call
    assert s.continuum_metrics.snapshot()["jobs_ended"]["final_answer"] == 0


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
    assert not s.order.has_credit(other)
    run_until_finished(s, [other])


def test_a_foreign_request_is_served_as_stock_and_logged(s, caplog):
    victim_first_turn(s)
    with caplog.at_level(logging.DEBUG, logger="vllm.continuum_plugin"):
        other = foreign(s, is_last_step=False)
    assert "does not continue its context" in caplog.text
    assert other.num_computed_tokens > 0  # it was served
    assert s.continuum_metrics.snapshot()["context_mismatches"] == 1
    assert s.pins.get("victim").request_id != other.request_id  # and kept nothing for the job


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


def test_overlapping_branches_of_one_job_each_keep_acting_on_it(s):
    # Two branches of one job (sub-agents under one session id): each next
    # turn continues its own branch, not the other's pin.
    a = make_request(prompt_of(21, 100), max_tokens=4, job_id="multi", is_last_step=False)
    b = make_request(prompt_of(22, 100), max_tokens=4, job_id="multi", is_last_step=False)
    s.add_request(a)
    s.add_request(b)
    run_until_finished(s, [a, b])
    for branch in (a, b):
        nxt = make_request(list(branch.all_token_ids) + prompt_of(23, 10), max_tokens=4, job_id="multi",
                           is_last_step=False)
        s.add_request(nxt)
        run_until_finished(s, [nxt])
    assert s.jobs.get("multi").turns_finished == 4
    assert s.continuum_metrics.snapshot()["context_mismatches"] == 0


def test_a_job_idle_past_the_reset_is_bound_again_by_its_next_request(s):
    victim_first_turn(s)
    s.clock.advance(400.0)  # past job_idle_reset_s (300 s): a new activity period
    step(s)
    again = foreign(s, is_last_step=True)
    assert again.num_computed_tokens > 0
    assert s.jobs.get("victim") is None  # the id's new user ended it
    assert s.continuum_metrics.snapshot()["context_mismatches"] == 0
