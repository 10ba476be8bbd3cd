"""Turns of named jobs on a real vLLM scheduler, for the scheduler tests.

Shared by tests/test_scheduler.py and tests/test_job_order.py: a job's
first turn (a prompt unique to the job's name), the prompt of its next turn,
a flood of other traffic, and the invariant every test ends with.
"""

from __future__ import annotations

import zlib

from harness import free_blocks, make_request, prompt_of, run_until_finished, usable_blocks


def assert_all_blocks_free(scheduler) -> None:
    """The invariant: nothing running, nothing pinned -> every block free."""
    assert not scheduler.running
    assert len(getattr(scheduler, "pins", ())) == 0
    assert free_blocks(scheduler) == usable_blocks(scheduler)


def job_seed(job: str) -> int:
    """The prompt seed of a named job: stable across processes (``hash`` of
    a str is salted per process, so a job's prompt could collide with a
    fixed seed another request of the test uses, once in a few hundred runs)."""
    return zlib.crc32(job.encode()) % 997


def first_turn(scheduler, job: str, length: int = 100, **kwargs):
    prompt = prompt_of(job_seed(job), length)
    request = make_request(prompt, max_tokens=4, job_id=job, is_last_step=False, **kwargs)
    scheduler.add_request(request)
    run_until_finished(scheduler, [request])
    return prompt, request


def next_turn_prompt(prompt, first_request, extra: int = 40):
    return list(prompt) + list(first_request.output_token_ids) + list(range(20, 20 + extra))


def flood(scheduler, count: int = 8, length: int = 150):
    others = [make_request(prompt_of(100 + i, length), max_tokens=4) for i in range(count)]
    for r in others:
        scheduler.add_request(r)
    run_until_finished(scheduler, others)
