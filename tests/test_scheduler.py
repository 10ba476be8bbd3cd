"""The plugin's scheduler hooks on a real vLLM Scheduler and block pool.

No model weights: ``harness.step`` feeds one sampled token per scheduled
request, so vLLM's own scheduling, prefix caching and block freeing run.
Time is the scheduler's manual clock: nothing here sleeps, and a pin lapses
only when a test advances the clock past its TTL. Job order and preemption
order: tests/test_job_order.py.
"""

from __future__ import annotations

import pytest
from harness import (
    ARRIVAL_SPACING_S,
    admitted_cached_tokens,
    free_blocks,
    make_request,
    make_scheduler,
    prompt_of,
    run_until_finished,
    step,
    usable_blocks,
)
from scheduler_turns import assert_all_blocks_free, first_turn, flood, job_seed, next_turn_prompt
from vllm.v1.request import RequestStatus

from vllm_continuum_plugin.request_record import request_meta
from vllm_continuum_plugin.scheduler import ContinuumAsyncScheduler, ContinuumScheduler

BLOCK = 16


@pytest.mark.parametrize("policy, expect_hit", [("fcfs", False), ("continuum", True)])
def test_pin_survives_a_flood_of_other_jobs(policy, expect_hit):
    s = make_scheduler(policy, num_blocks=64, max_num_seqs=2)
    prompt, r1 = first_turn(s, "agent")
    flood(s)  # 8 x 150 tokens through a 63-block pool, two at a time
    r2 = make_request(next_turn_prompt(prompt, r1), job_id="agent", is_last_step=True)
    s.add_request(r2)
    cached = admitted_cached_tokens(step(s), r2)
    full_blocks_of_turn_one = (len(prompt) + 4 - 1) // BLOCK * BLOCK
    assert cached == (full_blocks_of_turn_one if expect_hit else 0)
    run_until_finished(s, [r2])
    assert_all_blocks_free(s)


def test_handoff_releases_pin_when_next_turn_is_admitted():
    s = make_scheduler(num_blocks=64)
    prompt, r1 = first_turn(s, "a")
    pinned = s.pins.get("a").num_blocks
    assert pinned == (len(prompt) + 3) // BLOCK and free_blocks(s) == usable_blocks(s) - pinned
    r2 = make_request(next_turn_prompt(prompt, r1), job_id="a", is_last_step=False)
    s.add_request(r2)
    step(s)
    assert "a" not in s.pins
    snap = s.continuum_metrics.snapshot()
    assert snap["pins_released"]["handoff"] == 1 and snap["pin_hit_tokens"] == pinned * BLOCK
    run_until_finished(s, [r2])
    assert "a" in s.pins  # the new turn pinned its own, longer prefix
    assert s.pins.get("a").num_blocks > pinned


def test_ttl_expiry_frees_blocks_even_when_idle():
    s = make_scheduler(num_blocks=64, continuum={"default_ttl_s": 2.0})
    first_turn(s, "a")
    assert s.pins.get("a") is not None
    step(s)  # vLLM reports the finished request to the workers
    s.clock.advance(1.99)
    assert not s.has_requests()  # engine may sleep: nothing due yet
    step(s)
    assert "a" in s.pins  # a step before the deadline keeps it
    s.clock.advance(0.01)
    assert s.has_requests()  # a due pin wakes the engine for one step
    step(s)
    assert s.continuum_metrics.snapshot()["pins_released"]["ttl"] == 1
    assert not s.has_requests()
    assert_all_blocks_free(s)


def test_expired_pin_waits_for_its_queued_next_turn():
    s = make_scheduler(num_blocks=64, max_num_seqs=1, continuum={"default_ttl_s": 2.0})
    prompt, r1 = first_turn(s, "a")
    blocker = make_request(prompt_of(500, 60), max_tokens=30)
    s.add_request(blocker)
    step(s)  # the blocker occupies the only running slot
    r2 = make_request(next_turn_prompt(prompt, r1), job_id="a", is_last_step=True)
    s.add_request(r2)
    s.clock.advance(5.0)
    step(s)
    assert "a" in s.pins  # expired, but its next turn is queued: keep for hand-off
    run_until_finished(s, [blocker, r2])
    assert s.continuum_metrics.snapshot()["pins_released"]["handoff"] == 1
    assert_all_blocks_free(s)


