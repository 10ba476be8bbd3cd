"""Unchanged agents on a real vLLM Scheduler: no job id, native tool calls.

The fake model answers with scripted replies (tokens of the tiny test
model's tokenizer), so the scheduler decodes and parses real text: a
fenced command, a Hermes ``<tool_call>``, a finish action, plain prose.
Time is the scheduler's manual clock.
"""

from __future__ import annotations

import random

import pytest
from harness import (
    admitted_cached_tokens,
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
from vllm.v1.request import RequestStatus

from vllm_continuum_plugin.implicit_jobs import MIN_ANSWERS, is_implicit_chat, is_implicit_job

BLOCK = 16
EOS = 2
TEMPLATE = [3, 1]  # what a chat template adds after a reply before the tool output

LS = tiny_tokens("```bash\nls -la\n```") + [EOS]
HERMES_CAT = tiny_tokens('<tool_call>\n{"name": "bash", "arguments": {"command": "cat main.py"}}\n</tool_call>') + [EOS]
FINISH = tiny_tokens("```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```") + [EOS]
PROSE = tiny_tokens("Done.") + [EOS]
SYSTEM = prompt_of(7, 100)  # every job of one harness shares it (6 full blocks)


def assert_all_blocks_free(s) -> None:
    assert not s.running and len(s.pins) == 0
    assert free_blocks(s) == usable_blocks(s)


def agent_turn(s, prompt: list[int], reply: list[int], **kwargs):
    """One untagged turn: ``prompt`` answered with ``reply``."""
    r = scripted(make_request(prompt, max_tokens=len(reply), **kwargs), reply)
    s.add_request(r)
    run_until_finished(s, [r])
    return r


def continuation(prompt: list[int], reply: list[int], tool_output: list[int]) -> list[int]:
    return prompt + reply + TEMPLATE + tool_output


def implicit_job_of(s, request) -> str | None:
    job_id = getattr(request, "_continuum_meta").job_id
    return job_id if is_implicit_job(job_id) else None


def test_an_untagged_agent_turn_is_pinned_and_its_next_turn_takes_the_pin_over():
    s = make_scheduler(num_blocks=64, max_num_seqs=2)
    first_prompt = SYSTEM + prompt_of(1, 30)
    r1 = agent_turn(s, first_prompt, LS)
    job = implicit_job_of(s, r1)
    assert job is not None and job in s.pins
    pinned = s.pins.get(job).num_blocks
    # Other traffic floods the pool meanwhile; the pin survives it.
    others = [make_request(prompt_of(100 + i, 150), max_tokens=4) for i in range(6)]
    for r in others:
        s.add_request(r)
    run_until_finished(s, others)
    s.clock.advance(0.5)  # the tool runs
    r2 = scripted(make_request(continuation(first_prompt, LS, prompt_of(2, 20)), max_tokens=len(HERMES_CAT)), HERMES_CAT)
    s.add_request(r2)
    assert implicit_job_of(s, r2) == job  # recognised without any metadata
    cached = admitted_cached_tokens(step(s), r2)
    assert cached == pinned * BLOCK
    snap = s.continuum_metrics.snapshot()
    assert snap["pins_released"]["handoff"] == 1 and snap["implicit_turns"] == {"started": 1, "continued": 1}
    assert snap["tool_seconds"]["count"] == 1 and snap["tool_seconds"]["sum"] == pytest.approx(0.5, abs=0.01)
    run_until_finished(s, [r2])
    # The Hermes tool call was parsed and the job goes on.
    assert s.pins.get(job) is not None and s.pins.get(job).tool_key == "cat"
    s.clock.advance(60.0)
    step(s)
    assert_all_blocks_free(s)


def test_chat_traffic_without_a_tool_call_is_never_pinned():
    s = make_scheduler(num_blocks=64)
    r = agent_turn(s, SYSTEM + prompt_of(1, 30), PROSE)
    assert implicit_job_of(s, r) is None and len(s.pins) == 0
    assert s.continuum_metrics.snapshot()["pins_created"] == 0
    assert_all_blocks_free(s)


def test_jobs_sharing_a_system_prompt_and_task_each_get_their_own_pin():
    s = make_scheduler(num_blocks=96, max_num_seqs=2)
    task = SYSTEM + prompt_of(1, 30)  # the same system prompt and task text
    r_a = agent_turn(s, task, LS)
    r_b = agent_turn(s, task, HERMES_CAT)
    job_a, job_b = implicit_job_of(s, r_a), implicit_job_of(s, r_b)
    assert job_a and job_b and job_a != job_b and len(s.pins) == 2
    # B's next turn first: it takes B's pin, never A's.
    r_b2 = make_request(continuation(task, HERMES_CAT, prompt_of(3, 10)), max_tokens=len(PROSE))
    s.add_request(scripted(r_b2, PROSE))
    assert implicit_job_of(s, r_b2) == job_b
    run_until_finished(s, [r_b2])
    assert job_a in s.pins and job_b not in s.pins  # B answered: its job ended
    r_a2 = make_request(continuation(task, LS, prompt_of(4, 10)), max_tokens=len(PROSE))
    s.add_request(scripted(r_a2, PROSE))
    assert implicit_job_of(s, r_a2) == job_a
    run_until_finished(s, [r_a2])
    snap = s.continuum_metrics.snapshot()
    assert snap["pins_released"]["handoff"] == 2 and snap["jobs_ended"]["final_answer"] == 2
    assert_all_blocks_free(s)


def test_a_finish_action_ends_the_job_and_frees_its_blocks_at_once():
    s = make_scheduler(num_blocks=64)
    prompt = SYSTEM + prompt_of(1, 30)
    r1 = agent_turn(s, prompt, LS)
    job = implicit_job_of(s, r1)
    r2 = agent_turn(s, continuation(prompt, LS, prompt_of(2, 10)), FINISH)
    assert implicit_job_of(s, r2) == job
    assert len(s.pins) == 0 and len(s.jobs) == 0 and len(s.implicit_jobs) == 0
    assert s.continuum_metrics.snapshot()["jobs_ended"]["finish_action"] == 1
    assert_all_blocks_free(s)


def test_a_tagged_job_ends_on_a_finish_action_without_the_flag():
    s = make_scheduler(num_blocks=64)
    prompt = SYSTEM + prompt_of(1, 30)
    agent_turn(s, prompt, LS, job_id="tagged", is_last_step=False)
    assert "tagged" in s.pins
    agent_turn(s, continuation(prompt, LS, prompt_of(2, 10)), FINISH, job_id="tagged", is_last_step=False)
    assert len(s.pins) == 0 and len(s.jobs) == 0
    assert s.continuum_metrics.snapshot()["jobs_ended"]["finish_action"] == 1
    assert_all_blocks_free(s)


def test_explicit_metadata_wins_over_an_implicit_match():
    s = make_scheduler(num_blocks=64)
    prompt = SYSTEM + prompt_of(1, 30)
    r1 = agent_turn(s, prompt, LS)
    job = implicit_job_of(s, r1)
    r2 = make_request(continuation(prompt, LS, prompt_of(2, 10)), max_tokens=len(LS), job_id="client-job", is_last_step=False)
    s.add_request(scripted(r2, LS))
    assert getattr(r2, "_continuum_meta").job_id == "client-job"
    run_until_finished(s, [r2])
    assert job in s.pins and "client-job" in s.pins  # neither took the other's pin


def test_a_branched_or_resent_conversation_gets_stock_behaviour_and_releases_no_pin():
    s = make_scheduler(num_blocks=96, max_num_seqs=4)
    prompt = SYSTEM + prompt_of(1, 30)
    r1 = agent_turn(s, prompt, LS)
    job = implicit_job_of(s, r1)
    nxt = continuation(prompt, LS, prompt_of(2, 10))
    branch_a = scripted(make_request(nxt, max_tokens=len(LS)), LS)
    branch_b = scripted(make_request(nxt + [5], max_tokens=len(LS)), LS)
    resend = scripted(make_request(prompt, max_tokens=len(LS)), LS)  # the same prompt again
    edited = scripted(make_request(prompt[:-5] + [9, 9, 9, 9, 9], max_tokens=len(LS)), LS)
    for r in (branch_a, branch_b, resend, edited):
        s.add_request(r)
    assert implicit_job_of(s, branch_a) == job
    assert [implicit_job_of(s, r) for r in (branch_b, resend, edited)] == [None, None, None]
    run_until_finished(s, [branch_a, branch_b, resend, edited])
    snap = s.continuum_metrics.snapshot()
    assert snap["pins_released"]["handoff"] == 1 and snap["pins_released"]["pressure"] == 0
    # Each untagged turn that called a tool is a job of its own now.
    assert snap["implicit_turns"] == {"started": 4, "continued": 1}
    s.clock.advance(60.0)
    step(s)
    assert_all_blocks_free(s)


def test_implicit_jobs_can_be_switched_off():
    s = make_scheduler(num_blocks=64, continuum={"implicit_jobs": False})
    assert s.implicit_jobs is None
    r = agent_turn(s, SYSTEM + prompt_of(1, 30), LS)
    assert getattr(r, "_continuum_meta").job_id is None and len(s.pins) == 0
    assert_all_blocks_free(s)


def test_finish_actions_are_configurable():
    s = make_scheduler(num_blocks=64, continuum={"finish_actions": ["ls -la"]})
    r = agent_turn(s, SYSTEM + prompt_of(1, 30), LS)  # `ls -la` ends a job now
    assert implicit_job_of(s, r) is None and len(s.pins) == 0


def test_an_aborted_implicit_turn_releases_only_its_own_jobs_pin():
    s = make_scheduler(num_blocks=96, max_num_seqs=4)
    a_prompt, b_prompt = SYSTEM + prompt_of(1, 30), SYSTEM + prompt_of(2, 30)
    job_a = implicit_job_of(s, agent_turn(s, a_prompt, LS))
    job_b = implicit_job_of(s, agent_turn(s, b_prompt, LS))
    r = scripted(make_request(continuation(a_prompt, LS, prompt_of(3, 10)), max_tokens=len(LS)), LS)
    s.add_request(r)
    s.finish_requests(r.request_id, RequestStatus.FINISHED_ABORTED)
    assert job_a not in s.pins and job_b in s.pins
    assert s.continuum_metrics.snapshot()["pins_released"]["abort"] == 1


def test_random_untagged_traffic_leaves_every_block_free():
    rng = random.Random(1)
    s = make_scheduler(num_blocks=160, max_num_seqs=6)
    conversations: list[list[int]] = [SYSTEM + prompt_of(200 + i, rng.randrange(5, 60)) for i in range(8)]
    live = []
    for _ in range(80):
        i = rng.randrange(len(conversations))
        reply = rng.choice([LS, HERMES_CAT, PROSE, FINISH])
        r = scripted(make_request(conversations[i], max_tokens=len(reply)), reply)
        s.add_request(r)
        live.append(r)
        if rng.random() < 0.1:
            s.finish_requests(r.request_id, RequestStatus.FINISHED_ABORTED)
        for _ in range(rng.randrange(0, 3)):
            step(s)
            s.clock.advance(rng.choice((0.0, 0.5, 3.0)))
        if reply in (PROSE, FINISH) or len(conversations[i]) > 600:
            conversations[i] = SYSTEM + prompt_of(300 + rng.randrange(100), rng.randrange(5, 60))
        else:
            conversations[i] = continuation(conversations[i], reply, prompt_of(rng.randrange(900), rng.randrange(1, 40)))
    run_until_finished(s, live, max_steps=5000)
    s.clock.advance(120.0)
    step(s)
    assert_all_blocks_free(s)
    assert s.implicit_jobs.num_blocks <= s.continuum_config.implicit_max_blocks


def embeds_request(num_tokens: int, seed: int, max_tokens: int):
    """An untagged request whose prompt is embeddings only (``--enable-prompt-embeds``):
    vLLM keeps no prompt token ids for it."""
    import torch
    from harness import _init_hashing
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    _init_hashing()
    embeds = torch.randn(num_tokens, 64, generator=torch.Generator().manual_seed(seed))
    return Request(
        request_id=f"embeds-{seed}-{random.random()}",
        prompt_token_ids=None,
        prompt_embeds=embeds,
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None,
        arrival_time=0.0,
        block_hasher=get_request_block_hasher(BLOCK, sha256),
    )


def test_prompt_embeds_requests_calling_tools_are_served_as_stock_and_never_crash_the_engine():
    # Finding: the second of two identical untagged prompt_embeds requests
    # killed the EngineCore (implicit matching sliced prompt_token_ids, None).
    s = make_scheduler(num_blocks=64)
    for _ in range(2):
        r = scripted(embeds_request(96, seed=1, max_tokens=len(LS)), LS)
        s.add_request(r)
        run_until_finished(s, [r])
        assert implicit_job_of(s, r) is None
    assert len(s.pins) == 0
    assert s.continuum_metrics.snapshot()["implicit_turns"] == {"started": 0, "continued": 0}
    assert_all_blocks_free(s)


# -- untagged chats: continued answers ---------------------------------------
def hash_block_rebuild(prompt: list[int], fresh: list[int]) -> list[int]:
    """The next prompt as AIPerf rebuilds it from hash blocks: the previous
    prompt's full blocks, then fresh content (its partial tail block and the
    reply are not re-sent)."""
    return prompt[: len(prompt) // BLOCK * BLOCK] + fresh


def flood(s) -> list:
    """Six other one-turn conversations, run to the end: they fill the pool."""
    others = [make_request(prompt_of(100 + i, 150), max_tokens=4) for i in range(6)]
    for r in others:
        s.add_request(r)
    run_until_finished(s, others)
    return others


def follow_up(s, prompt: list[int], fresh: list[int], after_s: float):
    """The user's next message ``after_s`` later, rebuilt from ``prompt``'s
    hash blocks plus ``fresh``, answered in prose: the request, and the
    tokens it found cached when admitted."""
    s.clock.advance(after_s)
    r = scripted(make_request(hash_block_rebuild(prompt, fresh), max_tokens=len(PROSE)), PROSE)
    s.add_request(r)
    cached = admitted_cached_tokens(step(s), r)
    run_until_finished(s, [r])
    return r, cached


def test_an_untagged_answer_continued_by_prefix_becomes_a_chat_whose_context_is_kept():
    s = make_scheduler(num_blocks=64, max_num_seqs=2)
    p1 = SYSTEM + prompt_of(1, 30)
    r1 = agent_turn(s, p1, PROSE)
    assert implicit_job_of(s, r1) is None and len(s.pins) == 0  # one answer holds nothing
    p2 = hash_block_rebuild(p1, prompt_of(2, 40))
    r2 = agent_turn(s, p2, PROSE)
    job = implicit_job_of(s, r2)
    assert job is not None and is_implicit_chat(job)  # its second turn made it a chat
    assert job in s.pins  # a chat's answer is kept for its next turn
    pinned = s.pins.get(job).num_blocks
    flood(s)
    r3, cached = follow_up(s, p2, prompt_of(3, 20), after_s=2.0)  # the user reads, types
    assert implicit_job_of(s, r3) == job and cached == pinned * BLOCK
    snap = s.continuum_metrics.snapshot()
    assert snap["implicit_turns"] == {"started": 1, "continued": 2}
    assert snap["tool_seconds"]["count"] == 1  # the gap before r3 was measured
    s.clock.advance(3600.0)  # nobody comes back: the pin lapses
    step(s)
    assert_all_blocks_free(s)


def warm_up_answers(s, followed_up: bool) -> None:
    """``MIN_ANSWERS`` untagged answers of the default scope, each followed
    up once by a hash-block rebuild (two-turn chats) or never (one-shot
    requests); the pool is then left quiet until every pin lapsed."""
    for i in range(MIN_ANSWERS):
        prompt = prompt_of(3000 + i, 3 * BLOCK)
        agent_turn(s, prompt, PROSE)
        if followed_up:
            agent_turn(s, hash_block_rebuild(prompt, prompt_of(4000 + i, BLOCK)), PROSE)
    s.clock.advance(3600.0)
    step(s)


def test_where_answers_come_back_an_answer_is_kept_as_its_chats_first_turn():
    # A chat client or AIPerf's replay without a session header: the scope's
    # answers are followed up, so the first answer of a new conversation is
    # kept for its user's next message instead of aging out as stock (the
    # chat starts at its first answer, not at its second).
    s = make_scheduler(num_blocks=64, max_num_seqs=2)
    warm_up_answers(s, followed_up=True)
    assert s.implicit_jobs.answer_return_rate() == 1.0
    started = s.continuum_metrics.snapshot()["implicit_turns"]["started"]
    p1 = SYSTEM + prompt_of(1, 30)
    r1 = agent_turn(s, p1, PROSE)
    chat = implicit_job_of(s, r1)
    assert chat is not None and is_implicit_chat(chat) and chat in s.pins
    pinned = s.pins.get(chat).num_blocks
    assert pinned == len(p1 + PROSE) // BLOCK
    # Other conversations' first turns meanwhile (in this scope each answer
    # starts its chat too): they fill the pool, the pin survives them.
    others = flood(s)
    r2, cached = follow_up(s, p1, prompt_of(2, 20), after_s=1.0)  # the user reads, types
    assert implicit_job_of(s, r2) == chat and cached == len(p1) // BLOCK * BLOCK
    snap = s.continuum_metrics.snapshot()
    # Each chat started once, at its first answer.
    assert snap["implicit_turns"]["started"] == started + 1 + len(others)
    # Its follow-up counted as an answer's return; the others' none yet.
    answers = MIN_ANSWERS + 1 + len(others)
    assert s.implicit_jobs.answer_return_rate() == pytest.approx((MIN_ANSWERS + 1) / answers)
    s.clock.advance(3600.0)  # nobody comes back: the pin lapses
    step(s)
    assert_all_blocks_free(s)


def test_where_answers_are_not_followed_up_an_answer_holds_nothing():
    # One-shot traffic (a batch job): its answers are never continued, so a
    # new answer starts no chat and keeps nothing, however many were seen.
    s = make_scheduler(num_blocks=64, max_num_seqs=2)
    warm_up_answers(s, followed_up=False)
    assert s.implicit_jobs.answer_return_rate() == 0.0
    r = agent_turn(s, SYSTEM + prompt_of(1, 30), PROSE)
    assert implicit_job_of(s, r) is None and len(s.pins) == 0
    assert s.continuum_metrics.snapshot()["pins_created"] == 0
    assert_all_blocks_free(s)


def test_one_shot_untagged_requests_sharing_a_system_prompt_hold_nothing():
    s = make_scheduler(num_blocks=64, max_num_seqs=2)
    for i in range(8):  # a batch job: one request each, one system prompt
        r = agent_turn(s, SYSTEM + prompt_of(10 + i, 40), PROSE)
        assert implicit_job_of(s, r) is None
    snap = s.continuum_metrics.snapshot()
    assert snap["pins_created"] == 0 and snap["implicit_turns"] == {"started": 0, "continued": 0}
    assert_all_blocks_free(s)


def test_a_stranger_sharing_only_the_system_prompt_continues_no_chat():
    s = make_scheduler(num_blocks=96, max_num_seqs=2)
    agent_turn(s, SYSTEM + prompt_of(1, 30), PROSE)
    agent_turn(s, SYSTEM + prompt_of(2, 30), PROSE)
    r = agent_turn(s, SYSTEM + prompt_of(3, 60), PROSE)  # longer, same system prompt
    assert implicit_job_of(s, r) is None and len(s.pins) == 0
    assert_all_blocks_free(s)


def test_a_chat_answer_after_a_tool_call_is_followed_up_by_prefix():
    # A chat that called a tool, then answered: the task ended, the user's
    # next message still continues the chat (its state and rank stay).
    s = make_scheduler(num_blocks=96, max_num_seqs=2)
    p1 = SYSTEM + prompt_of(1, 30)
    agent_turn(s, p1, PROSE)
    p2 = hash_block_rebuild(p1, prompt_of(2, 40))
    r2 = agent_turn(s, p2, LS)
    job = implicit_job_of(s, r2)
    assert is_implicit_chat(job) and s.pins.get(job).tool_key == "ls"
    p3 = continuation(p2, LS, prompt_of(3, 20))
    r3 = agent_turn(s, p3, PROSE)
    assert implicit_job_of(s, r3) == job and job not in s.pins  # answered: no pin, LRU as stock
    assert s.continuum_metrics.snapshot()["jobs_ended"]["final_answer"] == 1
    r4 = agent_turn(s, hash_block_rebuild(p3, prompt_of(4, 20)), PROSE)
    assert implicit_job_of(s, r4) == job
    s.clock.advance(3600.0)
    step(s)
    assert_all_blocks_free(s)


def test_a_follow_up_after_an_untagged_agents_final_answer_continues_its_job():
    # The agent's task ended at its answer; the user's next message
    # continues the context: the same job (its rank kept, never held), and
    # the answer's blocks aged as stock LRU, not first out.
    s = make_scheduler(num_blocks=96, max_num_seqs=2)
    p1 = SYSTEM + prompt_of(1, 30)
    r1 = agent_turn(s, p1, LS)
    agent = implicit_job_of(s, r1)
    p2 = continuation(p1, LS, prompt_of(2, 20))
    r2 = agent_turn(s, p2, PROSE)
    assert implicit_job_of(s, r2) == agent and agent not in s.pins
    assert s.continuum_metrics.snapshot()["jobs_ended"]["final_answer"] == 1
    p3 = continuation(p2, PROSE, prompt_of(3, 20))
    r3 = scripted(make_request(p3, max_tokens=len(PROSE)), PROSE)
    s.add_request(r3)
    assert implicit_job_of(s, r3) == agent
    assert admitted_cached_tokens(step(s), r3) == len(p2 + PROSE) // BLOCK * BLOCK
    run_until_finished(s, [r3])
    s.clock.advance(3600.0)
    step(s)
    assert_all_blocks_free(s)
