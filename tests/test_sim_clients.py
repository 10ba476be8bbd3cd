"""The simulator's client profiles (``benchmarks.sim.clients``): what each
profile hands the plugin, and that every profile replays to the end.

What a user relies on: ``tagged`` is the replay as it always was;
``headers-only`` sends a session id and nothing else, and its replies decode
to the turn's tool call (prose on the last turn); ``aiperf`` re-sends only
the previous prompt's full hash blocks, never the reply; ``reasoning`` drops
each reply's reasoning from the next prompt; every profile keeps the
arrivals, and every arm ends with every KV block free.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks import simulate
from benchmarks.sim.arms import ARMS
from benchmarks.sim.clients import (
    AIPERF_BLOCK_TOKENS,
    CLIENTS,
    DEFAULT_TOKENIZER,
    ClientProfile,
    ReplyText,
    load_reply_text,
    parse_clients,
    request_metadata,
    split_reasoning,
)
from benchmarks.sim.jobs import SimJob, TokenBook, jobs_from_workload
from benchmarks.sim.profiles import PROFILES, write_config_dir
from benchmarks.sim.step_model import RooflineStepModel
from benchmarks.workload import coding_agent_workload, generate_jobs
from vllm_continuum_plugin.estimators.parser import extract_tool_call, tool_key_for_command

PROFILE = PROFILES["h100-llama8b"]
TOKENIZER = os.path.expanduser(DEFAULT_TOKENIZER)


@pytest.fixture(scope="module")
def text() -> ReplyText:
    if not os.path.isdir(TOKENIZER):
        pytest.skip(f"no tokenizer at {TOKENIZER} (scripts/build_models.py)")
    return load_reply_text(TOKENIZER)


@pytest.fixture(scope="module")
def decode() -> Any:
    if not os.path.isdir(TOKENIZER):
        pytest.skip(f"no tokenizer at {TOKENIZER}")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    return lambda ids: tok.decode(list(ids), skip_special_tokens=False)


def _workload(n: int = 2, seed: int = 3) -> list[Any]:
    return generate_jobs(coding_agent_workload(n, 1.0), seed)


def _prompt_ids(job: SimJob, book: TokenBook, k: int) -> list[int]:
    return book.prompt(job.turns[k].prompt)


def _common(a: list[int], b: list[int]) -> int:
    return len(os.path.commonprefix([a, b]))


# ----------------------------------------------------------------------
# Profiles and metadata
# ----------------------------------------------------------------------
@pytest.mark.unit
def test_parse_clients_names_the_bad_value() -> None:
    assert [c.name for c in parse_clients("tagged, headers-only")] == ["tagged", "headers-only"]
    with pytest.raises(ValueError, match="'bogus'"):
        parse_clients("tagged,bogus")
    with pytest.raises(ValueError, match="twice"):
        parse_clients("aiperf,aiperf")
    with pytest.raises(ValueError, match="history"):
        ClientProfile("x", history="verbatim")
    with pytest.raises(ValueError, match="text replies"):
        ClientProfile("x", history="aiperf", replies="scripted")
    with pytest.raises(ValueError, match="sub_agents.*'sibling'"):
        ClientProfile("x", sub_agents="sibling")


@pytest.mark.unit
def test_metadata_tagged_sends_every_flag_others_only_a_session() -> None:
    tagged = CLIENTS["tagged"]
    assert request_metadata(tagged, "j", False, "ls") == ({"job_id": "j", "is_last_step": False, "tool_name": "ls"},
                                                          None)
    assert request_metadata(tagged, "j", True, "") == ({"job_id": "j", "is_last_step": True}, None)
    for name in ("headers-only", "aiperf", "reasoning"):
        # No is_last_step (not even False), no tool kind, no hint.
        assert request_metadata(CLIENTS[name], "j", False, "ls") == (None, "j")
        assert request_metadata(CLIENTS[name], "j", True, "") == (None, "j")
    # A sub-agent: under its parent's session id as Claude Code sends it; under
    # an id of its own as AIPerf mints one for every child conversation.
    for name, sub_agent_session in (("headers-only", "s"), ("reasoning", "s"), ("aiperf", "s/agent_001")):
        assert request_metadata(CLIENTS[name], "s/agent_001", False, "", "s") == (None, sub_agent_session)
    assert request_metadata(tagged, "s/agent_001", False, "", "s")[0]["job_id"] == "s/agent_001"
    # aiperf-last-step: the session id; is_last_step only on a conversation's last request.
    last_step = CLIENTS["aiperf-last-step"]
    assert request_metadata(last_step, "j", False, "ls") == (None, "j")
    assert request_metadata(last_step, "j", True, "") == ({"is_last_step": True}, "j")
    assert request_metadata(last_step, "s/agent_001", True, "", "s") == ({"is_last_step": True}, "s/agent_001")
    # headers-only's requests with one signal added: the session end, sub-agents' own ids, both.
    assert request_metadata(CLIENTS["headers-last"], "j", False, "ls") == (None, "j")
    assert request_metadata(CLIENTS["headers-last"], "s/agent_001", True, "", "s") == ({"is_last_step": True}, "s")
    assert request_metadata(CLIENTS["headers-own"], "s/agent_001", True, "", "s") == (None, "s/agent_001")
    assert request_metadata(CLIENTS["headers-last-own"], "s/agent_001", True, "", "s") == (
        {"is_last_step": True}, "s/agent_001")
    assert request_metadata(CLIENTS["headers-last-own"], "s/agent_001", False, "ls", "s") == (None, "s/agent_001")
    # claude-code: the parent's session id, and on a sub-agent's requests
    # (only) the sub-agent's own id, as Claude Code's x-claude-code-agent-id.
    claude_code = CLIENTS["claude-code"]
    assert request_metadata(claude_code, "s", False, "ls", "s") == (None, "s")
    assert request_metadata(claude_code, "s/agent_001", True, "", "s") == ({"agent_id": "s/agent_001"}, "s")
    # The no-header profiles: nothing at all, not even on a sub-agent or a last turn.
    for name in ("no-header", "aiperf-no-header"):
        assert request_metadata(CLIENTS[name], "j", True, "") == (None, None)
        assert request_metadata(CLIENTS[name], "s/agent_001", False, "ls", "s") == (None, None)


# ----------------------------------------------------------------------
# Reply text
# ----------------------------------------------------------------------
@pytest.mark.unit
def test_reply_text_decodes_to_the_call_and_prose_to_none(text: ReplyText, decode: Any) -> None:
    reply = text.reply(11, 150, ("bash", {"command": "python -m pytest -q"}))
    assert len(reply) == 150
    call = extract_tool_call(decode(reply))
    assert call is not None and call.tool_key == "python -m pytest"
    prose = text.reply(11, 150, None)
    assert len(prose) == 150 and extract_tool_call(decode(prose)) is None
    # A call longer than the recorded reply is kept whole (a cut call parses as nothing).
    short = text.reply(5, 4, ("bash", {"command": "ls -la"}))
    assert len(short) > 4 and extract_tool_call(decode(short)).tool_key == "ls"
    think = text.reasoning(3, 40)
    assert len(think) == 40 and decode(think).startswith("<think>") and "</think>" in decode(think)
    assert text.reply(11, 150, None) == prose  # deterministic
    assert text.prose(1, 10) != text.prose(2, 10)


# ----------------------------------------------------------------------
# Prompt structure of each profile (synthetic jobs)
# ----------------------------------------------------------------------
@pytest.mark.unit
def test_tagged_is_the_replay_it_always_was() -> None:
    base = jobs_from_workload(_workload(), shared_system=True)
    tagged = jobs_from_workload(_workload(), shared_system=True, client=CLIENTS["tagged"])
    assert base == tagged
    assert all(not t.reply for j in tagged for t in j.turns)


@pytest.mark.unit
def test_headers_only_replies_carry_the_call_and_are_resent(text: ReplyText, decode: Any) -> None:
    raw = _workload()
    jobs = jobs_from_workload(raw, shared_system=True, client=CLIENTS["headers-only"], text=text)
    tagged = jobs_from_workload(raw, shared_system=True)
    book = TokenBook()
    for job, src, ref in zip(jobs, raw, tagged):
        assert job.arrival_s == ref.arrival_s and [t.think_s for t in job.turns] == [t.think_s for t in ref.turns]
        for k, turn in enumerate(job.turns):
            reply = job.reply_tokens(k, book)
            assert len(reply) == turn.output_tokens == src.turns[k].output_tokens  # 100-200 tokens hold a call
            call = extract_tool_call(decode(reply))
            if k < len(job.turns) - 1:
                assert call is not None and call.tool_key == tool_key_for_command(src.turns[k].tool_command)
                nxt = _prompt_ids(job, book, k + 1)
                prompt = _prompt_ids(job, book, k)
                assert nxt[: len(prompt) + len(reply)] == prompt + reply  # re-sent verbatim
                assert job.reusable_tokens(k + 1) == len(prompt) + len(reply) - 1
            else:
                assert call is None  # the final answer calls nothing


@pytest.mark.unit
def test_aiperf_drops_the_partial_block_and_the_reply(text: ReplyText) -> None:
    raw = _workload()
    jobs = jobs_from_workload(raw, shared_system=True, client=CLIENTS["aiperf"], text=text)
    tagged = jobs_from_workload(raw, shared_system=True)
    book = TokenBook()
    for job, ref in zip(jobs, tagged):
        for k in range(len(job.turns) - 1):
            prompt, nxt = _prompt_ids(job, book, k), _prompt_ids(job, book, k + 1)
            # Lengths are the exact client's; only the content past the full blocks differs.
            assert len(nxt) == ref.turns[k + 1].prompt_tokens
            full = len(prompt) // AIPERF_BLOCK_TOKENS * AIPERF_BLOCK_TOKENS
            assert _common(prompt, nxt) == full < len(prompt)  # the tail is not carried over
            reply = job.reply_tokens(k, book)
            assert nxt[len(prompt): len(prompt) + len(reply)] != reply  # the reply is not appended
            assert job.reusable_tokens(k + 1) == full


@pytest.mark.unit
def test_reasoning_is_dropped_from_the_next_prompts(text: ReplyText, decode: Any) -> None:
    raw = _workload()
    jobs = jobs_from_workload(raw, shared_system=True, client=CLIENTS["reasoning"], text=text)
    tagged = jobs_from_workload(raw, shared_system=True)
    book = TokenBook()
    for job, src, ref in zip(jobs, raw, tagged):
        dropped = 0
        for k in range(len(job.turns) - 1):
            turn = job.turns[k]
            think, answer = (book.tokens(s) for s in turn.reply)
            assert len(think) == split_reasoning(src.turns[k].output_tokens) and decode(think).startswith("<think>")
            prompt, nxt = _prompt_ids(job, book, k), _prompt_ids(job, book, k + 1)
            assert nxt[: len(prompt) + len(answer)] == prompt + answer  # the answer is kept ...
            assert _common(nxt[len(prompt):], think) == 0  # ... the reasoning is not
            call = extract_tool_call(decode(job.reply_tokens(k, book)))
            assert call is not None and call.tool_key == tool_key_for_command(src.turns[k].tool_command)
            assert job.reusable_tokens(k + 1) == len(prompt)  # the reply starts with what is dropped
            dropped += len(think)
            assert len(nxt) == ref.turns[k + 1].prompt_tokens - dropped


# ----------------------------------------------------------------------
# End to end: every profile replays to the end with every block free
# ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield write_config_dir(PROFILE, str(tmp_path_factory.mktemp("sim-clients") / "model"))


def _run(arm_name: str, jobs: list[SimJob], model_dir: str, client: ClientProfile,
         num_blocks: int = 4000) -> tuple[Any, Any, list[Any]]:
    """One arm over ``jobs``; returns (summary, records, the tool calls the
    plugin read from replies). The plugin's metrics land in
    ``records.counters["metrics"]``."""
    settings = simulate.SimSettings(PROFILE, RooflineStepModel(PROFILE), model_dir, num_blocks, client=client,
                                    tokenizer=TOKENIZER if client.needs_tokenizer else "")
    engine = simulate.build_engine(ARMS[arm_name], jobs, settings)
    calls: list[Any] = []
    replies = getattr(engine.scheduler, "replies", None)
    if replies is not None:
        inner = replies.tool_call

        def recording(meta: Any, request: Any, reply_text: str | None) -> Any:
            call = inner(meta, request, reply_text)
            calls.append(call)
            return call

        replies.tool_call = recording
    try:
        records = engine.run()
        records.counters["metrics"] = getattr(engine.scheduler, "continuum_metrics", None)
        free, usable = engine.free_blocks()
        assert free == usable, f"{usable - free} KV blocks held after the run"
    finally:
        engine.scheduler.shutdown()
    return simulate.summarize_run(arm_name, records), records, calls


@pytest.mark.parametrize("name", list(CLIENTS))
def test_every_profile_replays_to_the_end(name: str, model_dir: str, text: ReplyText) -> None:
    client = CLIENTS[name]
    # Five turns each and a shorter system prompt: a run of seconds.
    raw = [_short(j) for j in generate_jobs(coding_agent_workload(3, 0.5), 5)]
    jobs = jobs_from_workload(raw, shared_system=True, client=client, text=text if client.needs_tokenizer else None)
    summary, records, calls = _run("continuum", jobs, model_dir, client)
    assert set(records.job_finish_s) == {j.job_id for j in jobs}
    assert len(records.turns) == sum(len(j.turns) for j in jobs)
    if client.replies == "calls":
        keys = {c.tool_key for c in calls if c is not None}
        assert keys and keys <= {tool_key_for_command(t.tool_command) for j in raw for t in j.turns if t.tool}
        # Each job's final answer is read as no call, unless the client flags
        # it is_last_step: the job then ends without its reply being read.
        assert sum(c is None for c in calls) == (0 if client.metadata == "session-last" else len(jobs))
    if client.retention != "none":  # every request's directives reached the plugin, its holds all ended
        assert records.counters["metrics"].retention["accepted"] == len(records.turns)
    fcfs, _, _ = _run("fcfs", jobs, model_dir, client)
    assert fcfs.turns == summary.turns


def _short(job: Any, turns: int = 5, system: int = 2000) -> Any:
    """``job`` cut to ``turns`` turns (the last runs no tool) with a
    ``system``-token system prompt."""
    from benchmarks.workload import Job, Turn

    last = job.turns[turns - 1]
    kept = (*job.turns[: turns - 1], Turn(last.index, last.new_tokens, last.output_tokens, "", "", 0.0))
    return Job(job.job_id, job.arrival_s, system, kept)


# ----------------------------------------------------------------------
# Traces: text replies, the shared system prompt, sub-agents
# ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def sessions() -> list[Any]:
    from benchmarks.sim.traces import DEFAULT_TRACE_DIR, load_trace_dir

    loaded, _ = load_trace_dir(DEFAULT_TRACE_DIR)
    return loaded


def _by_id(sessions: list[Any], *ids: str) -> list[Any]:
    found = {s.session_id: s for s in sessions}
    return [found[i] for i in ids]


@pytest.mark.unit
def test_trace_replies_call_a_tool_only_before_a_tool_gap(sessions: list[Any], text: ReplyText,
                                                          decode: Any) -> None:
    from benchmarks.sim.trace_jobs import jobs_from_traces

    tagged = jobs_from_traces(sessions[:4], [0.0] * 4, max_turns=30, max_context_tokens=131072)
    jobs = jobs_from_traces(sessions[:4], [0.0] * 4, max_turns=30, max_context_tokens=131072,
                            client=CLIENTS["headers-only"], text=text)
    book = TokenBook()
    kinds: set[str] = set()
    for job, ref in zip(jobs, tagged):
        assert [t.prompt for t in job.turns] == [t.prompt for t in ref.turns]  # the same prompts
        for k, turn in enumerate(job.turns):
            call = extract_tool_call(decode(job.reply_tokens(k, book)))
            assert (call is not None) == (turn.tool_name == "tool_use")
            assert turn.output_tokens >= ref.turns[k].output_tokens
            kinds.add(turn.tool_name)
    assert {"tool_use", "user", ""} <= kinds


@pytest.mark.unit
def test_shared_system_prompt_is_one_prefix_for_every_session(sessions: list[Any]) -> None:
    from benchmarks.sim.trace_jobs import jobs_from_traces

    pair = sessions[:2]
    plain = jobs_from_traces(pair, [0.0, 0.0], max_turns=3, max_context_tokens=131072)
    shared = jobs_from_traces(pair, [0.0, 0.0], max_turns=3, max_context_tokens=131072, shared_system=True)
    book = TokenBook()
    a, b = (book.prompt(j.turns[0].prompt) for j in shared)
    prefix = min((s.system_tokens + s.tool_tokens) // s.block_size * s.block_size for s in pair)
    assert _common(a, b) >= prefix > 0
    pa, pb = (book.prompt(j.turns[0].prompt) for j in plain)
    assert _common(pa, pb) == 0  # hash ids are per session: nothing shared without the option
    for s, p in zip(shared, plain):  # only content keys change
        assert [t.prompt_tokens for t in s.turns] == [t.prompt_tokens for t in p.turns]
        assert [t.think_s for t in s.turns] == [t.think_s for t in p.turns]
        assert [s.reusable_tokens(k) for k in range(len(s.turns))] == \
            [p.reusable_tokens(k) for k in range(len(p.turns))]


@pytest.mark.unit
def test_subagents_are_jobs_under_the_parents_session(sessions: list[Any]) -> None:
    from benchmarks.sim.trace_jobs import jobs_from_traces

    (session,) = _by_id(sessions, "trace_0277")
    jobs = jobs_from_traces([session], [5.0], max_context_tokens=131072, subagents=True)
    main, *subs = jobs
    assert main.job_id == "trace_0277" and not main.parent and main.arrival_s == 5.0
    assert [s.job_id for s in subs] == [f"trace_0277/{a.agent_id}" for a in session.subagents]
    book = TokenBook()
    parent = book.prompt(main.turns[0].prompt)
    for sub, agent in zip(subs, session.subagents):
        assert sub.parent == "trace_0277" and sub.session == "trace_0277"
        assert sub.blocking == (agent.status == "completed")
        assert len(sub.turns) == len(agent.requests)
        assert _common(parent, book.prompt(sub.turns[0].prompt)) == 0  # no block shared with the parent
    # The first three (Explore) are launched by the first request (t=0,
    # 18.8 s long) and the parent's next request (t=228) waits for the last.
    for sub, agent in zip(subs[:3], session.subagents[:3]):
        assert sub.launch_after == 0 and sub.arrival_s == pytest.approx(19.5 - 18.78, abs=0.5)
        assert sub.resume_s == pytest.approx(min(120.0, 228.0 - agent.end_s))
    # Sub-agents of one type share their system prompt within the session.
    first = [book.prompt(s.turns[0].prompt) for s in subs]
    assert _common(first[0], first[1]) >= 64 * 100
    assert jobs_from_traces([session], [5.0], max_context_tokens=131072) == [main]


@pytest.mark.parametrize("name", ["tagged", "headers-only"])
def test_subagents_replay_and_hold_their_parent(name: str, sessions: list[Any], model_dir: str,
                                                text: ReplyText) -> None:
    from benchmarks.sim.trace_jobs import jobs_from_traces

    client = CLIENTS[name]
    chosen = _by_id(sessions, "trace_0277", "trace_0291")
    jobs = jobs_from_traces(chosen, [0.0, 30.0], unit_tokens=8, max_turns=20, max_context_tokens=32768,
                            max_output_tokens=200, client=client, text=text if client.needs_tokenizer else None,
                            shared_system=True, subagents=True)
    subs = [j for j in jobs if j.parent]
    assert len(subs) >= 4
    _, records, calls = _run("continuum", jobs, model_dir, client)
    # Only sessions have a JCT; every conversation's every turn ran.
    assert set(records.job_finish_s) == {"trace_0277", "trace_0291"}
    assert len(records.turns) == sum(len(j.turns) for j in jobs)
    ends = {r.job_id: r.finish_s for r in records.turns}
    for r in records.turns:
        ends[r.job_id] = max(ends[r.job_id], r.finish_s)
    arrivals = {(r.job_id, r.turn): r.arrival_s for r in records.turns}
    held = {(s.parent, s.launch_after + 1) for s in subs if s.blocking}
    assert {p for p, _ in held} == {"trace_0277", "trace_0291"}
    assert any(key in arrivals for key in held)
    for parent, turn in held:
        mine = [s for s in subs if s.blocking and (s.parent, s.launch_after + 1) == (parent, turn)]
        if (parent, turn) in arrivals:
            # The parent's next turn came after its blocking sub-agents finished.
            assert arrivals[(parent, turn)] == pytest.approx(max(ends[s.job_id] + s.resume_s for s in mine))
    if client.replies == "calls":
        assert any(c is not None for c in calls)
    metrics = records.counters["metrics"]
    if client.metadata == "session":
        # Under the parent's session id a sub-agent (it shares no block with
        # the parent) starts a conversation of its own -- except one whose
        # first prompt all but repeats a sibling's launched with it (the
        # traces' parallel Explore agents share 1440 of ~1460 tokens): the
        # prefix rule takes it for the sibling's next turn.
        assert 1 <= metrics.conversations_started <= len(subs)
        assert metrics.context_mismatches == 0
    else:
        assert metrics.conversations_started == 0  # tagged sub-agents name jobs of their own


# ----------------------------------------------------------------------
# The directives profile: vLLM PR #38514's ContinuumPolicy directives
# ----------------------------------------------------------------------
@pytest.mark.unit
def test_directives_profile_declares_system_history_and_tail():
    from benchmarks.sim.clients import CLIENTS, retention_directives

    assert CLIENTS["directives"].retention == "continuum-policy" and CLIENTS["directives"].metadata == "session"
    got = retention_directives(6000, 20000, 20700, next_think_s=3.5)
    assert got == [{"start": 0, "end": 6000, "priority": 90, "duration": 600.0},
                   {"start": 6000, "end": 20000, "priority": 70, "duration": 3.5},
                   {"start": 20000, "end": 20700, "priority": 50, "duration": 3.5}]
    # A first turn has no history; a last turn declares only the system prompt.
    assert [d["priority"] for d in retention_directives(6000, 0, 8000, 2.0)] == [90, 50]
    assert retention_directives(6000, 20000, 20700, None) == [got[0]]
    # What the plugin's parser accepts as is.
    from vllm_continuum_plugin.metadata import parse_metadata

    assert len(parse_metadata({"retention_directives": got}).retention.ranges) == 3
