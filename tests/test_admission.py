"""The admission gate on a real vLLM Scheduler and block pool.

A new job's first turn waits while the contexts of the jobs under way fill
the pool, and so does an untagged request that continues nothing; a job's
later turns and an untagged request's continuation never wait; a
held turn passes when it is overdue, when the jobs under way go quiet or
end, and whenever nothing runs. Time is the scheduler's manual clock.
"""

from __future__ import annotations

import numpy as np
import pytest

from vllm.v1.request import RequestStatus

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
from scheduler_turns import job_seed
from test_scheduler import BLOCK, assert_all_blocks_free, first_turn, next_turn_prompt
from vllm_continuum_plugin.admission import MIN_RETURN_SAMPLES, RETURN_MARGIN, return_horizon
from vllm_continuum_plugin.implicit_jobs import MIN_ANSWERS

# 64 blocks of 16 tokens: 63 usable. Job "a" leaves a 40-block context; a new
# job with a 30-block prompt does not fit beside it.
POOL = 64
A_TOKENS = 40 * BLOCK - 8
NEW_TOKENS = 30 * BLOCK


def _gated(continuum=None):
    """Job "a" in a tool gap whose pin has lapsed (TTL 1 s, 1.5 s passed):
    its context is only in vLLM's prefix cache, where any allocation may
    evict it. Pins themselves already keep a newer job's first turn out
    (soft pins: a waiting request takes only later jobs' pins); the gate
    covers the context no pin holds."""
    settings = {"default_ttl_s": 1.0, **(continuum or {})}
    s = make_scheduler(num_blocks=POOL, max_num_seqs=4, continuum=settings)
    prompt, r1 = first_turn(s, "a", length=A_TOKENS)
    s.clock.advance(1.5)
    step(s)
    assert "a" not in s.pins
    # Chat traffic keeps the engine busy (never held: no job id).
    chat = make_request(prompt_of(500, 2 * BLOCK), max_tokens=200)
    s.add_request(chat)
    step(s)
    newcomer = make_request(prompt_of(600, NEW_TOKENS), max_tokens=4, job_id="b", is_last_step=True)
    s.add_request(newcomer)
    return s, prompt, r1, chat, newcomer


def _scheduled(s, request) -> bool:
    return request.num_computed_tokens > 0


def _drain(s, *requests) -> None:
    """Run ``requests`` to the end, let every pin lapse: all blocks free."""
    run_until_finished(s, list(requests))
    s.clock.advance(3600.0)
    step(s)
    assert_all_blocks_free(s)


def test_a_new_job_waits_while_the_job_under_way_fills_the_pool_and_its_next_turn_hits():
    s, prompt, r1, chat, newcomer = _gated()
    for _ in range(5):
        step(s)
    assert not _scheduled(s, newcomer) and newcomer in s.waiting
    assert s.admission.held_total >= 5
    assert s.continuum_metrics.snapshot()["admission_held"] == 1  # /metrics: admission_held_requests
    # Job "a" comes back from its tool: its turn is never held and finds its
    # whole context still cached.
    r2 = make_request(next_turn_prompt(prompt, r1), max_tokens=4, job_id="a", is_last_step=True)
    s.add_request(r2)
    output = step(s)
    new = {n.req_id: n.num_computed_tokens for n in output.scheduled_new_reqs}
    assert new[r2.request_id] == (A_TOKENS + 4 - 1) // BLOCK * BLOCK
    run_until_finished(s, [r2])
    # Job "a" ended: the newcomer passes.
    run_until_finished(s, [newcomer, chat])
    assert_all_blocks_free(s)


@pytest.mark.parametrize(
    ("settings", "wait_s"),
    [
        ({"admission_max_wait_s": 30.0}, 30.0),  # the held turn is overdue (its own setting)
        ({"max_ttl_s": 10.0}, 10.5),  # job "a" quiet longer than any TTL stops counting
    ],
    ids=["overdue", "quiet-job"],
)
def test_a_held_first_turn_passes_once_overdue_or_when_the_job_under_way_goes_quiet(settings, wait_s):
    s, _, _, chat, newcomer = _gated(settings)
    step(s)
    assert not _scheduled(s, newcomer)
    s.clock.advance(wait_s)
    step(s)
    assert _scheduled(s, newcomer)
    _drain(s, newcomer, chat)


