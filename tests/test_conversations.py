"""Conversations of a session id, as pure logic (``conversations``).

Requests are stand-ins with the three fields the module reads (request id,
prompt length, block hashes: strings standing for vLLM's chained hashes, so
two prompts equal at a block are equal before it); job state and pins are
plain dicts. The
scheduler-level behaviour (pins, job ends, sub-agents on a real vLLM
scheduler) is in tests/test_threat_job_binding.py and
tests/test_sub_agents.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_continuum_plugin.conversations import (
    MAX_PROMPTS,
    Conversations,
    conversation_key,
    session_of,
    shown,
)
from vllm_continuum_plugin.estimators.history import JobState
from vllm_continuum_plugin.metadata import JobMetadata, parse_job_id
from vllm_continuum_plugin.request_record import peek_record

BLOCK = 4
_ids = iter(range(10**9))


def request(hashes: list[str], tokens: int | None = None) -> SimpleNamespace:
    return SimpleNamespace(request_id=f"r{next(_ids)}", block_hashes=list(hashes),
                           num_prompt_tokens=tokens if tokens is not None else BLOCK * len(hashes))


def extend(r: SimpleNamespace, *more: str) -> SimpleNamespace:
    """The next turn of ``r``'s conversation (its prompt + reply + more)."""
    return request(r.block_hashes + list(more))


class World:
    """Job states and pins, as the scheduler would keep them."""

    def __init__(self, max_jobs: int = 100, max_conversations: int = 3) -> None:
        self.jobs: dict[str, JobState] = {}
        self.pins: dict[str, list[str]] = {}  # key -> the pinned block hashes
        self.mismatches = 0
        self.new = 0
        self.evicted: list[str] = []
        self.c = Conversations(
            BLOCK, max_jobs, max_conversations,
            on_mismatch=self._mismatch, on_new_conversation=self._new, on_evict=self.evicted.append,
        )

    def _mismatch(self) -> None:
        self.mismatches += 1

    def _new(self) -> None:
        self.new += 1

    def send(self, session: str, r: SimpleNamespace, scope: str = "default", agent: str | None = None) -> str | None:
        """The key ``r`` acts on (None: served as stock); ``agent``: the
        sub-agent the request names."""
        def continues_pin(key: str) -> bool | None:
            pinned = self.pins.get(key)
            return None if pinned is None else r.block_hashes[:len(pinned)] == pinned

        meta = self.c.resolve(r, JobMetadata(job_id=session, scope=scope, agent_id=agent), self.jobs.get,
                              continues_pin)
        if meta.job_id is not None and meta.job_id not in self.jobs:
            self.jobs[meta.job_id] = JobState(meta.job_id, first_arrival=0.0, scope=scope, in_flight=0)
        return meta.job_id


def test_a_sessions_first_conversation_keeps_the_session_id_and_its_turns_stay_on_it():
    w = World()
    first = request(["s", "a1"])
    assert w.send("sess", first) == "sess"
    assert w.send("sess", extend(first, "a2")) == "sess"
    assert w.new == 0 and w.mismatches == 0


def test_a_second_conversation_under_the_session_gets_its_own_key_and_keeps_it():
    w = World()
    main = request(["s", "main", "main-b", "main-c"])
    sub = request(["s", "sub"])  # same system prompt block (1 of main's 4), then its own task
    assert w.send("sess", main) == "sess"
    sub_key = w.send("sess", sub)
    assert sub_key == conversation_key("sess", 1) != "sess" and session_of(sub_key) == "sess"
    # Each next turn continues its own conversation, in any order.
    assert w.send("sess", extend(sub, "sub2")) == sub_key
    assert w.send("sess", extend(main, "main2")) == "sess"
    assert w.new == 1 and w.c.keys_of("sess") == [sub_key, "sess"]


def test_concurrent_first_turns_with_different_prompts_are_different_conversations():
    # Neither has finished: nothing but the in-flight prompts to tell them apart.
    w = World()
    title = request(["title-system", "title-ask"])
    main = request(["agent-system", "task"])
    assert w.send("oc", title) == "oc"
    assert w.send("oc", main) == conversation_key("oc", 1)
    # A retry of the in-flight title is the same conversation.
    assert w.send("oc", request(["title-system", "title-ask"])) == "oc"


def test_a_sub_agent_sharing_only_the_base_never_takes_its_parents_pin():
    # The parent's pinned prompt is half system prompt: a pin alone (base 0)
    # would call the sub-agent its continuation; the conversation's base
    # (what its first turn hit in the prefix cache) says it is not.
    w = World()
    parent = request(["sys", "tools", "task", "more"])
    key = w.send("sess", parent)
    w.jobs[key].first_hit_tokens = 2 * BLOCK
    w.pins[key] = list(parent.block_hashes)
    sub = w.send("sess", request(["sys", "tools", "sub-task"]))
    assert sub not in (None, key)


