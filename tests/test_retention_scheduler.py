"""Declared retention on a real vLLM scheduler (issue 34).

A request's retention directives keep the blocks they rank high past a
flood that evicts them without directives, stage by stage, never longer
than ``retention_max_s``; blocks ranked low go first out of the prefix
cache; what is kept on a client's word alone yields first to memory
pressure and never makes another client's pin give way; a directive from
one scope never touches another's job. Time is the scheduler's manual
clock; every test ends with every block free.
"""

from __future__ import annotations

from harness import admitted_cached_tokens, make_request, make_scheduler, prompt_of, run_until_finished, step
from scheduler_turns import assert_all_blocks_free

BLOCK = 16
KEEP = [{"start": 0, "end": 10**6, "priority": 90, "duration": 100}]


def run_for_hit(s, request, max_steps: int = 500) -> int:
    hit = None
    for _ in range(max_steps):
        got = admitted_cached_tokens(step(s), request)
        hit = got if got is not None and hit is None else hit
        if request.is_finished():
            assert hit is not None
            return hit
    raise AssertionError(f"not finished in {max_steps} steps")


def flood(s, first: int, count: int, blocks: int) -> None:
    """``count`` one-off chat requests of ``blocks`` blocks, one after the
    other: enough to cycle an unpinned context out of the prefix cache."""
    for i in range(count):
        r = make_request(prompt_of(first + i, blocks * BLOCK), max_tokens=2)
        s.add_request(r)
        run_until_finished(s, [r])


def benign_pin(s):
    pins = [p for p in s.pins.table.pins() if "benign" in p.job_id]
    assert len(pins) == 1
    return pins[0]


def snap(s) -> dict:
    return s.continuum_metrics.snapshot()


def lapse(s, seconds: float) -> None:
    s.clock.advance(seconds)
    step(s)


def test_a_directive_keeps_a_chat_prompt_through_a_flood_and_lapses_at_its_duration():
    for declared in (False, True):
        s = make_scheduler(num_blocks=64)
        prompt = prompt_of(1, 20 * BLOCK)
        first = make_request(prompt, max_tokens=2, extra={"retention_directives": KEEP} if declared else None)
        s.add_request(first)
        run_until_finished(s, [first])
        flood(s, 100, 8, 12)  # 96 blocks through a 63-block pool
        again = make_request(prompt + [5, 6, 7], max_tokens=2)
        s.add_request(again)
        hit = run_for_hit(s, again)
        if declared:
            assert hit == 20 * BLOCK  # the whole declared prompt served from cache
            assert snap(s)["retention"]["accepted"] == 1
            lapse(s, 101)  # past its duration: the hold goes, honoured
            assert snap(s)["retention"]["honoured"] == 1
        else:
            assert hit == 0  # stock LRU: the flood took it
        # ``again`` continued the first answer: an implicit chat now, whose
        # answer is kept a while for its next turn (implicit_jobs); it lapses.
        lapse(s, 3600)
        assert_all_blocks_free(s)


def test_stages_release_the_history_before_the_system_prompt():
    s = make_scheduler(num_blocks=64, continuum={"retention_max_s": 1000})
    directives = [{"start": 0, "end": 4 * BLOCK, "priority": 90, "duration": 600},
                  {"start": 4 * BLOCK, "end": 16 * BLOCK, "priority": 70, "duration": 30}]
    r = make_request(prompt_of(2, 16 * BLOCK), max_tokens=2, extra={"retention_directives": directives})
    s.add_request(r)
    run_until_finished(s, [r])
    held = s.pins.num_pinned_blocks
    assert held == 16
    lapse(s, 31)
    assert s.pins.num_pinned_blocks == 4  # the system prompt's blocks stay
    lapse(s, 600)
    assert s.pins.num_pinned_blocks == 0
    assert_all_blocks_free(s)


def test_durations_are_bounded_by_the_setting():
    s = make_scheduler(num_blocks=64, continuum={"retention_max_s": 50})
    days = [{"start": 0, "end": 10**6, "priority": 100, "duration": 7 * 86400}]
    r = make_request(prompt_of(3, 8 * BLOCK), max_tokens=2, extra={"retention_directives": days})
    s.add_request(r)
    run_until_finished(s, [r])
    assert s.pins.num_pinned_blocks == 8
    lapse(s, 51)
    assert s.pins.num_pinned_blocks == 0
    assert_all_blocks_free(s)