def test_last_step_frees_everything_and_never_pins():
    s = make_scheduler(num_blocks=64)
    prompt, r1 = first_turn(s, "a")
    r2 = make_request(next_turn_prompt(prompt, r1), job_id="a", is_last_step=True)
    s.add_request(r2)
    run_until_finished(s, [r2])
    assert_all_blocks_free(s)
    assert s.jobs.get("a") is None  # job state forgotten


def test_abort_of_next_turn_releases_pin_and_aborted_turn_is_not_pinned():
    s = make_scheduler(num_blocks=64)
    prompt, r1 = first_turn(s, "a")
    r2 = make_request(next_turn_prompt(prompt, r1), max_tokens=50, job_id="a", is_last_step=False)
    s.add_request(r2)
    step(s)
    step(s)
    s.finish_requests(r2.request_id, RequestStatus.FINISHED_ABORTED)
    assert "a" not in s.pins
    assert_all_blocks_free(s)


def test_stop_string_abort_is_treated_as_a_normal_finish():
    # The API server aborts a request whose text hit a stop string; the turn
    # is complete and its KV is worth keeping.
    s = make_scheduler(num_blocks=64)
    tokenizer = s._load_tokenizer()
    stop_ids = tokenizer.encode("ls\n```", add_special_tokens=False)
    r = make_request(prompt_of(3, 80), max_tokens=len(stop_ids) + 5, job_id="a", stop=["```"])
    s.add_request(r)
    for _ in range(len(stop_ids) + 1):
        output = s.schedule()
        ids = list(output.num_scheduled_tokens)
        from vllm.v1.outputs import ModelRunnerOutput

        produced = r.num_output_tokens
        tok = stop_ids[min(produced, len(stop_ids) - 1)]
        s.update_from_output(
            output,
            ModelRunnerOutput(req_ids=ids, req_id_to_index={i: n for n, i in enumerate(ids)}, sampled_token_ids=[[tok]]),
        )
    s.finish_requests(r.request_id, RequestStatus.FINISHED_ABORTED)
    assert "a" in s.pins


def test_pressure_releases_pins_before_preempting_or_blocking():
    s = make_scheduler(num_blocks=40, max_num_seqs=4, continuum={"max_pinned_fraction": 1.0, "default_ttl_s": 60})
    for job in ("a", "b", "c"):
        first_turn(s, job, length=150)  # 10 blocks each stay pinned
    assert len(s.pins) == 3 and s.pins.num_pinned_blocks == 27
    big = make_request(prompt_of(900, 300), max_tokens=4)  # needs 19 blocks
    s.add_request(big)
    out = step(s)
    assert admitted_cached_tokens(out, big) == 0  # admitted at once, not blocked
    released = s.continuum_metrics.snapshot()["pins_released"]["pressure"]
    assert released >= 1
    # Latest-arriving jobs go first: "a" (the oldest) keeps its pin longest.
    assert "a" in s.pins or released == 3
    run_until_finished(s, [big])
    assert s.continuum_metrics.snapshot().get("pins_created") == 3


def test_no_running_request_is_preempted_while_pins_exist():
    s = make_scheduler(num_blocks=48, max_num_seqs=4, continuum={"max_pinned_fraction": 1.0, "default_ttl_s": 60})
    first_turn(s, "pinned", length=200)  # 13 blocks
    # 3 x 200 tokens = 39 blocks: fits in the 47-block pool only without the pin.
    runners = [make_request(prompt_of(700 + i, 100), max_tokens=100) for i in range(3)]
    for r in runners:
        s.add_request(r)
    run_until_finished(s, runners, max_steps=2000)
    assert all(r.num_preemptions == 0 for r in runners)
    assert s.continuum_metrics.snapshot()["pins_released"]["pressure"] == 1


def test_pin_cap_is_never_exceeded():
    s = make_scheduler(num_blocks=65, continuum={"max_pinned_fraction": 0.25, "default_ttl_s": 60})
    cap = s.max_pinned_blocks
    assert cap == 16
    for i in range(6):
        first_turn(s, f"job{i}", length=100)  # 6 blocks each
        assert s.pins.num_pinned_blocks <= cap
    # Older jobs keep their pins; later arrivals are trimmed or not pinned.
    assert "job0" in s.pins and "job1" in s.pins