def _learn_tool_less_returns(s, gap_s: float, turns: int) -> None:
    """Job "w" comes back ``gap_s`` after each of ``turns`` replies that call
    no tool (all AIPerf's replay ever sends), then ends: the scope has
    measured that many gaps after tool-less replies."""
    prompt = prompt_of(job_seed("w"), 2 * BLOCK)
    for i in range(turns + 1):
        request = make_request(prompt, max_tokens=2, job_id="w", is_last_step=i == turns)
        s.add_request(request)
        run_until_finished(s, [request])
        prompt = next_turn_prompt(prompt, request, extra=2)
        s.clock.advance(gap_s)


def _a_after_tool_less_returns(gap_s: float, max_num_seqs: int, hint: dict | None = None):
    """A scheduler whose scope has measured ``MIN_RETURN_SAMPLES`` returns
    ``gap_s`` after tool-less replies (pins: a fixed 2.2 s TTL), all blocks
    free again; then job "a"'s first turn (``hint``: its tool hint)
    finished, leaving a ``A_TOKENS`` context. Returns the scheduler, a's
    prompt and its request."""
    s = make_scheduler(num_blocks=POOL, max_num_seqs=max_num_seqs,
                       continuum={"ttl_policy": "fixed", "fixed_ttl_s": 2.2, "max_ttl_s": 60.0})
    _learn_tool_less_returns(s, gap_s, MIN_RETURN_SAMPLES)
    s.clock.advance(60.0)
    step(s)
    assert_all_blocks_free(s)
    prompt, r1 = first_turn(s, "a", length=A_TOKENS, extra=hint or {})
    return s, prompt, r1


@pytest.mark.parametrize(
    ("hint", "counts_after_horizon"),
    [({}, False), ({"tool_name": "pytest"}, True)],
    ids=["tool-less-reply", "tool-call"],
)
def test_a_job_quiet_past_the_gaps_after_which_tool_less_replies_came_back_stops_counting(hint, counts_after_horizon):
    """A session whose last reply called no tool may be over (AIPerf never
    says so): once the job is quiet ``RETURN_MARGIN`` times longer than the
    scope's tool-less jobs ever took to come back, the newcomer it held
    passes, long before ``max_ttl_s``; after a tool call the job keeps
    counting (its tool runs)."""
    gap_s = 2.0
    s, prompt, r1 = _a_after_tool_less_returns(gap_s, max_num_seqs=4, hint=hint)
    chat = make_request(prompt_of(500, 2 * BLOCK), max_tokens=400)  # keeps the engine busy
    s.add_request(chat)
    step(s)
    newcomer = make_request(prompt_of(600, NEW_TOKENS), max_tokens=4, job_id="b", is_last_step=True)
    s.add_request(newcomer)
    s.clock.advance(RETURN_MARGIN * gap_s - 0.1)  # a's pin lapsed; a returning job may still come
    step(s)
    assert not _scheduled(s, newcomer)
    s.clock.advance(0.2)  # past RETURN_MARGIN times the longest gap seen
    step(s)
    assert _scheduled(s, newcomer) is not counts_after_horizon
    s.clock.advance(60.0)  # past max_ttl_s: every job quiet that long stops counting
    step(s)
    assert _scheduled(s, newcomer)
    _drain(s, newcomer, chat)