def test_low_priority_blocks_go_first_out_of_the_prefix_cache():
    s = make_scheduler(num_blocks=64)
    low = [{"start": 0, "end": 10**6, "priority": 0}]
    a = make_request(prompt_of(4, 8 * BLOCK), max_tokens=2, extra={"retention_directives": low})
    b = make_request(prompt_of(5, 8 * BLOCK), max_tokens=2)
    for r in (b, a):  # a is freed last: stock LRU would evict it last
        s.add_request(r)
        run_until_finished(s, [r])
    assert snap(s)["retention_evicted_first_blocks"] == 8
    # A request needing exactly the free blocks that hold nothing, plus 8,
    # takes a's blocks, not b's.
    spare = s.kv_cache_manager.block_pool.get_num_free_blocks() - 16
    filler = make_request(prompt_of(6, (spare + 8) * BLOCK - 1), max_tokens=1)
    s.add_request(filler)
    run_until_finished(s, [filler])
    b_again = make_request(prompt_of(5, 8 * BLOCK) + [9], max_tokens=2)
    s.add_request(b_again)
    assert run_for_hit(s, b_again) == 8 * BLOCK
    lapse(s, 3600)  # b_again continued b: an implicit chat, kept a while
    assert_all_blocks_free(s)


def test_a_declared_hold_never_makes_another_clients_pin_give_way():
    # Another client's agent turn (tool call, policy pin of 60 s) arrives
    # *after* a hostile client's declared holds filled the pin cap: under
    # the cap its pin is trimmed by nothing, and under memory pressure the
    # declared holds go first.
    s = make_scheduler(num_blocks=64, continuum={"max_pinned_fraction": 0.5, "ttl_policy": "fixed",
                                                   "fixed_ttl_s": 60.0, "default_ttl_s": 60.0})
    hostile = [{"start": 0, "end": 10**6, "priority": 100, "duration": 7 * 86400}]
    for i in range(4):
        r = make_request(prompt_of(10 + i, 8 * BLOCK), max_tokens=2,
                         extra={"retention_directives": hostile, "continuum_scope": "hostile"})
        s.add_request(r)
        run_until_finished(s, [r])
    assert s.pins.num_pinned_blocks == 31  # the cap: half the usable pool (63 // 2)
    agent = make_request(prompt_of(20, 8 * BLOCK), max_tokens=2, job_id="benign", is_last_step=False,
                         extra={"continuum_scope": "benign"})
    s.add_request(agent)
    run_until_finished(s, [agent])
    # Its pin is whole: the declared holds gave way under the cap, though
    # their jobs arrived first (a policy pin of a later job would not).
    assert benign_pin(s).num_blocks == 8
    assert snap(s)["retention"]["overridden"] >= 1
    # Memory pressure: a big request needs more than the free blocks. The
    # declared holds go first; the benign pin survives.
    big = make_request(prompt_of(30, 40 * BLOCK), max_tokens=2)
    s.add_request(big)
    run_until_finished(s, [big])
    assert benign_pin(s).num_blocks == 8
    lapse(s, 700)
    assert_all_blocks_free(s)


def test_retention_scope_names_a_job_whose_next_turn_takes_the_hold_over():
    s = make_scheduler(num_blocks=64)
    prompt = prompt_of(40, 12 * BLOCK)
    scoped = {"retention_directives": KEEP, "retention_scope": "conv-1"}
    r1 = make_request(prompt, max_tokens=2, extra=scoped)
    s.add_request(r1)
    run_until_finished(s, [r1])
    assert s.pins.get("conv-1") is not None
    r2 = make_request(list(r1.all_token_ids) + prompt_of(41, 2 * BLOCK), max_tokens=2, extra=scoped)
    s.add_request(r2)
    assert run_for_hit(s, r2) >= 12 * BLOCK
    assert snap(s)["pins_released"]["handoff"] >= 1
    lapse(s, 700)
    assert_all_blocks_free(s)


