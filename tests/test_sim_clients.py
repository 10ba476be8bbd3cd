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
import sys
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
# The client-profile report (scripts/clients_report.py)
# ----------------------------------------------------------------------
def _clients_report():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "clients_report.py")
    spec = importlib.util.spec_from_file_location("clients_report_under_test", path)
    report = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = report  # its dataclasses look their module up
    spec.loader.exec_module(report)
    return report


def _client_points(report, continuum: dict[str, float], profiles: tuple[str, ...] | None = None) -> list[dict]:
    """fcfs 200 s, oracle 100 s for every profile; continuum as given."""
    out = []
    for c in profiles or report.CLIENT_PROFILES:
        for a, jct in (("fcfs", 200.0), ("continuum", continuum[c]), ("oracle", 100.0)):
            out.append({"client": c, "arm": a, "jct_mean_s": jct, "jct_p90_s": jct, "ttft_mean_s": 0.1,
                        "hit_share": 0.4, "recomputed_tokens": 0, "pins_created": 3, "pins_handed_over": 1,
                        "pins_expired": 1, "pins_released_under_pressure": 1,
                        "gap_closed": None if a == "fcfs" else (200.0 - jct) / 100.0})
    return out


@pytest.mark.unit
def test_clients_report_verdict_states_each_bar_from_the_figures() -> None:
    report = _clients_report()
    # tagged closes 60%; headers-only 56% (within 5 points), aiperf 50%
    # (trails by 10), reasoning slower than FCFS.
    pts = _client_points(report, {"tagged": 140.0, "headers-only": 144.0, "aiperf": 150.0, "reasoning": 210.0})
    caps = [{"client": c, "arm": f"fcfs-cap{k}", "jct_mean_s": jct, "jct_p90_s": jct, "ttft_mean_s": 0.1,
             "hit_share": 0.9} for c in ("tagged", *report.CAP_CLIENTS) for k, jct in ((12, 145.0), (8, 170.0))]
    lines = report.high_verdict(pts, caps, spread=True)
    by = {line.split("`")[1]: line for line in lines[1:]}
    assert "`fcfs-cap12` at 145.0 s" in lines[0]
    assert "within 5 points): **holds**" in by["headers-only"]
    assert "ahead): **holds**" in by["headers-only"]  # 144 < 145
    assert "(>= 2x): **misses**" in by["headers-only"]  # 200/144 = 1.39x
    assert "(>= 75%): **misses**" in by["headers-only"]
    assert "within 5 points): **misses**" in by["aiperf"]
    assert "(never slower): **misses**" in by["reasoning"]
    assert "(>= 2x)" not in by["tagged"]  # the spread bars are headers-only's
    rows = report.client_table(pts, caps)
    assert any(r.startswith("| aiperf | continuum | 150.0 | 1.33x | +7.1% |") for r in rows)
    assert rows[-6].startswith("| tagged | fcfs-cap8 |") and rows[-5].startswith("| tagged | fcfs-cap12 |")
    assert rows[-1].startswith("| reasoning | fcfs-cap12 |")
    low = report.low_verdict(_client_points(report, {"tagged": 200.0, "headers-only": 201.0,
                                                    "aiperf": 203.0, "reasoning": 199.0}))
    assert [("holds" in line) for line in low] == [True, True, False, True]


@pytest.mark.unit
def test_clients_report_says_what_the_session_end_is_worth_to_aiperf() -> None:
    report = _clients_report()
    # tagged closes 60%, aiperf 40% (20 points short); flagging the last
    # request brings it to 58%: 90% of the shortfall, within 5 points.
    pts = _client_points(report, {"tagged": 140.0, "headers-only": 144.0, "aiperf": 160.0, "reasoning": 150.0})
    last = _client_points(report, {report.LAST_STEP_PROFILE: 142.0}, (report.LAST_STEP_PROFILE,))
    caps = [{"client": c, "arm": "fcfs-cap12", "jct_mean_s": 141.0} for c in ("tagged", "aiperf")]
    lines = report.last_step_lines(pts, last, caps)
    assert lines[2].startswith("| aiperf | continuum | 160.0 | 1.25x | +14.3% |")
    assert lines[3].startswith("| aiperf-last-step | continuum | 142.0 | 1.41x | +1.4% |")
    verdict = lines[-1]
    assert "gap +58.0% against tagged's +60.0% (within 5 points): **holds**" in verdict
    assert "(never slower): **holds**" in verdict
    assert "+0.7% against the best cap (ahead): **misses**" in verdict  # 142 > 141
    assert "recovers 90% of `aiperf`'s 20.0-point shortfall" in verdict
    # No shortfall to recover: no share is claimed.
    even = _client_points(report, {"tagged": 140.0, "headers-only": 144.0, "aiperf": 138.0, "reasoning": 150.0})
    assert "recovers" not in report.last_step_lines(even, last, caps)[-1]
    # The flag gains more than the shortfall: said so, not as a share over 100%.
    flagged = _client_points(report, {report.LAST_STEP_PROFILE: 130.0}, (report.LAST_STEP_PROFILE,))
    passes = report.last_step_lines(pts, flagged, caps)[-1]
    assert "closes `aiperf`'s 20.0-point shortfall to `tagged` and passes it by 10.0 points" in passes  # 70% against 60%
    assert "recovers" not in passes


