"""Job order on a real vLLM scheduler: the waiting queue and preemption.

Job-level FCFS (a job's turns rank by its first arrival, bounded by
``job_priority_window_s``; an idle job's rank resets), pinned jobs first,
the preemption victim (the latest job not on its last step), and a new job
that waits instead of evicting an older job's pin. Manual clock, no weights.
"""

from __future__ import annotations

from harness import make_request, make_scheduler, prompt_of, run_until_finished, step
from scheduler_turns import assert_all_blocks_free, first_turn, next_turn_prompt


def test_job_fcfs_queue_order_and_pinned_jobs_first():
    s = make_scheduler(num_blocks=200, max_num_seqs=1)
    t = s.clock.time()
    old_prompt, old_r1 = first_turn(s, "old", arrival_time=t - 100)
    # Newer job's first turn and the old job's second turn, newer one first.
    new = make_request(prompt_of(50, 40), job_id="new", arrival_time=t - 1)
    old2 = make_request(next_turn_prompt(old_prompt, old_r1), job_id="old", arrival_time=t)
    plain = make_request(prompt_of(51, 40), arrival_time=t - 50)
    for r in (new, old2, plain):
        s.add_request(r)
    order = []
    while len(order) < 3:
        out = step(s)
        order += [n.req_id for n in out.scheduled_new_reqs]
        run_until_finished(s, [s.requests[n.req_id] for n in out.scheduled_new_reqs]) if out.scheduled_new_reqs else None
    # "old" holds a pin -> first; then job-level FCFS: plain (t-50), new (t-1).
    assert order == [old2.request_id, plain.request_id, new.request_id]


def test_preemption_victim_is_latest_job_not_on_last_step():
    s = make_scheduler(num_blocks=30, max_num_seqs=3, continuum={"max_pinned_fraction": 0.01})
    t = s.clock.time()
    prompt, first = first_turn(s, "late-last", length=60, arrival_time=t - 10)  # a job with a turn behind it
    early = make_request(prompt_of(1, 100), max_tokens=120, job_id="early", arrival_time=t - 30)
    late_last = make_request(next_turn_prompt(prompt, first), max_tokens=120, job_id="late-last",
                             is_last_step=True, arrival_time=t - 1)
    middle = make_request(prompt_of(3, 100), max_tokens=120, job_id="middle", arrival_time=t - 20)
    for r in (early, late_last, middle):
        s.add_request(r)
    run_until_finished(s, [early, late_last, middle], max_steps=3000)
    assert late_last.num_preemptions == 0 and early.num_preemptions == 0
    assert middle.num_preemptions >= 1
    assert_all_blocks_free(s)


def test_a_last_step_flag_alone_does_not_protect_from_preemption():
    # Any client can flag every request as a last step; only the last turn
    # of a job with finished turns goes after the others.
    s = make_scheduler(num_blocks=30, max_num_seqs=3, continuum={"max_pinned_fraction": 0.01})
    t = s.clock.time()
    early = make_request(prompt_of(1, 100), max_tokens=120, job_id="early", arrival_time=t - 30)
    middle = make_request(prompt_of(3, 100), max_tokens=120, arrival_time=t - 20)
    flagged = make_request(prompt_of(2, 100), max_tokens=120, job_id="fresh", is_last_step=True, arrival_time=t - 10)
    for r in (early, middle, flagged):
        s.add_request(r)
    run_until_finished(s, [early, middle, flagged], max_steps=3000)
    assert flagged.num_preemptions >= 1 and early.num_preemptions == 0 and middle.num_preemptions == 0
    assert_all_blocks_free(s)


def test_new_job_waits_instead_of_evicting_an_older_jobs_pin():
    s = make_scheduler(num_blocks=40, max_num_seqs=4, continuum={"max_pinned_fraction": 1.0, "default_ttl_s": 60})
    t = s.clock.time()
    prompt, r1 = first_turn(s, "old", length=300, arrival_time=t - 10)  # 19 blocks pinned
    runner = make_request(prompt_of(800, 100), max_tokens=300, job_id="runner", is_last_step=True, arrival_time=t - 5)
    s.add_request(runner)
    step(s)  # keeps the engine busy
    newcomer = make_request(prompt_of(801, 250), job_id="new", is_last_step=True, arrival_time=t)  # 16 blocks
    s.add_request(newcomer)
    for _ in range(3):
        step(s)
    assert "old" in s.pins and newcomer.num_computed_tokens == 0  # waits
    r2 = make_request(next_turn_prompt(prompt, r1), job_id="old", is_last_step=True, arrival_time=t + 1)
    s.add_request(r2)
    run_until_finished(s, [r2, runner, newcomer], max_steps=3000)
    assert s.continuum_metrics.snapshot()["pins_released"]["handoff"] == 1
    assert_all_blocks_free(s)