def test_a_jobs_declared_hold_goes_to_its_next_turn_when_the_policy_itself_holds_nothing():
    """With the plugin's own TTL at zero (``max_ttl_s`` 0: it pins nothing
    itself) a job's directives still keep its blocks, and the job's next
    turn takes the hold over (hand-off) instead of the hold outliving it."""
    s = make_scheduler(num_blocks=64, continuum={"max_ttl_s": 0.0})
    prompt = prompt_of(42, 12 * BLOCK)
    r1 = make_request(prompt, max_tokens=2, job_id="job-z", is_last_step=False,
                      extra={"retention_directives": KEEP})
    s.add_request(r1)
    run_until_finished(s, [r1])
    assert s.pins.get("job-z") is not None
    r2 = make_request(list(r1.all_token_ids) + prompt_of(43, 2 * BLOCK), max_tokens=2, job_id="job-z",
                      is_last_step=True)
    s.add_request(r2)
    assert run_for_hit(s, r2) >= 12 * BLOCK
    assert snap(s)["pins_released"]["handoff"] == 1
    assert len(s.pins) == 0  # nothing outlives the job
    lapse(s, 700)
    assert_all_blocks_free(s)


def test_preempted_or_aborted_requests_hold_nothing():
    s = make_scheduler(num_blocks=64)
    r = make_request(prompt_of(50, 8 * BLOCK), max_tokens=50, extra={"retention_directives": KEEP})
    s.add_request(r)
    step(s)
    s.finish_requests([r.request_id], __import__("vllm.v1.request", fromlist=["RequestStatus"]).RequestStatus.FINISHED_ABORTED)
    assert s.pins.num_pinned_blocks == 0
    assert_all_blocks_free(s)


def test_zero_retention_max_ignores_directives():
    s = make_scheduler(num_blocks=64, continuum={"retention_max_s": 0})
    r = make_request(prompt_of(60, 8 * BLOCK), max_tokens=2, extra={"retention_directives": KEEP})
    s.add_request(r)
    run_until_finished(s, [r])
    assert s.pins.num_pinned_blocks == 0
    assert_all_blocks_free(s)


def test_another_scope_naming_the_same_retention_scope_cannot_touch_the_hold():
    s = make_scheduler(num_blocks=64)
    prompt = prompt_of(70, 12 * BLOCK)
    mine = make_request(prompt, max_tokens=2, extra={"retention_directives": KEEP, "retention_scope": "conv-1",
                                                       "continuum_scope": "alice"})
    s.add_request(mine)
    run_until_finished(s, [mine])
    held = s.pins.num_pinned_blocks
    assert held == 12
    # Another client names the same scope, sends the same prompt and ranks
    # it low: a conversation of its own; Alice's hold stays whole.
    low = [{"start": 0, "end": 10**6, "priority": 0}]
    theirs = make_request(prompt, max_tokens=2, extra={"retention_directives": low, "retention_scope": "conv-1",
                                                         "continuum_scope": "mallory"})
    s.add_request(theirs)
    run_until_finished(s, [theirs])
    alice = [p for p in s.pins.table.pins() if p.request_id == mine.request_id]
    assert len(alice) == 1 and alice[0].num_blocks == 12
    again = make_request(list(mine.all_token_ids) + [3, 4], max_tokens=2,
                         extra={"retention_scope": "conv-1", "continuum_scope": "alice"})
    s.add_request(again)
    assert run_for_hit(s, again) >= 12 * BLOCK
    lapse(s, 700)
    assert_all_blocks_free(s)


def test_a_hold_trimmed_by_the_cap_keeps_the_longest_hold_its_blocks_were_given():
    # 12 blocks declared: the first 4 (system prompt) for 600 s, all for 30 s;
    # a cap of 4 blocks trims the hold to the system prompt, which keeps 600 s.
    s = make_scheduler(num_blocks=64, continuum={"max_pinned_fraction": 4 / 63, "retention_max_s": 1000})
    directives = [{"start": 0, "end": 4 * BLOCK, "priority": 90, "duration": 600},
                  {"start": 4 * BLOCK, "end": 12 * BLOCK, "priority": 70, "duration": 30}]
    r = make_request(prompt_of(80, 12 * BLOCK), max_tokens=2, extra={"retention_directives": directives})
    s.add_request(r)
    run_until_finished(s, [r])
    assert s.pins.num_pinned_blocks == 4
    lapse(s, 31)
    assert s.pins.num_pinned_blocks == 4  # still held: its own stage lasts 600 s
    lapse(s, 600)
    assert s.pins.num_pinned_blocks == 0
    assert_all_blocks_free(s)