@pytest.mark.unit
def test_clients_report_says_which_missing_signal_costs_what() -> None:
    _clients_report()  # loads the report's modules (scripts.*) as the report does
    from scripts.clients_signals import signal_lines

    def seed(fcfs: float, oracle: float, continuum: dict[str, float]) -> list[dict]:
        # Only the tagged client's FCFS and oracle: the signal profiles send its prompts.
        return [{"client": "tagged", "arm": "fcfs", "jct_mean_s": fcfs},
                {"client": "tagged", "arm": "oracle", "jct_mean_s": oracle},
                *({"client": c, "arm": "continuum", "jct_mean_s": j} for c, j in continuum.items())]

    # Gap shares: seed 7 (FCFS 200, oracle 100): tagged 60%, headers-only 40%,
    # headers-last 45%, headers-own 55%, both 65%; seed 8 (300 -> 100) the same
    # shares. headers-only is 20 points short; the own ids recover 75% of it.
    shares = {"tagged": 0.6, "headers-only": 0.4, "headers-last": 0.45, "headers-own": 0.55, "headers-last-own": 0.65}
    lines = signal_lines({8: seed(300.0, 100.0, {c: 300.0 - g * 200.0 for c, g in shares.items()}),
                          7: seed(200.0, 100.0, {c: 200.0 - g * 100.0 for c, g in shares.items()})})
    assert lines[0] == "| client | seed 7 | seed 8 | mean gap closed |"
    assert lines[2] == "| headers-only | +40.0% | +40.0% | +40.0% |"
    assert lines[6] == "| tagged | +60.0% | +60.0% | +60.0% |"
    assert "`headers-only`: 20.0 points behind `tagged` on the mean." in lines
    assert ("- `headers-last`: +45.0%, 15.0 points behind `tagged`; 25% of `headers-only`'s 20.0-point shortfall "
            "recovered.") in lines
    assert ("- `headers-own`: +55.0%, 5.0 points behind `tagged`; 75% of `headers-only`'s 20.0-point shortfall "
            "recovered.") in lines
    # More than the shortfall: said so, not as a share over 100%.
    assert "- `headers-last-own`: +65.0%, 5.0 points ahead of `tagged`; it closes `headers-only`'s 20.0-point shortfall." \
        in lines
    # headers-only ahead of tagged (no shortfall): no share is claimed.
    ahead = signal_lines({7: seed(200.0, 100.0, {**{c: 200.0 - g * 100.0 for c, g in shares.items()}, "tagged": 170.0})})
    assert "`headers-only`: 10.0 points ahead of `tagged` on the mean." in ahead
    assert not any("shortfall" in line for line in ahead)
    from scripts.clients_signals import signal_summary
    assert signal_summary("trace, x, 1", {7: seed(200.0, 100.0, {c: 200.0 - g * 100.0 for c, g in shares.items()})}) == (
        "- trace, x, 1: headers-only +40%, headers-last +45%, headers-own +55%, headers-last-own +65%, tagged +60%")
    # A seed without one of the profiles is an error naming it, not a silent row.
    partial = seed(200.0, 100.0, {c: 150.0 for c in shares if c != "headers-own"})
    with pytest.raises(ValueError, match="seed 9: no point for headers-own continuum"):
        signal_lines({9: partial})
    # The signal profiles are compared with the caps over the tagged client's prompts.
    from scripts.clients_bars import PROMPTS_OF
    assert all(PROMPTS_OF[c] == "tagged" for c in ("headers-last", "headers-own", "headers-last-own"))