def test_overlapping_turns_of_one_job_do_not_crash_and_keep_one_pin_each():
    # r2 arrives while r1, the job's first turn, still runs: with no reply
    # yet it cannot be r1's next turn, so it is a parallel branch (as
    # parallel sub-agents are) -- a conversation of its own, with its own pin.
    s = make_scheduler(num_blocks=64)
    p1, p2 = prompt_of(1, 60), prompt_of(1, 90)
    r1 = make_request(p1, max_tokens=3, job_id="same", is_last_step=False)
    r2 = make_request(p2, max_tokens=6, job_id="same", is_last_step=False)
    s.add_request(r1)
    s.add_request(r2)
    run_until_finished(s, [r1, r2])
    keys = {request_meta(r1).job_id, request_meta(r2).job_id}
    assert len(keys) == 2 and len(s.pins) == 2
    # The last step continues r2's prompt (the longest shared prefix): it ends
    # that conversation; r1's pin lapses at its TTL.
    r3 = make_request(p2, max_tokens=2, job_id="same", is_last_step=True)
    s.add_request(r3)
    run_until_finished(s, [r3])
    assert request_meta(r3).job_id == request_meta(r2).job_id and len(s.pins) == 1
    s.clock.advance(3600.0)
    step(s)
    assert_all_blocks_free(s)


@pytest.mark.parametrize("job_id", [None])
def test_requests_without_job_id_behave_like_fcfs(job_id):
    s = make_scheduler(num_blocks=64)
    rs = [make_request(prompt_of(i, 50), job_id=job_id) for i in range(4)]
    for r in rs:
        s.add_request(r)
    run_until_finished(s, rs)
    assert len(s.pins) == 0 and len(s.jobs) == 0
    assert_all_blocks_free(s)


def test_malformed_metadata_in_engine_serves_request_untagged(caplog):
    s = make_scheduler(num_blocks=64)
    r = make_request(prompt_of(1, 50), job_id="a", is_last_step="perhaps")
    s.add_request(r)
    run_until_finished(s, [r])
    assert len(s.pins) == 0
    assert_all_blocks_free(s)


def test_booleans_as_strings_and_ints_are_understood():
    s = make_scheduler(num_blocks=64)
    turns = [first_turn(s, f"j{i}", extra={"is_last_step": flag}) for i, flag in enumerate(["false", 0, "0", False])]
    assert len(s.pins) == 4
    for i, flag in enumerate(["true", 1, "TRUE", True]):
        r = make_request(next_turn_prompt(*turns[i]), job_id=f"j{i}", is_last_step=flag)
        s.add_request(r)
        run_until_finished(s, [r])
    assert_all_blocks_free(s)


def test_hybrid_model_groups_are_pinned_and_released_together():
    s = make_scheduler(num_blocks=96, hybrid=True, max_num_seqs=2)
    prompt, r1 = first_turn(s, "h", length=120)
    pin = s.pins.get("h")
    full, window = pin.blocks_by_group
    assert len(full) == (len(prompt) + 3) // BLOCK
    assert 0 < len(window) <= len(full)  # only blocks inside the window
    flood(s, count=6, length=150)
    r2 = make_request(next_turn_prompt(prompt, r1), job_id="h", is_last_step=True)
    s.add_request(r2)
    cached = admitted_cached_tokens(step(s), r2)
    assert cached == len(full) * BLOCK  # both groups hit, so the hit stands
    run_until_finished(s, [r2])
    assert_all_blocks_free(s)


def test_reset_prefix_cache_and_shutdown_release_pins():
    s = make_scheduler(num_blocks=64, continuum={"default_ttl_s": 60})
    first_turn(s, "a")
    assert s.reset_prefix_cache() is True
    assert s.continuum_metrics.snapshot()["pins_released"]["reset"] == 1
    first_turn(s, "b")
    s.shutdown()
    assert free_blocks(s) == usable_blocks(s)


def test_prefix_caching_disabled_means_no_pins():
    s = make_scheduler(num_blocks=64, enable_prefix_caching=False)
    first_turn(s, "a")
    assert len(s.pins) == 0 and free_blocks(s) == usable_blocks(s)


