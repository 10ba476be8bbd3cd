"""What real clients send, on a real vLLM scheduler (issue 32).

Real clients do not continue the previous prompt verbatim, do not flag
their last step, and share a system prompt between sessions:

* AIPerf rebuilds each prompt from a trace's hash blocks, so the previous
  prompt's partial tail block is not in the next one; Claude Code rewrites
  its reminders near the tail: the turn still continues its conversation
  and takes its pin over;
* chat templates drop earlier reasoning from history at the user's next
  message, and an answer after tool calls is not the end of an interactive
  session: the follow-up continues the job, keeps its rank, and finds its
  context (its blocks aged as stock LRU, not evicted first);
* parallel sub-agents started with nearly the same prompt each continue
  their own conversation after a tail rewrite, though each one's base is
  nearly its whole prompt;
* a sub-agent (a known session's new conversation) is never held by the
  admission gate behind strangers' new sessions (with
  ``admission_sub_agents`` it waits for room, but passes first);
* the gate counts blocks several jobs share once, and a job whose TTL chose
  not to hold its context not at all.

Each of these failed before prompts were matched by shared prefix. Time is
the scheduler's manual clock; every test ends with every block free.
"""

from __future__ import annotations

import pytest
from harness import (
    admitted_cached_tokens,
    make_request,
    make_scheduler,
    prompt_of,
    run_until_finished,
    scripted,
    step,
    tiny_tokens,
)
from scheduler_turns import assert_all_blocks_free

from vllm_continuum_plugin.request_record import request_meta

BLOCK = 16
EOS = 2
TTL_S = 60.0
FIXED = {"ttl_policy": "fixed", "fixed_ttl_s": TTL_S, "default_ttl_s": TTL_S}


def call(command: str) -> list[int]:
    return tiny_tokens('<tool_call>\n{"name": "Bash", "arguments": {"command": "' + command + '"}}\n</tool_call>')


def session_turn(s, session: str, prompt: list[int], reply: list[int]):
    """A request as the API server builds it for a session header."""
    r = scripted(make_request(prompt, max_tokens=len(reply)), reply)
    r.session_id = session
    s.add_request(r)
    return r


def run_for_hit(s, request, *others, max_steps: int = 500) -> int:
    """Step until ``request`` and ``others`` finish; ``request``'s prefix-cache
    hit (tokens) when it was admitted."""
    hit = None
    for _ in range(max_steps):
        output = step(s)
        got = admitted_cached_tokens(output, request)
        hit = got if got is not None and hit is None else hit
        if request.is_finished() and all(r.is_finished() for r in others):
            assert hit is not None
            return hit
    raise AssertionError(f"not finished in {max_steps} steps")


def snap(s) -> dict:
    return s.continuum_metrics.snapshot()


def lapse_every_pin(s) -> None:
    s.clock.advance(10 * TTL_S)
    step(s)


@pytest.mark.parametrize("policy", ["continuum", "context_serve"])
def test_a_prompt_whose_tail_block_changed_continues_its_conversation_and_takes_its_pin(policy):
    s = make_scheduler(policy, num_blocks=96, continuum=FIXED)
    p1 = prompt_of(1, 6 * BLOCK + 5)  # 6 full blocks and a partial one
    r1 = session_turn(s, "aiperf-1", p1, call("ls") + [EOS])
    run_until_finished(s, [r1])
    assert "aiperf-1" in s.pins
    # AIPerf's next prompt: the previous prompt's last block (and partial
    # tail) rebuilt from other text, then the new turn's blocks.
    p2 = p1[: 5 * BLOCK] + prompt_of(2, 3 * BLOCK)
    s.clock.advance(1.0)
    r2 = session_turn(s, "aiperf-1", p2, call("pwd") + [EOS])
    assert request_meta(r2).job_id == "aiperf-1"
    assert run_for_hit(s, r2) >= 5 * BLOCK  # its context was kept
    m = snap(s)
    assert m["pins_released"]["handoff"] == 1 and m["conversations_started"] == 0
    lapse_every_pin(s)
    assert_all_blocks_free(s)