def test_only_the_last_few_prompts_of_a_conversation_are_remembered():
    w = World()
    last = request(["root", "a"])
    key = w.send("sess", last)
    for i in range(1, 6):
        last = extend(last, f"t{i}", f"u{i}")
        assert w.send("sess", last) == key
    assert len(w.c._sessions["sess"].conversations[key].prompts) == MAX_PROMPTS
    # A fork from the first turn's prompt shares 2 of the last prompts' 10+
    # blocks: that prompt is forgotten, so the fork is a conversation of its own.
    assert w.send("sess", request(["root", "a", "fork"])) != key


def test_a_prompt_whose_tail_was_rewritten_continues_its_conversation():
    # AIPerf's hash-block prompts drop the previous prompt's tail block; chat
    # templates drop earlier reasoning; Claude Code rewrites reminders.
    w = World()
    first = request(["sys", "tools", "task", "b3", "tail"])
    key = w.send("sess", first)
    assert w.send("sess", request(["sys", "tools", "task", "b3", "tail*", "reply", "result"])) == key
    # A compacted history (a summary after the system prompt and tools)
    # shares under half of every remembered prompt: it starts afresh.
    assert w.send("sess", request(["sys", "tools", "summary"])) != key


def test_sharing_only_the_base_starts_a_new_conversation():
    # The conversation's first turn found 2 blocks (system prompt, tools) in
    # the prefix cache, computed by other traffic: sharing just those is no
    # continuation, even though it is half of the prompt.
    w = World()
    main = request(["sys", "tools", "task", "more"])
    key = w.send("sess", main)
    w.jobs[key].first_hit_tokens = 2 * BLOCK
    sub = request(["sys", "tools", "sub-task", "sub-more"])
    assert w.send("sess", sub) != key
    # One block beyond the base and half of the rest: a continuation.
    assert w.send("sess", request(["sys", "tools", "task", "other"])) == key


def test_the_conversation_sharing_the_longest_prefix_wins():
    w = World()
    a = request(["sys", "a1", "a2", "a3"])
    b = request(["sys", "a1", "b2", "b3"])  # shares half of a
    ka = w.send("sess", a)
    assert w.send("sess", b) == ka  # a continuation of a (two of its four blocks)
    w2 = World()
    ka, kb = w2.send("sess", request(["x", "x1", "x2", "x3"])), w2.send("sess", request(["y", "y1"]))
    assert ka != kb
    assert w2.send("sess", request(["x", "x1", "x2", "x3", "x4"])) == ka
    assert w2.send("sess", request(["y", "y1", "y2"])) == kb


def test_another_scope_never_continues_a_conversation():
    w = World()
    victim = request(["sys", "secret", "more"])
    key = w.send("sess", victim, scope="alice")
    same_context = extend(victim, "next")
    other = w.send("sess", same_context, scope="mallory")
    assert other is not None and other != key
    assert w.send("sess", extend(victim, "next2"), scope="alice") == key


def test_a_named_sub_agent_continues_only_its_own_conversation():
    # Claude Code names each sub-agent (x-claude-code-agent-id). Two parallel
    # sub-agents whose prompts share all but their last block, and a parent
    # whose prompt they extend, stay three conversations: the names decide
    # where prefixes alone would merge them.
    w = World(max_conversations=4)
    main = request(["sys", "task", "t2", "t3"])
    assert w.send("cc", main) == "cc"
    w.jobs["cc"].turns_finished = 1
    a = w.send("cc", request(["sys", "task", "t2", "t3", "a"]), agent="agent-a")
    assert a not in (None, "cc")
    w.jobs[a].turns_finished = 1
    b = w.send("cc", request(["sys", "task", "t2", "t3", "a", "b"]), agent="agent-b")
    assert b not in (None, "cc", a)
    w.jobs[b].turns_finished = 1
    # Each agent's next turn finds its own conversation; the parent's, its own.
    assert w.send("cc", request(["sys", "task", "t2", "t3", "a", "b", "b2"]), agent="agent-b") == b
    assert w.send("cc", request(["sys", "task", "t2", "t3", "a", "a2"]), agent="agent-a") == a
    assert w.send("cc", request(["sys", "task", "t2", "t3", "a", "b", "m2"])) == "cc"
    # Naming a sub-agent is no key to it: another scope, or a prompt that does
    # not continue it, gets a conversation of its own.
    assert w.send("cc", request(["sys", "task", "t2", "t3", "a", "a2", "x"]), scope="mallory",
                  agent="agent-a") not in (None, a)