def test_policies_select_sync_and_async_scheduler_classes():
    assert type(make_scheduler("continuum")) is ContinuumScheduler
    assert type(make_scheduler("context_serve", async_scheduling=True)) is ContinuumAsyncScheduler
    s = make_scheduler("context_serve", async_scheduling=True, num_blocks=64)
    assert s.continuum_policy == "context_serve"
    prompt, r1 = first_turn(s, "a")
    assert "a" in s.pins


def test_many_jobs_random_lifecycle_leave_no_block_behind():
    import random

    rng = random.Random(0)
    s = make_scheduler(num_blocks=120, max_num_seqs=6, continuum={"default_ttl_s": 2.0})
    live = []
    for i in range(60):
        job = f"j{rng.randrange(12)}"
        last = rng.random() < 0.3
        r = make_request(prompt_of(rng.randrange(12), rng.randrange(20, 200)), max_tokens=rng.randrange(1, 20),
                         job_id=job if rng.random() < 0.9 else None, is_last_step=last)
        s.add_request(r)
        live.append(r)
        for _ in range(rng.randrange(0, 4)):
            step(s)
            s.clock.advance(rng.choice((0.0, 0.5, 3.0)))  # some pins lapse mid-run
        if rng.random() < 0.1 and not r.is_finished():
            s.finish_requests(r.request_id, RequestStatus.FINISHED_ABORTED)
    run_until_finished(s, live, max_steps=5000)
    s.clock.advance(2.0)
    step(s)
    assert_all_blocks_free(s)


def test_context_serve_pins_fast_frees_slow_and_falls_back_when_uncertain():
    s = make_scheduler("context_serve", num_blocks=96)
    assert type(s.decider).__name__ == "ContextServeDecider"
    first_turn(s, "fast", extra={"tool_command": "ls -la"})
    assert s.pins.get("fast").speed == "fast"
    used_before = usable_blocks(s) - free_blocks(s)
    first_turn(s, "slow", extra={"tool_command": "pip install -r requirements.txt"})
    assert "slow" not in s.pins  # freed at once: memory serves other jobs
    assert usable_blocks(s) - free_blocks(s) == used_before
    first_turn(s, "unknown")  # no parsable tool call: Continuum's CDF TTL
    assert s.pins.get("unknown").speed == "uncertain"
    snap = s.continuum_metrics.snapshot()
    assert snap["decisions"] == {"fast/rules": 1, "slow/rules": 1, "uncertain/fallback": 1}


def test_context_serve_learns_tool_times_from_arrivals():
    s = make_scheduler("context_serve", num_blocks=96)
    prompt, r1 = first_turn(s, "a", extra={"tool_command": "ls"})
    s.clock.advance(0.05)
    r2 = make_request(next_turn_prompt(prompt, r1), job_id="a", is_last_step=True)
    s.add_request(r2)
    run_until_finished(s, [r2])
    snap = s.continuum_metrics.snapshot()
    assert snap["tool_seconds"]["count"] == 1 and snap["prediction_error_seconds"]["count"] == 1
    # Exactly the time that passed (plus the harness's arrival spacing).
    assert snap["tool_seconds"]["sum"] == pytest.approx(0.05 + ARRIVAL_SPACING_S, abs=1e-6)
    assert snap["fast_pins"]["in_time"] == 1
    assert_all_blocks_free(s)


def _shared_prefix_turn(scheduler, job: str, system: list[int], own: int, extra: list[int] = ()):
    prompt = system + prompt_of(600 + int(job[3:]), own) + list(extra)
    request = make_request(prompt, max_tokens=4, job_id=job, is_last_step=False)
    scheduler.add_request(request)
    run_until_finished(scheduler, [request])
    return prompt, request