def _drain(s, requests, max_steps: int = 20000):
    for _ in range(max_steps):
        if all(r.is_finished() for r in requests):
            return
        step(s)
    raise AssertionError("requests did not finish")


def test_a_job_id_reused_for_500_pipelined_turns_does_not_starve_50_fresh_jobs():
    # One client sends 500 requests under one job id, always 8 at once; 50
    # fresh jobs arrive meanwhile; 4 requests run at a time.
    s = make_scheduler(num_blocks=256, max_num_seqs=4)
    hog = [make_request(prompt_of(900 + i, 40), job_id="shared", is_last_step=False) for i in range(8)]
    for r in hog:
        s.add_request(r)
    fresh = [make_request(prompt_of(i, 40), job_id=f"fresh{i}", is_last_step=True) for i in range(50)]
    for r in fresh:
        s.add_request(r)
    submitted = len(hog)
    for _ in range(20000):
        if all(r.is_finished() for r in fresh):
            break
        step(s)
        for r in [r for r in hog if r.is_finished()]:
            hog.remove(r)
            if submitted < 500:
                nxt = make_request(prompt_of(900 + submitted, 40), job_id="shared", is_last_step=False)
                s.add_request(nxt)
                hog.append(nxt)
                submitted += 1
    assert all(r.is_finished() for r in fresh)
    # The fresh jobs went first: the client got through a fraction of its 500.
    assert submitted < 100, submitted
    _drain(s, hog)


def test_an_old_sequential_job_loses_its_head_start_after_the_priority_window():
    # A job id used by a sequential loop for 500 turns, each 2 s apart, keeps
    # its place only for job_priority_window_s (600 s): then 50 fresh jobs
    # waiting since the start go first. One request runs at a time.
    s = make_scheduler(num_blocks=256, max_num_seqs=1)
    fresh = []
    served_turns = 0

    def loop_prompt(turn: int) -> list[int]:
        # Every turn continues the loop's context (its first two blocks), as
        # a real agent's does: only such a request acts on the job.
        return prompt_of(900, 32) + [(turn * 13 + i) % 900 + 10 for i in range(8)]

    r = make_request(loop_prompt(0), job_id="loop", is_last_step=False)
    s.add_request(r)
    step(s)  # the loop's first turn is running
    fresh = [make_request(prompt_of(i, 40), job_id=f"fresh{i}", is_last_step=True) for i in range(50)]
    for f in fresh:
        s.add_request(f)
    turn_when_fresh_done = None
    while served_turns < 500:
        _drain(s, [r])
        served_turns += 1
        if turn_when_fresh_done is None and all(f.is_finished() for f in fresh):
            turn_when_fresh_done = served_turns
        s.clock.advance(2.0)
        r = make_request(loop_prompt(served_turns), job_id="loop", is_last_step=served_turns == 499)
        s.add_request(r)
    _drain(s, [r, *fresh])
    # Turns within the window (the first ~300) keep the job ahead; after
    # that every fresh job is served before the loop's next turn.
    assert turn_when_fresh_done is not None and 295 <= turn_when_fresh_done <= 305, turn_when_fresh_done
    s.clock.advance(61)
    step(s)
    assert_all_blocks_free(s)


def test_a_job_idle_longer_than_the_reset_ranks_as_a_new_arrival():
    s = make_scheduler(num_blocks=256, max_num_seqs=1)
    first_turn(s, "old")  # pinned; the job's place is its first arrival
    s.clock.advance(400.0)  # idle past job_idle_reset_s (300 s); the pin lapsed
    step(s)
    blocker = make_request(prompt_of(7, 40), max_tokens=50, is_last_step=True)
    s.add_request(blocker)
    step(s)
    newer = make_request(prompt_of(8, 40), job_id="newer", is_last_step=True)
    s.add_request(newer)
    back = make_request(prompt_of(9, 40), job_id="old", is_last_step=True)
    s.add_request(back)
    assert s.order.queue_key(back) > s.order.queue_key(newer)
    _drain(s, [blocker, newer, back])
    assert newer.num_computed_tokens and back.num_computed_tokens
    assert_all_blocks_free(s)
