"""The implicit-job index over vLLM's own block hashes (pure logic).

Prompts are hashed with vLLM's real block hasher, so equal hashes mean
equal prefixes exactly as in the scheduler; "decoding" renders each token
as ``<id>`` (no whitespace, so text equality is token equality here).
"""

from __future__ import annotations

import random

import pytest
from harness import make_request

from vllm_continuum_plugin.implicit_jobs import MIN_ANSWERS, ImplicitJobIndex, is_implicit_chat, is_implicit_job

BS = 16
EOS = 2


def hashes(tokens: list[int]) -> list:
    return list(make_request(tokens, block_size=BS).block_hashes)


def decode(ids) -> str:
    return "".join(f"<{i}>" for i in ids)


class Turn(list):
    """A finished turn's tokens (prompt + reply + stop token)."""

    def __init__(self, prompt: list[int], reply: list[int]) -> None:
        super().__init__(prompt + reply + [EOS])
        self.num_prompt = len(prompt)


def turn(system: list[int], user: list[int], reply: list[int]) -> Turn:
    return Turn(system + user, reply)


def match(idx: ImplicitJobIndex, prompt: list[int]) -> str | None:
    return idx.match(hashes(prompt), prompt, decode)


def index(**kw) -> ImplicitJobIndex:
    return ImplicitJobIndex(block_size=BS, **{"max_entries": 64, "max_blocks": 4096, **kw})


SYSTEM = list(range(10, 10 + 70))
SCOPES = ("default", "alice", "mallory")  # a shared system prompt + task: 4+ blocks


def try_register(idx: ImplicitJobIndex, tokens: Turn, job: str) -> bool:
    return idx.register(job, hashes(tokens), tokens, tokens.num_prompt, decode, stop_token_ids={EOS})


def register(idx: ImplicitJobIndex, tokens: Turn, job: str | None = None) -> str:
    job = job or idx.new_job_id()
    assert try_register(idx, tokens, job)
    return job


def test_next_turn_is_found_and_takes_the_entry_over():
    idx = index()
    first = turn(SYSTEM, [500, 501], [600, 601, 602])
    job = register(idx, first)
    assert is_implicit_job(job)
    # The template re-renders the stop token and adds its own tokens, then
    # the tool output and the next generation prompt.
    nxt = first + [3, 700, 701, 702, 4]
    assert match(idx, nxt) == job
    assert match(idx, nxt) is None  # consumed: a branch gets stock behaviour
    assert len(idx) == 0 and idx.num_blocks == 0


def test_jobs_sharing_a_system_prompt_and_task_are_never_confused():
    idx = index()
    a = register(idx, turn(SYSTEM, [500], [600, 601]))
    b = register(idx, turn(SYSTEM, [500], [650, 651]))  # same prompt, other reply
    # A prompt that shares the system prompt and task but neither reply.
    other = SYSTEM + [500, 999, 998, 997]
    assert match(idx, other) is None
    nxt_b = turn(SYSTEM, [500], [650, 651]) + [3, 800]
    assert match(idx, nxt_b) == b
    nxt_a = turn(SYSTEM, [500], [600, 601]) + [3, 800]
    assert match(idx, nxt_a) == a


def test_the_text_match_covers_the_reply_even_inside_a_partial_block():
    # Two jobs whose prompts end inside the same partial block: the reply's
    # text, not the block, tells them apart.
    idx = index()
    a = register(idx, Turn(SYSTEM[:60], [600, 601, 602]))  # the reply straddles a block boundary
    b = register(idx, Turn(SYSTEM[:60], [600, 601, 666]))
    assert match(idx, SYSTEM[:60] + [600, 601, 666, 3, 800]) == b
    assert match(idx, SYSTEM[:60] + [600, 601, 602, 3, 800]) == a


def test_an_edited_reply_still_continues_its_turn_by_prefix():
    # The history re-sends the prompt but not the reply as sampled (a
    # template that re-renders it, AIPerf that does not append it): the
    # prompt's blocks are the context kept, so it is the next turn.
    idx = index()
    job = register(idx, Turn(SYSTEM[:60], [600, 601, 602]))
    edited = SYSTEM[:60] + [600, 601, 666, 3, 800]
    assert match(idx, edited) == job