def test_a_full_session_makes_room_from_an_idle_conversation_without_a_pin():
    w = World(max_conversations=2)
    a, b = request(["a"]), request(["b"])
    ka, kb = w.send("sess", a), w.send("sess", b)
    w.jobs[ka] = JobState(ka, first_arrival=0.0, in_flight=0)
    w.jobs[kb] = JobState(kb, first_arrival=0.0, in_flight=0)
    w.pins[kb] = ["b"]
    kc = w.send("sess", request(["c"]))
    assert kc is not None and w.evicted == [ka]  # a: idle, unpinned, least recently used
    assert sorted(w.c.keys_of("sess")) == sorted([kb, kc])
    assert kc == ka == "sess"  # the session id was a's: free again, the new one takes it


def test_a_full_session_of_busy_conversations_serves_a_stranger_as_stock():
    w = World(max_conversations=2)
    for name in ("a", "b"):
        key = w.send("sess", request([name]))
        w.jobs[key] = JobState(key, first_arrival=0.0, in_flight=1)
    stranger = request(["z"])
    assert w.send("sess", stranger) is None
    assert w.mismatches == 1 and peek_record(stranger).unbound_job_id == "sess"
    assert len(w.c.keys_of("sess")) == 2


def test_an_ended_conversation_frees_its_key_and_an_empty_session_is_forgotten():
    w = World()
    main, sub = request(["m"]), request(["s"])
    assert w.send("sess", main) == "sess"
    sub_key = w.send("sess", sub)
    w.c.forget("sess")
    assert w.c.keys_of("sess") == [sub_key]
    assert w.send("sess", request(["n"])) == "sess"  # the session id is free again
    w.c.forget("sess")
    w.c.forget(sub_key)
    assert w.c.keys_of("sess") == [] and len(w.c) == 0


def test_conversations_are_bounded_in_all_and_the_least_recent_sessions_go_first():
    w = World(max_jobs=4, max_conversations=2)
    for i in range(4):
        w.send(f"s{i}", request([f"x{i}"]))
    assert len(w.c) == 4 and w.evicted == []
    w.send("s4", request(["x4"]))
    assert len(w.c) == 4 and w.evicted == ["s0"]
    w.send("s1", request(["y1"]))  # s1 grows: the least recent session now is s2
    assert len(w.c) == 4 and w.evicted == ["s0", "s2"]


def test_no_client_can_name_another_sessions_conversation():
    key = conversation_key("sess", 3)
    with pytest.raises(ValueError, match="printable"):
        parse_job_id(key)
    assert shown(key) == "sess#3" and shown("sess") == "sess"
    with pytest.raises(ValueError, match="-1"):
        conversation_key("sess", -1)


def test_a_prompt_shorter_than_a_block_continues_nothing_and_nothing_continues_it():
    w = World()
    short = request([], tokens=BLOCK - 1)
    assert w.send("sess", short) == "sess"
    # Before: a short prompt was "continued by anything" and absorbed every
    # request of its session.
    assert w.send("sess", request(["anything"])) != "sess"
    assert w.send("sess", request([], tokens=BLOCK - 1)) not in (None, "sess")


class CountingHash(str):
    """A block hash that counts its comparisons."""

    compares = 0

    def __eq__(self, other: object) -> bool:
        CountingHash.compares += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_matching_costs_a_bounded_number_of_hash_compares_whatever_the_prompt_length():
    # 8 conversations of 100k-block prompts (two remembered each): a request
    # costs at most conversations x prompts x (log2(checkpoints) + 1) compares.
    from vllm_continuum_plugin.prompt_prefix import CHECKPOINTS, TAIL_CHECKPOINTS

    w = World(max_conversations=8)
    n = 100_000
    for c in range(8):
        for turn in range(2):
            w.send("big", request([CountingHash(f"c{c}-{i}") for i in range(n + turn)]))
    CountingHash.compares = 0
    stranger = request([CountingHash(f"z-{i}") for i in range(n)])
    for key in w.c.keys_of("big"):  # each ran a turn and has its next in flight
        w.jobs[key].in_flight = 1
        w.jobs[key].turns_finished = 1
    assert w.send("big", stranger) is None  # all 8 busy: served as stock
    bound = 8 * 2 * ((CHECKPOINTS + TAIL_CHECKPOINTS).bit_length() + 1)
    assert 0 < CountingHash.compares <= bound