def test_a_job_whose_next_turn_waits_in_the_queue_keeps_counting_past_its_quiet_horizon():
    """Job "a" answered without a tool call and came back at once, but its
    turn waits in the queue (the engine is full): however long it waits,
    the job is under way, and the newcomer stays held. Once that turn is
    aborted the job is quiet again and its horizon applies. (Found live: at
    load AIPerf's turns queue for longer than the ~6 s after which its
    sessions come back, and the gate admitted newcomers over them.)"""
    gap_s = 2.0
    s, prompt, r1 = _a_after_tool_less_returns(gap_s, max_num_seqs=2)
    # Two chats fill both of the engine's sequence slots (never held: no job id).
    chats = [make_request(prompt_of(500 + i, 2 * BLOCK), max_tokens=400) for i in range(2)]
    for chat in chats:
        s.add_request(chat)
    step(s)
    newcomer = make_request(prompt_of(600, NEW_TOKENS), max_tokens=4, job_id="b", is_last_step=True)
    s.add_request(newcomer)
    s.clock.advance(0.5)
    r2 = make_request(next_turn_prompt(prompt, r1), max_tokens=4, job_id="a", is_last_step=True)
    s.add_request(r2)
    step(s)
    assert not _scheduled(s, r2) and not _scheduled(s, newcomer)
    held = s.admission.held_total
    s.clock.advance(RETURN_MARGIN * gap_s + 1.0)  # a's reply is past the horizon; its turn still waits
    step(s)
    assert not _scheduled(s, r2)
    assert s.admission.held_total == held + 1  # the newcomer is still held: "a" counts
    assert s.admission.demand_blocks(s.clock.time()) >= A_TOKENS // BLOCK
    s.finish_requests([r2.request_id], RequestStatus.FINISHED_ABORTED)
    step(s)
    assert s.admission.held_total == held + 1  # "a" quiet past its horizon: the newcomer is not held
    _drain(s, newcomer, *chats)


def test_return_horizon_needs_enough_gaps_and_never_exceeds_the_gates_own():
    assert return_horizon(None, 60.0) == 60.0
    assert return_horizon(np.full(MIN_RETURN_SAMPLES - 1, 2.0), 60.0) == 60.0
    gaps = np.sort(np.concatenate([np.full(99, 2.0), [10.0]]))
    assert return_horizon(gaps, 60.0) == pytest.approx(RETURN_MARGIN * 10.0)  # the p99 is the longest of 100
    assert return_horizon(gaps * 10, 60.0) == 60.0


def test_an_idle_engine_admits_the_held_turn():
    s = make_scheduler(num_blocks=POOL, max_num_seqs=4)
    first_turn(s, "a", length=A_TOKENS)
    newcomer = make_request(prompt_of(600, NEW_TOKENS), max_tokens=4, job_id="b", is_last_step=True)
    s.add_request(newcomer)
    step(s)  # nothing runs: the gate must not idle the engine
    assert _scheduled(s, newcomer)
    _drain(s, newcomer)


def test_without_the_gate_the_newcomer_evicts_the_job_under_way():
    """What the gate prevents: admitted at once, the new job's prompt
    evicts part of job "a"'s cached context, which its next turn rebuilds."""
    s, prompt, r1, chat, newcomer = _gated({"admission": False})
    assert s.admission is None
    step(s)
    assert _scheduled(s, newcomer)
    run_until_finished(s, [newcomer])
    r2 = make_request(next_turn_prompt(prompt, r1), max_tokens=4, job_id="a", is_last_step=True)
    s.add_request(r2)
    output = step(s)
    new = {n.req_id: n.num_computed_tokens for n in output.scheduled_new_reqs}
    # vLLM evicts a freed request's tail blocks first: the prefix survives,
    # the rest is rebuilt (the gated run above hits every block).
    assert new[r2.request_id] <= (A_TOKENS + 4 - 1) // BLOCK * BLOCK - 8 * BLOCK
    run_until_finished(s, [r2, chat])
    assert free_blocks(s) == usable_blocks(s)


def test_an_aborted_held_turn_leaves_no_trace():
    s, _, _, chat, newcomer = _gated()
    step(s)
    s.finish_requests([newcomer.request_id], RequestStatus.FINISHED_ABORTED)
    step(s)
    assert newcomer.request_id not in s.requests and not s.admission._new
    _drain(s, chat)


def _tiered(tier_blocks: int):
    """The pool of these tests under vLLM's native offloading
    (``--kv-offloading-size``: the ``OffloadingConnector``, whose scheduler
    side needs no GPU) with a host tier of ``tier_blocks`` blocks."""
    from vllm.config import KVTransferConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    import torch

    page = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32).page_size_bytes
    transfer = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                kv_connector_extra_config={"cpu_bytes_to_use": tier_blocks * page})
    return make_scheduler(num_blocks=POOL, max_num_seqs=4, continuum={"default_ttl_s": 1.0}, kv_transfer=transfer)