def test_a_resend_of_the_same_prompt_is_not_a_continuation():
    idx = index()
    first = turn(SYSTEM, [500], [600, 601])
    register(idx, first)
    assert match(idx, first[: first.num_prompt]) is None  # the same prompt again: a retry
    assert match(idx, first[: first.num_prompt - 3]) is None  # shorter: a rewrite, nothing new
    assert len(idx) == 1  # a failed match leaves the entry


def test_two_jobs_with_identical_turns_cannot_be_told_apart_so_neither_is_kept():
    idx = index()
    same = turn(SYSTEM, [500], [600])
    register(idx, same)
    assert not try_register(idx, same, idx.new_job_id())
    nxt = same + [3, 800]
    assert match(idx, nxt) is None
    assert len(idx) == 0 and idx.num_blocks == 0


def test_a_job_keeps_one_entry_and_forget_drops_it():
    idx = index()
    first = turn(SYSTEM, [500], [600])
    job = register(idx, first)
    second = Turn(first + [3, 800, 801, 802], [600, 610])
    register(idx, second, job)  # the job's next turn replaces its entry
    assert len(idx) == 1
    assert match(idx, first + [3, 9]) is None  # the old turn is gone
    idx.forget(job)
    assert len(idx) == 0 and idx.num_blocks == 0
    idx.forget(job)  # forgetting twice is harmless


def test_a_reply_re_tokenised_differently_still_matches_by_its_text():
    # The model sampled "<6><0>" where the template's re-rendering gives
    # "<60>" -- here: the same text split into other tokens.
    idx = index()
    job = register(idx, turn(SYSTEM, [500], [600, 601]))
    text_decode = lambda ids: "".join(str(i) for i in ids)  # "6","01" == "60","1"
    idx2 = index()
    t = turn(SYSTEM, [500], [6, 1, 601])
    assert idx2.register("j", hashes(t), t, t.num_prompt, text_decode, stop_token_ids={EOS})
    nxt = SYSTEM + [500] + [61, 601] + [3, 800]
    assert idx2.match(hashes(nxt), nxt, text_decode) == "j"
    assert match(idx, SYSTEM + [500, 600, 601, 3, 9]) == job


def test_many_jobs_with_the_same_first_prompt_keep_a_bounded_candidate_list():
    idx = index()
    jobs = [register(idx, turn(SYSTEM, [500], [600 + i])) for i in range(12)]
    assert len(idx) == 8  # MAX_CANDIDATES per key: the oldest went first
    for i, job in enumerate(jobs):
        nxt = SYSTEM + [500, 600 + i, 3, 800]
        assert match(idx, nxt) == (job if i >= 4 else None)


def test_turns_without_a_full_block_are_not_registered():
    idx = index()
    assert not idx.register("j", [], [5, 6, EOS], 2, decode, stop_token_ids={EOS})
    assert len(idx) == 0


@pytest.mark.parametrize("bound", ["max_entries", "max_blocks"])
def test_memory_is_bounded_and_the_oldest_entries_go_first(bound):
    idx = index(**({"max_entries": 3} if bound == "max_entries" else {"max_blocks": 12}))
    jobs, turns = [], []
    for i in range(6):
        t = turn(SYSTEM + [500 + i] * 9, [], [600 + i])  # 4 full blocks each, its own key
        turns.append(t)
        jobs.append(register(idx, t))
        assert len(idx) <= 3 and idx.num_blocks <= 12
    for i, t in enumerate(turns):
        nxt = t + [3, 800]
        assert match(idx, nxt) == (jobs[i] if i >= 3 else None)