@pytest.mark.unit
def test_clients_report_holds_each_profile_to_the_caps_over_its_own_prompts() -> None:
    report = _clients_report()
    # aiperf's prompts make every arm slower: its continuum (150 s) trails
    # the caps over the tagged client's prompts (145 s) but is ahead of the
    # same caps over its own (152 s); aiperf-last-step and aiperf-no-header
    # send aiperf's prompts, headers-only and no-header the tagged client's.
    pts = _client_points(report, {"tagged": 140.0, "headers-only": 144.0, "aiperf": 150.0, "reasoning": 150.0})
    caps = [{"client": c, "arm": f"fcfs-cap{k}", "jct_mean_s": jct, "jct_p90_s": jct, "ttft_mean_s": 0.1,
             "hit_share": 0.9}
            for c, k, jct in (("tagged", 12, 145.0), ("tagged", 16, 147.0), ("aiperf", 12, 153.0),
                              ("aiperf", 16, 152.0), ("reasoning", 12, 149.0))]
    lines = report.high_verdict(pts, caps, spread=False)
    by = {line.split("`")[1]: line for line in lines[1:]}
    assert "`fcfs-cap12` at 145.0 s over the tagged client's prompts" in lines[0]
    assert "`fcfs-cap16` at 152.0 s over `aiperf`'s" in lines[0]
    assert "-1.3% against the best cap (ahead): **holds**" in by["aiperf"]  # 150 / 152
    assert "+0.7% against the best cap (ahead): **misses**" in by["reasoning"]  # 150 / 149
    assert "-0.7% against the best cap (ahead): **holds**" in by["headers-only"]  # 144 / 145
    assert report.best_cap(caps, report.LAST_STEP_PROFILE)["jct_mean_s"] == 152.0
    assert report.best_cap(caps, "aiperf-no-header")["jct_mean_s"] == 152.0
    assert report.best_cap(caps, "no-header")["jct_mean_s"] == 145.0
    with pytest.raises(ValueError, match="'reasoning'"):
        report.best_cap([c for c in caps if c["client"] != "reasoning"], "reasoning")
    # Each cap row names the prompts it ran over and its gap against that
    # client's own FCFS and oracle.
    rows = report.client_table(pts, caps)
    assert "| aiperf | fcfs-cap16 | 152.0 | 1.32x | | 152.0 | 0.10 | 90.0% | | +48.0% |" in rows
    assert rows.index(next(r for r in rows if r.startswith("| tagged | fcfs-cap12"))) < \
        rows.index(next(r for r in rows if r.startswith("| aiperf | fcfs-cap12")))


@pytest.mark.unit
def test_clients_report_checks_the_bar_on_the_mean_over_seeds() -> None:
    report = _clients_report()
    # tagged closes 60%, 40%, 50% (mean 50%); headers-only 58%, 30%, 50%
    # (mean 46%: within 5 points on the mean, though 10 points short at the
    # second seed); aiperf 40% at every seed (10 short); reasoning slower
    # than FCFS at the third seed.
    gaps = {"tagged": (140.0, 160.0, 150.0), "headers-only": (142.0, 170.0, 150.0),
            "aiperf": (160.0, 160.0, 160.0), "reasoning": (140.0, 150.0, 205.0)}
    by_seed = {seed: _client_points(report, {c: g[i] for c, g in gaps.items()}) for i, seed in enumerate((7, 8, 9))}
    lines = report.seed_lines(by_seed)
    assert lines[0] == "| client | seed 7 | seed 8 | seed 9 | mean gap closed |"
    assert lines[2] == "| FCFS (tagged): JCT mean, hit share | 200 s, 40% | 200 s, 40% | 200 s, 40% | |"
    assert "| headers-only | +58.0% (1.41x) | +30.0% (1.18x) | +50.0% (1.33x) | +46.0% |" in lines
    by = {line.split("`")[1]: line for line in lines if line.startswith("- ")}
    assert "mean gap +46.0% against tagged's +50.0% (within 5 points; 2 of 3 seeds within): **holds**" \
        in by["headers-only"]
    assert "mean gap +40.0% against tagged's +50.0% (within 5 points; 1 of 3 seeds within): **misses**" \
        in by["aiperf"]  # within only where tagged closed 40%
    assert "0.98x FCFS at its slowest seed (faster on every seed): **misses**" in by["reasoning"]
    assert "within 5 points" not in by["tagged"] and "(faster on every seed): **holds**" in by["tagged"]
    # README's line: each profile's mean, the same figures.
    assert report.seed_summary("trace, h100-llama8b, 1", by_seed) == \
        "- trace, h100-llama8b, 1: tagged +50%, headers-only +46%, aiperf +40%, reasoning +35%"


