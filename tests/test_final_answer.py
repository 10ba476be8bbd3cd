"""How explicit jobs end without a flag, on a real vLLM Scheduler.

A reply without a tool call, in a job that called a tool before, is its
final answer: the job ends and nothing stays pinned -- for job ids and
session ids alike, as for implicit jobs. An explicit ``is_last_step:
false`` keeps such an answer pinned (the client decides), and a
``final_answer`` tool call (smolagents' ToolCallingAgent) ends a job like
the other finish actions. Replies are scripted tokens of the tiny test
model's tokenizer, so the scheduler decodes and parses real text.
"""

from __future__ import annotations

from harness import (
    free_blocks,
    make_request,
    make_scheduler,
    prompt_of,
    run_until_finished,
    scripted,
    tiny_tokens,
    usable_blocks,
)

BLOCK = 16
EOS = 2
TEMPLATE = [3, 1]  # what a chat template adds after a reply before the tool output


HERMES_CAT = tiny_tokens('<tool_call>\n{"name": "bash", "arguments": {"command": "cat main.py"}}\n</tool_call>') + [EOS]
FINAL_ANSWER_TOOL = tiny_tokens('<tool_call>\n{"name": "final_answer", "arguments": {"answer": "42"}}\n</tool_call>') + [EOS]
PROSE = tiny_tokens("The bug is in add(): it subtracts.") + [EOS]


def turn(s, prompt: list[int], reply: list[int], session_id: str | None = None, **kwargs):
    """One finished turn of ``prompt`` answered with ``reply``."""
    r = scripted(make_request(prompt, max_tokens=len(reply), **kwargs), reply)
    if session_id is not None:
        r.session_id = session_id  # what the API server passes for X-Session-ID / harness headers
    s.add_request(r)
    run_until_finished(s, [r])
    return r


def next_prompt(prompt: list[int], reply: list[int], tool_output: int) -> list[int]:
    return prompt + reply + TEMPLATE + prompt_of(tool_output, 20)


def ended(s) -> dict[str, int]:
    return s.continuum_metrics.snapshot()["jobs_ended"]


def assert_nothing_pinned_and_all_free(s) -> None:
    assert not s.running and len(s.pins) == 0
    assert free_blocks(s) == usable_blocks(s)


def test_a_final_text_answer_ends_an_explicit_jobs_task_and_frees_everything():
    s = make_scheduler(num_blocks=64)
    p1 = prompt_of(1, 60)
    turn(s, p1, HERMES_CAT, job_id="j")
    assert "j" in s.pins
    turn(s, next_prompt(p1, HERMES_CAT, 2), PROSE, job_id="j")
    assert ended(s)["final_answer"] == 1
    # The job stays known for its user's follow-up (its rank, its turns);
    # nothing is pinned for it (tests/test_real_traffic.py follows it up).
    assert s.jobs.get("j") is not None and s.jobs.get("j").turns_finished == 2
    assert_nothing_pinned_and_all_free(s)


def test_a_session_id_job_ends_on_its_final_answer_too():
    s = make_scheduler(num_blocks=64)
    p1 = prompt_of(3, 60)
    turn(s, p1, HERMES_CAT, session_id="3f1c2a9e-7d41-4b8e-9c55-0a6e2b1d4f10")
    assert "3f1c2a9e-7d41-4b8e-9c55-0a6e2b1d4f10" in s.pins
    turn(s, next_prompt(p1, HERMES_CAT, 4), PROSE, session_id="3f1c2a9e-7d41-4b8e-9c55-0a6e2b1d4f10")
    assert ended(s)["final_answer"] == 1
    assert_nothing_pinned_and_all_free(s)


def test_explicit_is_last_step_false_keeps_the_answer_pinned():
    s = make_scheduler(num_blocks=64)
    p1 = prompt_of(5, 60)
    turn(s, p1, HERMES_CAT, job_id="reader")
    p2 = next_prompt(p1, HERMES_CAT, 6)
    turn(s, p2, PROSE, job_id="reader", is_last_step=False)
    assert "reader" in s.pins and ended(s)["final_answer"] == 0
    # The job had a tool call (two turns back): the next unflagged answer ends it.
    turn(s, next_prompt(p2, PROSE, 7), PROSE, job_id="reader")
    assert ended(s)["final_answer"] == 1
    assert_nothing_pinned_and_all_free(s)


def test_a_job_that_never_called_a_tool_keeps_its_answers_pinned():
    s = make_scheduler(num_blocks=64)
    p1 = prompt_of(8, 60)
    turn(s, p1, PROSE, job_id="chatty")
    assert "chatty" in s.pins  # no tool call yet: nothing says this was the end
    turn(s, next_prompt(p1, PROSE, 9), PROSE, job_id="chatty")
    assert "chatty" in s.pins and ended(s)["final_answer"] == 0


def test_a_final_answer_tool_call_ends_the_job():
    s = make_scheduler(num_blocks=64)
    p1 = prompt_of(10, 60)
    turn(s, p1, HERMES_CAT, job_id="smol")
    turn(s, next_prompt(p1, HERMES_CAT, 11), FINAL_ANSWER_TOOL, job_id="smol", is_last_step=False)
    snap = s.continuum_metrics.snapshot()
    assert snap["jobs_ended"]["finish_action"] == 1
    assert_nothing_pinned_and_all_free(s)


def test_an_untagged_one_turn_final_answer_tool_call_is_served_as_stock():
    s = make_scheduler(num_blocks=64)
    turn(s, prompt_of(12, 60), FINAL_ANSWER_TOOL)
    assert s.continuum_metrics.snapshot()["implicit_turns"]["started"] == 0
    assert_nothing_pinned_and_all_free(s)


def test_without_a_tokenizer_no_reply_is_taken_for_a_final_answer():
    s = make_scheduler(num_blocks=64)
    p1 = prompt_of(13, 60)
    turn(s, p1, HERMES_CAT, job_id="blind", extra={"tool_name": "bash"})
    # The engine has no tokenizer (skip_tokenizer_init): replies cannot be read.
    s.replies._tokenizer, s.replies._tokenizer_failed, s.replies._decode = None, True, None
    turn(s, next_prompt(p1, HERMES_CAT, 14), PROSE, job_id="blind")
    assert "blind" in s.pins and ended(s)["final_answer"] == 0