def test_random_traffic_keeps_the_counts_exact():
    rng = random.Random(0)
    idx = index(max_entries=20, max_blocks=200)
    live: dict[str, list[int]] = {}
    scope_of: dict[str, str] = {}
    for _ in range(2000):
        op = rng.random()
        if op < 0.5 or not live:
            t = turn(SYSTEM[: rng.randrange(0, 70)], [rng.randrange(500, 510)], [rng.randrange(600, 700)] * rng.randrange(1, 40))
            job = rng.choice(list(live)) if live and rng.random() < 0.3 else idx.new_job_id()
            if idx.register(job, hashes(t), t, t.num_prompt, decode, stop_token_ids={EOS},
                            scope=scope_of.setdefault(job, rng.choice(SCOPES))):
                live[job] = t
            else:
                live.pop(job, None)
        elif op < 0.8:
            job = rng.choice(list(live))
            t = live[job] + [3, rng.randrange(800, 900)]
            found = idx.match(hashes(t), t, decode, scope=scope_of[job])
            if found is not None:
                live.pop(found, None)
        else:
            job = rng.choice(list(live))
            idx.forget(job)
            live.pop(job)
        # Entries dropped by the bounds are no longer matchable; the table's
        # own accounting is exact whatever happened.
        entries = list(idx._turns.values())
        assert len(entries) <= 20 and idx.num_blocks <= 200
        assert idx.num_blocks == sum(len(e.block_hashes) for e in entries)
        counted: dict = {}
        for e in entries:
            for h in e.block_hashes:
                counted.setdefault(e.scope, {})[h] = counted.get(e.scope, {}).get(h, 0) + 1
        assert counted == idx._known
        assert {sc: len(jobs) for sc, jobs in idx._by_scope.items()} == {
            sc: sum(1 for e in entries if e.scope == sc) for sc in counted}
        assert sum(len(v) for v in idx._by_key.values()) == len(entries)
        # A recorded holder is a live entry of its scope that holds the block.
        for sc, holders in idx._holder.items():
            for h, holder in holders.items():
                assert idx._turns[holder].scope == sc and h in idx._turns[holder].block_hashes
        assert set(idx._holder) == set(idx._known)
        live = {j: t for j, t in live.items() if j in idx._turns}


def scoped(idx: ImplicitJobIndex, tokens: Turn, scope: str, job: str | None = None) -> str | None:
    job = job or idx.new_job_id()
    ok = idx.register(job, hashes(tokens), tokens, tokens.num_prompt, decode, stop_token_ids={EOS}, scope=scope)
    return job if ok else None


def test_a_turn_is_continued_only_by_a_request_of_its_scope():
    idx = index()
    job = scoped(idx, turn(SYSTEM, [500], [600]), "alice")
    nxt = SYSTEM + [500, 600, 3, 800]
    assert idx.match(hashes(nxt), nxt, decode, scope="mallory") is None
    assert idx.match(hashes(nxt), nxt, decode) is None  # the default scope is a scope too
    assert idx.match(hashes(nxt), nxt, decode, scope="alice") == job


def test_twins_in_two_scopes_are_two_entries():
    idx = index()
    same = turn(SYSTEM, [500], [600])
    a = scoped(idx, same, "alice")
    m = scoped(idx, same, "mallory")
    assert a and m and len(idx) == 2
    nxt = same + [3, 800]
    assert idx.match(hashes(nxt), nxt, decode, scope="alice") == a
    assert idx.match(hashes(nxt), nxt, decode, scope="mallory") == m


def test_the_candidate_cap_holds_per_scope():
    idx = index()
    a = scoped(idx, turn(SYSTEM, [500], [600]), "alice")
    for i in range(12):
        scoped(idx, turn(SYSTEM, [500], [700 + i]), "mallory")
    nxt = SYSTEM + [500, 600, 3, 800]
    assert idx.match(hashes(nxt), nxt, decode, scope="alice") == a


@pytest.mark.parametrize("bound", ["max_entries", "max_blocks"])
def test_a_full_index_evicts_from_the_scope_that_holds_the_most(bound):
    idx = index(**({"max_entries": 6} if bound == "max_entries" else {"max_blocks": 24}))
    victim_turn = turn(SYSTEM + [499] * 9, [], [600])  # 4 full blocks
    victim = scoped(idx, victim_turn, "alice")
    for i in range(40):  # a flood from one scope, far past both bounds
        scoped(idx, turn(SYSTEM + [500 + i] * 9, [], [600 + i]), "mallory")
        assert len(idx) <= 6 and idx.num_blocks <= 24
    nxt = victim_turn + [3, 800]
    assert idx.match(hashes(nxt), nxt, decode, scope="alice") == victim


# -- by shared prefix -------------------------------------------------------
LONG_SYSTEM = list(range(1000, 1000 + 96))  # six blocks every session shares
TASK_A = list(range(2000, 2000 + 64))  # four blocks of a task
TASK_B = list(range(3000, 3000 + 64))


def test_a_prompt_rebuilt_without_the_tail_block_or_the_reply_continues_by_prefix():
    # AIPerf's hash-block prompts: the previous prompt's full blocks, then
    # fresh content; its partial tail and the reply are not re-sent.
    idx = index()
    prompt = LONG_SYSTEM + TASK_A + [7, 8, 9]  # a partial last block
    job = register(idx, Turn(prompt, [600, 601]))
    rebuilt = LONG_SYSTEM + TASK_A + list(range(4000, 4040))
    assert match(idx, rebuilt) == job
    assert len(idx) == 0