def test_shared_system_prompt_counts_once_under_the_pin_cap():
    # Six jobs of one harness share a 160-token (10-block) system prompt and
    # add 2 blocks each. Counted per pin (12 blocks each), a 20-block cap
    # would admit one whole pin; counted once, it admits 10 + 5 x 2.
    s = make_scheduler(num_blocks=41, continuum={"max_pinned_fraction": 0.5, "default_ttl_s": 60})
    assert s.max_pinned_blocks == 20
    system = prompt_of(500, 160)
    turns = {}
    for i in range(5):
        turns[f"job{i}"] = _shared_prefix_turn(s, f"job{i}", system, own=40)
        assert s.pins.get(f"job{i}").num_blocks == 12  # (160 + 40 + 4 - 1) // 16, nothing trimmed
    assert len(s.pins) == 5 and s.pins.num_pinned_blocks == 10 + 5 * 2 == s.max_pinned_blocks
    snap = s.continuum_metrics.snapshot()
    assert snap["pinned_blocks"] == 20 and snap["pin_blocks_trimmed"] == 0
    assert snap["pins_released"]["cap"] == snap["pins_released"]["pressure"] == 0

    # A sixth job finds the cap reached: it keeps the shared prefix (free:
    # other pins hold it) and loses its own tail, nobody else's pin goes.
    _shared_prefix_turn(s, "job5", system, own=40)
    assert s.pins.get("job5").num_blocks == 10 and s.pins.num_pinned_blocks == 20
    assert s.continuum_metrics.snapshot()["pin_blocks_trimmed"] == 2

    # The oldest job's next turn needs 5 blocks of its own: the latest jobs'
    # pins make room (reason "cap", not "pressure"); the shared prefix stays.
    prompt, first = turns["job0"]
    r2 = make_request(next_turn_prompt(prompt, first, extra=44), max_tokens=4, job_id="job0", is_last_step=False)
    s.add_request(r2)
    run_until_finished(s, [r2])
    snap = s.continuum_metrics.snapshot()
    assert s.pins.get("job0").num_blocks == 15 and "job1" in s.pins and "job2" in s.pins
    assert "job5" not in s.pins and "job4" not in s.pins
    assert snap["pins_released"]["cap"] >= 2 and snap["pins_released"]["pressure"] == 0
    assert s.pins.num_pinned_blocks <= s.max_pinned_blocks
    assert snap["pinned_blocks"] == s.pins.num_pinned_blocks
    # A job whose pin went by the cap still finds the shared prefix cached.
    r5 = make_request(system + prompt_of(605, 40) + [5, 5], job_id="job5", is_last_step=True)
    s.add_request(r5)
    assert admitted_cached_tokens(step(s), r5) >= len(system)
    run_until_finished(s, [r5])
    s.clock.advance(61)
    step(s)
    assert_all_blocks_free(s)


def _agent_turns(s, job: str, gaps: list[float], tool_command: str = "ls -la"):
    """One agent job: a turn per gap, each followed by that much tool +
    client time on the scheduler's clock; the last turn ends the job.
    Returns the prefix-cache hit of every turn after the first."""
    prompt = prompt_of(job_seed(job), 100)
    hits = []
    for i, gap in enumerate([*gaps, None]):
        last = gap is None
        r = make_request(prompt, max_tokens=4, job_id=job, is_last_step=last,
                         extra=None if last else {"tool_command": tool_command})
        s.add_request(r)
        cached = admitted_cached_tokens(step(s), r)
        if i:
            hits.append(cached)
        run_until_finished(s, [r])
        if not last:
            s.clock.advance(gap)
            step(s)  # the engine runs in the gap: an expired pin goes now
            prompt = next_turn_prompt(prompt, r, extra=20)
    return hits


@pytest.mark.parametrize("policy", ["context_serve", "continuum"])
def test_fast_pins_outlive_a_client_that_takes_1_5_s_per_round_trip(policy):
    # The tool (`ls`) takes milliseconds; the agent around it (reply parsing,
    # litellm, docker exec, HTTP) takes 1.5 s before the next turn arrives.
    extra = {"continuum": {}} if policy == "continuum" else {}
    s = make_scheduler(policy, num_blocks=96, **extra)
    hits = _agent_turns(s, "agent", gaps=[1.5] * 6)
    assert all(h and h > 0 for h in hits), hits  # every next turn found its pin
    snap = s.continuum_metrics.snapshot()
    assert snap["pins_released"]["handoff"] == 6 and snap["pins_released"]["ttl"] == 0
    if policy == "context_serve":
        assert snap["fast_pins"]["in_time"] == 6 and snap["fast_pins"]["expired"] == 0
    assert_all_blocks_free(s)


def test_a_fast_pin_still_lapses_when_the_tool_really_takes_minutes():
    s = make_scheduler("context_serve", num_blocks=96)
    _agent_turns(s, "agent", gaps=[1.5] * 3)
    prompt, _ = first_turn(s, "stuck", extra={"tool_command": "ls"})
    ttl = s.pins.get("stuck").ttl_s
    assert 1.5 < ttl < 10.0  # covers a round trip, nowhere near minutes
    s.clock.advance(120.0)
    step(s)
    assert "stuck" not in s.pins
    assert s.continuum_metrics.snapshot()["fast_pins"]["expired"] == 1