@pytest.mark.parametrize("policy", ["continuum", "context_serve"])
def test_parallel_sub_agents_with_nearly_the_same_prompt_each_continue_their_own_conversation(policy):
    # Claude Code starts Explore sub-agents together under the session's id,
    # with prompts that differ only near the end: B's first turn finds 150
    # of its 160 blocks computed by A (its base). B's next prompt rewrites
    # its last 2 blocks (a reminder) and appends the tool result: it shares
    # 158 blocks with B's prompt and 150 with A's. Prefixes known only to
    # 1/16 of the prompt round 158 down to 150, no more than B's base, and
    # B's turn went to A's conversation, taking A's pin.
    s = make_scheduler(policy, num_blocks=320, max_model_len=4096, continuum=FIXED)
    common = prompt_of(7, 150 * BLOCK)
    a1 = session_turn(s, "cc-1", common + prompt_of(8, 10 * BLOCK + 5), call("ls") + [EOS])
    step(s)  # A's prompt computed: B's first turn finds it in the cache
    b1 = session_turn(s, "cc-1", common + prompt_of(9, 10 * BLOCK + 5), call("pwd") + [EOS])
    assert run_for_hit(s, b1, a1) >= 150 * BLOCK
    a_key, b_key = request_meta(a1).job_id, request_meta(b1).job_id
    assert a_key == "cc-1" and b_key not in (None, a_key)
    assert a_key in s.pins and b_key in s.pins
    s.clock.advance(1.0)
    b2 = session_turn(s, "cc-1", list(b1.prompt_token_ids[: 158 * BLOCK]) + prompt_of(10, 3 * BLOCK),
                      call("ls") + [EOS])
    assert request_meta(b2).job_id == b_key
    assert run_for_hit(s, b2) >= 157 * BLOCK
    assert a_key in s.pins  # A's context is still held for A
    a2 = session_turn(s, "cc-1", list(a1.all_token_ids) + prompt_of(11, 2 * BLOCK), call("ls") + [EOS])
    assert request_meta(a2).job_id == a_key
    assert run_for_hit(s, a2) >= 160 * BLOCK
    m = snap(s)
    assert m["pins_released"]["handoff"] == 2  # each pin taken over by its own next turn
    lapse_every_pin(s)
    assert_all_blocks_free(s)


def test_reasoning_stripped_at_a_follow_up_continues_the_answered_job_with_its_rank_and_context():
    s = make_scheduler("continuum", num_blocks=64, continuum=FIXED)
    system_and_task = prompt_of(3, 10 * BLOCK)
    think1 = tiny_tokens("<think>" + "the add function looks wrong, check it " * 3 + "</think>")
    call1 = call("cat add.py")
    result1 = prompt_of(4, 20)
    r1 = session_turn(s, "chat-1", system_and_task, think1 + call1 + [EOS])
    run_until_finished(s, [r1])
    # Within the tool loop the template keeps this turn's reasoning.
    p2 = system_and_task + think1 + call1 + result1
    s.clock.advance(1.0)
    answer = tiny_tokens("add() subtracts; fixed.")
    r2 = session_turn(s, "chat-1", p2, tiny_tokens("<think>found it</think>") + answer + [EOS])
    run_until_finished(s, [r2])
    # An answer after tool calls: the task ended, the session did not.
    job = s.jobs.get("chat-1")
    assert job is not None and "chat-1" not in s.pins
    assert snap(s)["jobs_ended"]["final_answer"] == 1
    first_arrival = job.first_arrival
    # Other traffic while the user reads: 40 of the pool's free blocks. An
    # ended job's blocks would go first; an answered one's age as LRU.
    chat = [make_request(prompt_of(10 + i, 10 * BLOCK), max_tokens=2) for i in range(4)]
    for r in chat:
        s.add_request(r)
    run_until_finished(s, chat)
    # A stranger's new session arrives, then the user's follow-up, whose
    # history has every earlier reasoning dropped by the chat template.
    stranger = make_request(prompt_of(20, 4 * BLOCK), max_tokens=2, job_id="stranger", is_last_step=True)
    s.add_request(stranger)
    p3 = system_and_task + call1 + result1 + answer + prompt_of(5, 12)
    r3 = session_turn(s, "chat-1", p3, answer + [EOS])
    assert request_meta(r3).job_id == "chat-1"
    assert s.jobs.get("chat-1").first_arrival == first_arrival
    assert s.order.queue_key(r3) < s.order.queue_key(stranger)  # keeps the job's rank
    assert run_for_hit(s, r3, stranger) >= 10 * BLOCK  # found its context
    assert snap(s)["conversations_started"] == 0
    lapse_every_pin(s)
    assert_all_blocks_free(s)


def job_a_under_way_beside_a_chat(seed: int, chat_tokens: int, **continuum):
    """A scheduler with a pool of 64 blocks, job "a" under way with a
    40-block context (its pin lapsed: only the prefix cache holds it) and an
    untagged chat keeping the engine busy; returns (scheduler, a's first
    turn, the chat)."""
    s = make_scheduler(num_blocks=64, max_num_seqs=4, continuum={"default_ttl_s": 1.0, **continuum})
    r1 = make_request(prompt_of(seed, 40 * BLOCK - 8), max_tokens=4, job_id="a", is_last_step=False)
    s.add_request(r1)
    run_until_finished(s, [r1])
    s.clock.advance(1.5)
    step(s)
    chat = make_request(prompt_of(seed + 1, 2 * BLOCK), max_tokens=chat_tokens)
    s.add_request(chat)
    step(s)
    return s, r1, chat