def test_a_rewritten_last_block_still_continues_by_prefix():
    # A reminder or a cache-control edit rewrites the tail of the history.
    idx = index()
    job = register(idx, Turn(LONG_SYSTEM + TASK_A, [600, 601]))
    rewritten = LONG_SYSTEM + TASK_A[:48] + list(range(5000, 5040))
    assert match(idx, rewritten) == job


def test_a_compacted_history_is_not_a_continuation():
    idx = index()
    register(idx, Turn(LONG_SYSTEM + TASK_A + TASK_B, [600]))
    # Re-sends the system prompt and a quarter of the rest: a summary, not the context.
    compacted = LONG_SYSTEM + TASK_A[:32] + list(range(6000, 6100))
    assert match(idx, compacted) is None
    assert len(idx) == 1


def test_a_prefix_two_turns_hold_continues_neither():
    # Two sessions with one system prompt: a third that shares only it is
    # nobody's next turn.
    idx = index()
    register(idx, Turn(LONG_SYSTEM + TASK_A, [600]))
    register(idx, Turn(LONG_SYSTEM + TASK_B, [600]))
    stranger = LONG_SYSTEM + list(range(7000, 7080))
    assert match(idx, stranger) is None
    assert len(idx) == 2


def test_sharing_only_what_the_turn_shared_when_registered_continues_nothing():
    # The turn's base (the system prompt another turn held) stays its base
    # when that other turn is gone: sharing it is no continuation.
    idx = index()
    other = register(idx, Turn(LONG_SYSTEM + TASK_B, [600]))
    register(idx, Turn(LONG_SYSTEM + TASK_A[:16], [600]))  # base: six blocks, own: one
    idx.forget(other)
    stranger = LONG_SYSTEM + list(range(7000, 7080))
    assert match(idx, stranger) is None


def test_another_scope_cannot_continue_a_turn_by_prefix():
    idx = index()
    job = scoped(idx, Turn(LONG_SYSTEM + TASK_A, [600]), "alice")
    rebuilt = LONG_SYSTEM + TASK_A + list(range(4000, 4040))
    assert idx.match(hashes(rebuilt), rebuilt, decode, scope="mallory") is None
    assert idx.match(hashes(rebuilt), rebuilt, decode, scope="alice") == job


def test_an_answer_registers_as_a_chat_found_by_prefix_without_decoding():
    idx = index()
    answer = Turn(LONG_SYSTEM + TASK_A, [600, 601])
    request = make_request(list(answer), block_size=BS)
    request.num_prompt_tokens = answer.num_prompt
    assert idx.register_answer(request, stop_token_ids={EOS})
    job = next(iter(idx._turns))
    assert is_implicit_job(job) and is_implicit_chat(job)

    def no_decode(ids):
        raise AssertionError("an answer's turn is matched without decoding")

    follow_up = list(answer) + [3, 800, 801]
    assert idx.match(hashes(follow_up), follow_up, no_decode) == job


def test_the_answer_return_rate_tells_chats_from_one_shot_traffic():
    idx = index(max_entries=4096, max_blocks=1 << 20)

    def answer(tokens: list[int], scope: str) -> str | None:
        request = make_request(tokens + [600, EOS], block_size=BS)
        request.num_prompt_tokens = len(tokens)
        return idx.register_answer(request, stop_token_ids={EOS}, scope=scope)

    for i in range(MIN_ANSWERS - 1):
        answer(LONG_SYSTEM + list(range(10_000 + 100 * i, 10_000 + 100 * i + 64)), "batch")
    assert idx.answer_return_rate("batch") is None  # too few to tell
    answer(LONG_SYSTEM + list(range(90_000, 90_064)), "batch")
    assert idx.answer_return_rate("batch") == 0.0  # one-shot: nothing came back
    for i in range(MIN_ANSWERS):
        prompt = list(range(20_000 + 200 * i, 20_000 + 200 * i + 64))
        chat = answer(prompt, "chat")
        follow_up = prompt + [600, EOS, 3, 9, 9]
        assert idx.match(hashes(follow_up), follow_up, decode, scope="chat") == chat
    assert idx.answer_return_rate("chat") == 1.0 and idx.answer_return_rate("batch") == 0.0