def test_hinted_ttl_adds_the_jobs_measured_round_trip():
    s = make_scheduler(num_blocks=96)
    prompt = prompt_of(3, 100)
    ttls = []
    for _ in range(5):
        r = make_request(prompt, max_tokens=4, job_id="h", is_last_step=False,
                         extra={"expected_tool_seconds": 0.1, "tool_command": "ls"})
        s.add_request(r)
        run_until_finished(s, [r])
        ttls.append(s.pins.get("h").ttl_s)
        s.clock.advance(0.7)  # 0.1 s tool + 0.6 s client
        prompt = next_turn_prompt(prompt, r, extra=20)
    # Cold start: the default round trip (2.5 s); measured: 0.6 s (+ arrival spacing).
    assert ttls[0] == pytest.approx((0.1 + s.continuum_config.round_trip_default_s) * 1.2 + 0.05)
    assert ttls[-1] == pytest.approx((0.1 + 0.6 + ARRIVAL_SPACING_S) * 1.2 + 0.05, abs=1e-3)


def test_a_second_client_naming_a_job_id_cannot_take_or_end_its_pin():
    s = make_scheduler(num_blocks=96, continuum={"default_ttl_s": 60})
    prompt, r1 = first_turn(s, "victim")
    pinned = s.pins.get("victim")
    # Another client's requests under the same id, with a context of its own:
    # a non-final turn, a last step and an abort. None of them touches the pin.
    other = make_request(prompt_of(77, 100), max_tokens=4, job_id="victim", is_last_step=False)
    s.add_request(other)
    assert s.order.queue_key(other)[0] == 2  # no pinned-job tier on someone else's pin
    run_until_finished(s, [other])
    last = make_request(prompt_of(78, 100), max_tokens=4, job_id="victim", is_last_step=True)
    s.add_request(last)
    run_until_finished(s, [last])
    aborted = make_request(prompt_of(79, 100), max_tokens=50, job_id="victim", is_last_step=False)
    s.add_request(aborted)
    step(s)
    s.finish_requests(aborted.request_id, RequestStatus.FINISHED_ABORTED)
    assert s.pins.get("victim") is pinned
    snap = s.continuum_metrics.snapshot()
    assert snap["pins_released"]["handoff"] == snap["pins_released"]["last_step"] == 0
    # The owner's next turn still finds its context and takes the pin over.
    r2 = make_request(next_turn_prompt(prompt, r1), job_id="victim", is_last_step=True)
    s.add_request(r2)
    assert admitted_cached_tokens(step(s), r2) == pinned.num_blocks * BLOCK
    run_until_finished(s, [r2])
    assert s.continuum_metrics.snapshot()["pins_released"]["handoff"] == 1
    # The other client's non-final turn is a conversation of its own under
    # the id (conversations): its pin is its own, and lapses at its TTL.
    pinned_keys = [k for k in s.conversations.keys_of("victim") if k in s.pins]
    assert len(pinned_keys) == 1 and pinned_keys[0] != "victim"
    assert s.pins.get(pinned_keys[0]).request_id == other.request_id
    s.clock.advance(61)
    step(s)
    assert_all_blocks_free(s)


def test_pins_work_when_vllm_defers_block_frees():
    # GPU default with an offload connector: async scheduling + a KV-consumer
    # connector make vLLM defer block frees (an in-flight step may still
    # write them). A turn that stops while the next step is already
    # scheduled is pinned all the same; blocks leaving the pin before that
    # step is processed go through vLLM's deferred frees, never straight
    # back to the pool.
    from vllm.v1.outputs import ModelRunnerOutput

    s = make_scheduler(num_blocks=64, async_scheduling=True, continuum={"default_ttl_s": 5.0})
    s.defer_block_free = True
    r = make_request(prompt_of(5, 100), max_tokens=8, job_id="a", is_last_step=False)
    r.sampling_params.ignore_eos = False
    r.sampling_params.stop_token_ids = [99]
    s.add_request(r)

    def output(out, token):
        ids = list(out.num_scheduled_tokens)
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={i: n for n, i in enumerate(ids)},
                                 sampled_token_ids=[[token] for _ in ids])

    out1 = s.schedule()  # prefill
    out2 = s.schedule()  # the next step is scheduled before step 1's output is known
    assert r.last_sched_seq == 2 and s.processed_step_seq == 0
    s.update_from_output(out1, output(out1, 99))  # step 1 sampled the stop token
    assert r.is_finished() and "a" in s.pins  # pinned although its free is deferred
    assert s.pins.get("a").fence == 2
    free_before = free_blocks(s)
    s.clock.advance(6.0)  # the pin lapses before step 2 is processed
    s.pins.release_expired()
    assert "a" not in s.pins and free_blocks(s) == free_before  # deferred, not freed
    s.update_from_output(out2, output(out2, 7))  # step 2 done: vLLM drains its deferred frees
    step(s)
    assert_all_blocks_free(s)