@pytest.mark.unit
def test_clients_report_checks_the_best_cap_on_the_mean_over_seeds() -> None:
    report = _clients_report()
    # The caps run at every seed; the best one is chosen per seed and per
    # prompts. aiperf trails the best cap by 2% at seed 7 but leads by 4%
    # and 1% at the others (mean ahead); aiperf-no-header trails at two
    # seeds and on the mean; the no-header profiles join the gap table.
    jcts = {"tagged": (120.0, 118.0, 119.0), "headers-only": (122.0, 121.0, 120.0),
            "aiperf": (133.0, 125.0, 128.0), "reasoning": (121.0, 120.0, 119.0)}
    nh = {"no-header": (122.0, 121.0, 120.0), "aiperf-no-header": (134.0, 133.0, 127.0)}
    cap = {"tagged": (130.0, 132.0, 128.0), "aiperf": (130.4, 130.2, 129.3), "reasoning": (128.0, 129.0, 127.0)}
    seeds = (7, 8, 9)
    by_seed = {seed: [*_client_points(report, {c: j[i] for c, j in jcts.items()}),
                      *_client_points(report, {c: j[i] for c, j in nh.items()}, report.NO_HEADER_PROFILES)]
               for i, seed in enumerate(seeds)}
    caps_by_seed = {seed: [{"client": c, "arm": arm, "jct_mean_s": jct}
                           for c, j in cap.items() for arm, jct in (("fcfs-cap16", j[i]), ("fcfs-cap8", j[i] + 50))]
                    for i, seed in enumerate(seeds)}
    lines = report.seed_lines(by_seed, caps_by_seed, spread=True)
    assert any(line.startswith("| aiperf-no-header | +66.0% (1.49x) |") for line in lines)
    by = {line.split("`")[1]: line for line in lines if line.startswith("- ") and "best cap" in line}
    assert "+2.0% against the best cap" not in by["aiperf"]
    assert "-1.0% against the best cap on the mean (ahead; 2 of 3 seeds ahead): **holds**" in by["aiperf"]
    assert "+1.0% against the best cap on the mean (ahead; 1 of 3 seeds ahead): **misses**" in by["aiperf-no-header"]
    assert "(ahead; 3 of 3 seeds ahead): **holds**" in by["tagged"]
    assert "| best cap over `aiperf`'s prompts | `fcfs-cap16` 130.4 s | `fcfs-cap16` 130.2 s | `fcfs-cap16` 129.3 s | |" \
        in lines
    assert "| aiperf | +2.0% | -4.0% | -1.0% | -1.0% |" in lines
    # The spread preset's headers-only bars, at every seed.
    verdicts = {line.split("`")[1]: line for line in lines if line.startswith("- ") and "best cap" not in line}
    assert "1.64x lower mean JCT at its slowest seed (>= 2x): **misses**" in verdicts["headers-only"]
    assert "(>= 75%)" not in verdicts["tagged"]
    # Without the caps at every seed: no cap table.
    assert not any("best cap" in line for line in report.seed_lines(by_seed))


@pytest.mark.unit
def test_clients_report_points_are_commands_the_simulator_takes() -> None:
    report = _clients_report()
    for wl in report.WORKLOADS:
        for prof in report.PROFILES:
            low, high = wl.loads[prof]
            assert 0 < low < high
            simulate.build_parser().parse_args([*wl.argv, "--profile", prof, "--rate", f"{high:g}",
                                                "--client", ",".join(report.CLIENT_PROFILES)])
            simulate.build_parser().parse_args([*wl.argv, "--profile", prof, "--rate", f"{high:g}",
                                                "--policies", report.CAPS, "--client", ",".join(report.CAP_CLIENTS)])


@pytest.mark.unit
def test_clients_report_writes_readme_block_between_its_markers(tmp_path) -> None:
    report = _clients_report()
    pts = _client_points(report, {"tagged": 140.0, "headers-only": 144.0, "aiperf": 150.0, "reasoning": 210.0})
    caps = [{"client": "tagged", "arm": "fcfs-cap12", "jct_mean_s": 145.0}]
    row = report.summary_row("trace, h100-llama8b, 1", pts, caps)
    assert row == "| trace, h100-llama8b, 1 | 40% | +55% (fcfs-cap12) | +60% (1.43x) | +56% (1.39x) | +50% (1.33x) | -10% (0.95x) |"
    last = _client_points(report, {report.LAST_STEP_PROFILE: 142.0}, (report.LAST_STEP_PROFILE,))
    assert report.summary_row("t", pts, caps, last).endswith("| -10% (0.95x) | +58% (1.41x) |")
    nh = _client_points(report, {"no-header": 146.0, "aiperf-no-header": 152.0}, report.NO_HEADER_PROFILES)
    assert report.summary_row("t", pts, caps, last, nh).endswith("| +58% (1.41x) | +54% (1.37x) | +48% (1.32x) |")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.README_BEGIN}\nold\n{report.README_END}\nafter\n")
    report.write_readme_block(str(readme), [row], str(tmp_path / "docs" / "retention_clients.md"))
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("\nafter\n") and "old" not in text
    assert row in text and "(docs/retention_clients.md)" in text
    assert "over arrival seeds" not in text  # no point ran at several seeds
    report.write_readme_block(str(readme), [row], str(tmp_path / "docs" / "retention_clients.md"), ["- t: tagged +50%"])
    text = readme.read_text()
    assert text.index(row) < text.index("Mean gap closed over arrival seeds 7, 8, 9") < text.index("- t: tagged +50%")
    assert text.endswith(f"- t: tagged +50%\n{report.README_END}\nafter\n")
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no <!-- clients-report"):
        report.write_readme_block(str(readme), [row], str(tmp_path / "d.md"))


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