def end_job_a(r1, seed: int):
    """Job "a"'s last turn, continuing its first."""
    return make_request(list(r1.prompt_token_ids) + list(r1.output_token_ids) + prompt_of(seed, 8), max_tokens=2,
                        job_id="a", is_last_step=True)


def test_a_sub_agent_is_not_held_behind_a_strangers_new_session():
    # A stranger's 30-block first turn is held beside job "a".
    s, r1, chat = job_a_under_way_beside_a_chat(30, chat_tokens=200)
    stranger = make_request(prompt_of(32, 30 * BLOCK), max_tokens=4, job_id="b", is_last_step=True)
    s.add_request(stranger)
    for _ in range(3):
        step(s)
    assert stranger.num_computed_tokens == 0 and stranger in s.waiting
    # Session "a" starts a sub-agent: a new conversation of a known session.
    sub = make_request(prompt_of(33, 8 * BLOCK), max_tokens=4, job_id="a", is_last_step=True)
    s.add_request(sub)
    assert request_meta(sub).job_id != "a"
    step(s)
    assert sub.num_computed_tokens > 0  # admitted at once
    assert stranger.num_computed_tokens == 0
    run_until_finished(s, [sub, chat, stranger])
    end = end_job_a(r1, 34)
    s.add_request(end)
    run_until_finished(s, [end])
    lapse_every_pin(s)
    assert_all_blocks_free(s)


def test_with_admission_sub_agents_a_sub_agent_waits_for_room_but_passes_before_a_stranger_who_came_first():
    # A stranger's 34-block first turn waits beside job "a"; then "a"
    # starts a 30-block sub-agent: neither fits beside "a".
    s, r1, chat = job_a_under_way_beside_a_chat(60, chat_tokens=300, admission_sub_agents=True)
    stranger = make_request(prompt_of(62, 34 * BLOCK), max_tokens=4, job_id="b", is_last_step=True)
    s.add_request(stranger)
    s.clock.advance(0.5)
    sub = make_request(prompt_of(63, 30 * BLOCK), max_tokens=4, job_id="a", is_last_step=True)
    s.add_request(sub)
    assert request_meta(sub).job_id != "a"
    for _ in range(3):
        step(s)
    # Admitted over the pool, the sub-agent would cost "a" its context.
    assert sub.num_computed_tokens == 0 and stranger.num_computed_tokens == 0
    # "a" ends: room for one of them, and the sub-agent goes first although
    # the stranger came first.
    end = end_job_a(r1, 64)
    s.add_request(end)
    assert run_for_hit(s, end) >= 39 * BLOCK  # "a" kept its context while the sub-agent waited
    for _ in range(3):
        step(s)
    assert sub.num_computed_tokens > 0
    assert stranger.num_computed_tokens == 0
    run_until_finished(s, [sub, chat, stranger])
    lapse_every_pin(s)
    assert_all_blocks_free(s)


def test_shared_system_blocks_count_once_in_the_gates_demand():
    s = make_scheduler(num_blocks=128, continuum=FIXED)
    system = prompt_of(40, 20 * BLOCK)
    jobs = []
    for i, name in enumerate(("a", "b", "c")):
        r = make_request(system + prompt_of(41 + i, 5 * BLOCK), max_tokens=4, job_id=name, is_last_step=False)
        s.add_request(r)
        run_until_finished(s, [r])
        jobs.append(r)
    assert all(name in s.pins for name in ("a", "b", "c"))
    # 20 shared blocks once, plus each job's own 5 (its reply is in its
    # last, partial block): 35, not 75 -- to within the shared prefix's
    # resolution (a 25-block prompt keeps a hash every 2 blocks or less).
    assert 20 + 3 * 5 <= s.admission.demand_blocks(s.clock.time()) <= 20 + 3 * 5 + 3 * 2
    for name, r in zip(("a", "b", "c"), jobs):
        last = make_request(list(r.all_token_ids) + prompt_of(50, 4), max_tokens=2, job_id=name, is_last_step=True)
        s.add_request(last)
        run_until_finished(s, [last])
    assert s.admission.demand_blocks(s.clock.time()) == 0
    assert_all_blocks_free(s)