def test_a_paused_engine_does_not_spin_on_a_pin_kept_for_a_waiting_turn():
    from vllm.v1.core.sched.interface import PauseState

    s = make_scheduler(num_blocks=64, continuum={"default_ttl_s": 5.0})
    prompt, r1 = first_turn(s, "a")
    s.set_pause_state(PauseState.PAUSED_ALL)  # e.g. pause_generation(clear_cache=False)
    r2 = make_request(next_turn_prompt(prompt, r1), job_id="a", is_last_step=True)
    s.add_request(r2)
    s.clock.advance(6.0)  # the pin lapses while its turn waits
    step(s)
    assert "a" in s.pins  # kept for the waiting turn
    assert not s.has_requests()  # nothing to do while paused: the engine can block
    s.set_pause_state(PauseState.UNPAUSED)
    assert s.has_requests()
    assert admitted_cached_tokens(step(s), r2) > 0
    run_until_finished(s, [r2])
    assert_all_blocks_free(s)


def test_soft_pins_wrap_allocations_only_when_one_could_fail():
    # Plenty of room: vLLM's own allocate_slots runs unwrapped (hot path).
    roomy = make_scheduler(num_blocks=2000, max_model_len=512, continuum={"default_ttl_s": 60})
    first_turn(roomy, "a")
    step(roomy)
    assert "allocate_slots" not in vars(roomy.kv_cache_manager) and len(roomy.pins) == 1
    assert not roomy.soft_pins.armed
    # A pool the next step could exhaust: the wrapper is armed, and a waiting
    # request's allocation releases a pin instead of failing.
    tight = make_scheduler(num_blocks=40, max_num_seqs=4, continuum={"max_pinned_fraction": 1.0, "default_ttl_s": 60})
    for job in ("a", "b", "c"):
        first_turn(tight, job, length=150)
    big = make_request(prompt_of(900, 300), max_tokens=4)
    tight.add_request(big)
    out = step(tight)
    assert "allocate_slots" in vars(tight.kv_cache_manager) and tight.soft_pins.armed
    assert admitted_cached_tokens(out, big) == 0 and tight.continuum_metrics.snapshot()["pins_released"]["pressure"] >= 1


def test_vllm_kv_hints_tag_a_request_the_engine_received_without_other_metadata():
    """An engine-level caller (LLMEngine/AsyncLLM ``kv_hints=``) tags a job
    through vLLM's typed KV hints alone: its turn is pinned under that job
    and handed over to the next turn; a last step in the hints ends it."""
    from vllm.v1.kv_hints.protocol import KvHintAction, KvHintsEnvelope

    def hinted(prompt: list[int], last: bool):
        r = make_request(prompt)
        r.kv_hints = KvHintsEnvelope(protocol_version="1", message_id=r.request_id, actions=[
            KvHintAction(action_id="0", action_type="vllm_continuum.job", action_version="1",
                         payload={"job_id": "hinted", "is_last_step": last})])
        return r

    s = make_scheduler(num_blocks=64)
    prompt = list(range(1, 100))
    r1 = hinted(prompt, False)
    s.add_request(r1)
    run_until_finished(s, [r1])
    assert "hinted" in s.pins
    r2 = hinted(next_turn_prompt(prompt, r1), True)
    s.add_request(r2)
    step(s)
    assert s.continuum_metrics.snapshot()["pins_released"]["handoff"] == 1
    run_until_finished(s, [r2])
    assert "hinted" not in s.pins
    assert_all_blocks_free(s)