def test_under_vllms_offloading_the_gate_bounds_what_the_pool_and_the_host_tier_keep():
    """Write-through offloading keeps a copy of every computed block in the
    host tier, so pool and tier keep max(pool, tier) blocks of context: with
    a 96-block tier, job "a" (40 blocks) and a 30-block newcomer fit (where
    the pool alone would hold the newcomer back, see above), a second one
    does not and waits; a context that left the GPU still counts, since the
    tier keeps it."""
    s = _tiered(96)
    assert s.admission is not None and s.admission.capacity_blocks == 96
    prompt, r1 = first_turn(s, "a", length=A_TOKENS)
    s.clock.advance(1.5)
    step(s)
    assert "a" not in s.pins  # its pin lapsed: the context is in the tier (and the prefix cache)
    chat = make_request(prompt_of(500, 2 * BLOCK), max_tokens=200)
    s.add_request(chat)
    step(s)
    b = make_request(prompt_of(600, NEW_TOKENS), max_tokens=4, job_id="b", is_last_step=False)
    c = make_request(prompt_of(700, NEW_TOKENS), max_tokens=4, job_id="c", is_last_step=True)
    s.add_request(b)
    s.add_request(c)
    for _ in range(3):
        step(s)
    assert _scheduled(s, b) and not _scheduled(s, c)
    # Job "a" comes back and ends: c fits beside b now.
    r2 = make_request(next_turn_prompt(prompt, r1), max_tokens=4, job_id="a", is_last_step=True)
    s.add_request(r2)
    run_until_finished(s, [r2])
    run_until_finished(s, [c, chat])
    assert _scheduled(s, c)
    _drain(s)


def test_a_connector_whose_tier_the_scheduler_cannot_size_leaves_the_gate_off():
    from vllm.config import KVTransferConfig

    transfer = KVTransferConfig(kv_connector="LMCacheConnectorV1", kv_role="kv_both")
    from vllm_continuum_plugin.tier_capacity import tier_capacity

    class _Config:
        kv_transfer_config = transfer

    assert tier_capacity(_Config(), None) is None


def test_the_plugins_connector_sizes_its_tier_as_the_connector_parses_it():
    """The plugin's connector stores what leaves the GPU (pool + tier), its
    size read with the connector's own parser (default included)."""
    from types import SimpleNamespace

    from vllm.config import KVTransferConfig
    from vllm_continuum_plugin.connectors.offload_settings import DEFAULT_CPU_BYTES
    from vllm_continuum_plugin.tier_capacity import tier_capacity

    s = make_scheduler(num_blocks=POOL)
    page = 2 * BLOCK * 4  # one layer, one head of size 1, float32: K and V
    for extra, size in (({"cpu_bytes": "8192"}, 8192), ({}, DEFAULT_CPU_BYTES)):
        config = SimpleNamespace(kv_transfer_config=KVTransferConfig(
            kv_connector="ContinuumOffloadConnector", kv_role="kv_both", kv_connector_extra_config=extra))
        tier = tier_capacity(config, s.kv_cache_config)
        assert tier is not None and tier.blocks == size // page and not tier.write_through
        assert tier.retained_blocks(63) == 63 + size // page
    bad = SimpleNamespace(kv_transfer_config=KVTransferConfig(
        kv_connector="ContinuumOffloadConnector", kv_role="kv_both",
        kv_connector_extra_config={"cpu_bytes": "lots"}))
    assert tier_capacity(bad, s.kv_cache_config) is None  # the connector refuses it at start-up


@pytest.mark.parametrize("untagged", [True, False], ids=["gated", "admission_untagged-off"])
def test_an_untagged_newcomer_waits_like_a_new_jobs_first_turn(untagged):
    # A chat or agent that sends no session id: whether it is a session shows
    # only at its next turn, and admitting it over job "a" costs a's context
    # all the same.
    s, _, _, chat, newcomer = _gated({"admission_untagged": untagged})
    stranger = make_request(prompt_of(700, NEW_TOKENS), max_tokens=4)  # no job id, no header
    s.add_request(stranger)
    for _ in range(3):
        step(s)
    assert _scheduled(s, stranger) is not untagged
    s.clock.advance(3600.0)  # overdue either way
    _drain(s, stranger, chat, newcomer)