def test_a_job_whose_ttl_chose_not_to_hold_is_not_counted_by_the_gate():
    # ContextServe's rules know a Task (a sub-agent run) is SLOW: TTL 0.
    s = make_scheduler("context_serve", num_blocks=96, continuum=FIXED)
    task = tiny_tokens('<tool_call>\n{"name": "Task", "arguments": {"prompt": "find the bug"}}\n</tool_call>')
    r = scripted(make_request(prompt_of(60, 20 * BLOCK), max_tokens=len(task) + 1, job_id="slow"), task + [EOS])
    s.add_request(r)
    run_until_finished(s, [r])
    assert "slow" not in s.pins and s.jobs.get("slow") is not None
    assert s.admission.demand_blocks(s.clock.time()) == 0
    fast = scripted(make_request(prompt_of(61, 20 * BLOCK), max_tokens=len(call("ls")) + 1, job_id="fast"),
                    call("ls") + [EOS])
    s.add_request(fast)
    run_until_finished(s, [fast])
    assert "fast" in s.pins and s.admission.demand_blocks(s.clock.time()) >= 20
    lapse_every_pin(s)
    assert_all_blocks_free(s)


def test_a_slow_verdict_without_a_duration_counts_when_the_tool_came_back_soon_before():
    """ContextServe's rules call a Task SLOW (TTL 0) and give no duration:
    the first time, nothing says when it returns and the job leaves the
    gate's demand; once the scope has measured Task coming back in 5 s, the
    freed context counts until then (its blocks are still cached)."""
    s = make_scheduler("context_serve", num_blocks=96, continuum=FIXED)
    task = tiny_tokens('<tool_call>\n{"name": "Task", "arguments": {"prompt": "find the bug"}}\n</tool_call>')
    prompt = prompt_of(63, 20 * BLOCK)
    r1 = scripted(make_request(prompt, max_tokens=len(task) + 1, job_id="t"), task + [EOS])
    s.add_request(r1)
    run_until_finished(s, [r1])
    assert "t" not in s.pins and s.admission.demand_blocks(s.clock.time()) == 0
    s.clock.advance(5.0)
    prompt = prompt + task + [EOS] + list(range(20, 60))
    r2 = scripted(make_request(prompt, max_tokens=len(task) + 1, job_id="t"), task + [EOS])
    s.add_request(r2)
    run_until_finished(s, [r2])
    assert "t" not in s.pins and s.admission.demand_blocks(s.clock.time()) >= 20
    lapse_every_pin(s)
    assert_all_blocks_free(s)


@pytest.mark.parametrize(("expected_s", "counted"), [(30.0, True), (600.0, False)])
def test_a_freed_context_predicted_back_within_the_gates_horizon_still_counts(expected_s, counted):
    """A TTL of 0 frees the context (the tool outlasts what holding it is
    worth), but a tool predicted back within the gate's horizon (``max_ttl_s``)
    returns to blocks still in the prefix cache: the gate keeps counting
    them rather than admit a newcomer in their place (ContextServe frees
    every SLOW tool's context, a 10 s one too). One predicted back later
    leaves the demand."""
    s = make_scheduler(num_blocks=96)
    r = make_request(prompt_of(62, 20 * BLOCK), max_tokens=4, job_id="j", is_last_step=False,
                     extra={"expected_tool_seconds": expected_s})
    s.add_request(r)
    run_until_finished(s, [r])
    assert "j" not in s.pins  # the hint outlasts a rebuild of 20 blocks: TTL 0
    assert (s.admission.demand_blocks(s.clock.time()) >= 20) is counted
    s.clock.advance(3600.0)
    step(s)
    assert_all_blocks_free(s)


@pytest.mark.parametrize("forecast", [True, False])
def test_the_gate_counts_a_job_at_the_size_jobs_grow_to_when_forecasting(forecast):
    s = make_scheduler(num_blocks=256, continuum={**FIXED, "admission_forecast": forecast})
    # Eight sessions that each grew by 10 blocks after admission, then ended.
    for i in range(8):
        r1 = make_request(prompt_of(70 + i, 4 * BLOCK), max_tokens=4, job_id=f"grown-{i}", is_last_step=False)
        s.add_request(r1)
        run_until_finished(s, [r1])
        r2 = make_request(list(r1.all_token_ids) + prompt_of(80 + i, 10 * BLOCK), max_tokens=2,
                          job_id=f"grown-{i}", is_last_step=True)
        s.add_request(r2)
        run_until_finished(s, [r2])
    assert s.admission.expected_growth() == (10 if forecast else 0)
    new = make_request(prompt_of(90, 4 * BLOCK), max_tokens=4, job_id="new", is_last_step=False)
    s.add_request(new)
    run_until_finished(s, [new])
    # Counted at its forecast size: 4 blocks at admission + 10 of growth.
    assert s.admission.demand_blocks(s.clock.time()) == (14 if forecast else 4)
    lapse_every_pin(s)
    assert_all_blocks_free(s)