def test_an_untagged_requests_next_turn_is_never_held():
    # The stranger's next turn continues it (an implicit chat): a job's later
    # turn, never held, however full the pool.
    s = make_scheduler(num_blocks=POOL, max_num_seqs=4, continuum={"default_ttl_s": 1.0})
    first = make_request(prompt_of(700, 20 * BLOCK), max_tokens=2)
    s.add_request(first)
    run_until_finished(s, [first])
    first_turn(s, "a", length=A_TOKENS)  # job "a" fills the pool now
    follow_up = make_request(prompt_of(700, 20 * BLOCK) + prompt_of(701, 12 * BLOCK), max_tokens=2)
    s.add_request(follow_up)
    step(s)
    assert _scheduled(s, follow_up)
    _drain(s, follow_up)


LS_CALL = tiny_tokens("```bash\nls -la\n```") + [2]  # a tool call the plugin parses
ANSWER = tiny_tokens("Done.") + [2]


@pytest.mark.parametrize(("reply", "counted"), [(LS_CALL, True), (ANSWER, False)], ids=["agent", "one-shot"])
def test_an_untagged_turn_counts_after_it_ends_only_as_the_job_it_started(reply, counted):
    # An untagged agent's first turn (a tool call: an implicit job) keeps
    # its context counted, so a newcomer waits; a one-shot answer (no
    # return measured in the scope) leaves the demand when it ends.
    s = make_scheduler(num_blocks=POOL, max_num_seqs=4, continuum={"default_ttl_s": 1.0})
    first = scripted(make_request(prompt_of(900, A_TOKENS), max_tokens=len(reply)), reply)
    s.add_request(first)
    run_until_finished(s, [first])
    s.clock.advance(1.5)  # any pin lapsed: the context is only in the prefix cache
    step(s)
    chat = make_request(prompt_of(500, 2 * BLOCK), max_tokens=200)  # keeps the engine busy
    s.add_request(chat)
    step(s)
    newcomer = make_request(prompt_of(600, NEW_TOKENS), max_tokens=4, job_id="b", is_last_step=True)
    s.add_request(newcomer)
    for _ in range(3):
        step(s)
    assert _scheduled(s, newcomer) is not counted
    s.clock.advance(3600.0)
    _drain(s, newcomer, chat)


def test_an_untagged_answer_counts_as_its_chat_where_the_scopes_answers_come_back():
    # MIN_ANSWERS untagged answers of the scope were each followed up (two-
    # turn chats): the next untagged answer counts as the chat it may start,
    # until the gate's horizon (no gap after a tool-less reply measured yet).
    s = make_scheduler(num_blocks=POOL, max_num_seqs=4,
                       continuum={"ttl_policy": "fixed", "fixed_ttl_s": 2.2, "max_ttl_s": 60.0})
    for i in range(MIN_ANSWERS):
        prompt = prompt_of(1000 + i, 2 * BLOCK)
        for turn in (prompt, prompt + prompt_of(2000 + i, BLOCK)):
            r = scripted(make_request(turn, max_tokens=len(ANSWER)), ANSWER)
            s.add_request(r)
            run_until_finished(s, [r])
    assert s.implicit_jobs.answer_return_rate() == 1.0
    s.clock.advance(60.0)
    step(s)
    first = scripted(make_request(prompt_of(900, A_TOKENS), max_tokens=len(ANSWER)), ANSWER)
    s.add_request(first)
    run_until_finished(s, [first])
    chat = make_request(prompt_of(500, 2 * BLOCK), max_tokens=400)
    s.add_request(chat)
    step(s)
    newcomer = make_request(prompt_of(600, NEW_TOKENS), max_tokens=4, job_id="b", is_last_step=True)
    s.add_request(newcomer)
    s.clock.advance(59.0)
    step(s)
    assert not _scheduled(s, newcomer)  # the answer may still be followed up
    s.clock.advance(1.5)
    step(s)
    assert _scheduled(s, newcomer)  # quiet past the horizon: it leaves the demand
    _drain(s, newcomer, chat)
