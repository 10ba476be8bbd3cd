"""kv-cache-tester trace sessions (``traces``) as the simulator's jobs.

A session's main conversation is one :class:`~.jobs.SimJob`; each of its
requests is a turn. Each 64-token hash id is one segment (keys scoped to the
session, as the trace's ``"local"`` hash-id scope says); the prompt's
remainder past its last full block is a segment of its own, which the next
prompt does not re-send (its block there has a new id: the trace cannot say
that the tokens are the same). So a trace turn's prompt is what AIPerf
rebuilds from the hash ids, whatever the client profile.

Two options bring the replay closer to what a Claude Code deployment sends:

* ``shared_system``: the system prompt and tool definitions
  (``system_tokens + tool_tokens``, inside each prompt) are one content
  for every session -- the blocks they fill are keyed by position, not by
  session, so sessions share ``min`` of their prefixes (tools render first:
  a harness's tool set is the common part). Sub-agents share theirs by
  sub-agent type.
* ``subagents``: the trace's sub-agents (``"type": "subagent"`` entries) are
  jobs of their own under the parent's session id, launched when the parent
  request that started them finishes; a completed one (Claude Code's
  synchronous ``Task``) holds the parent's next request until it has
  finished, an ``async_launched`` one does not.

Invariants: the arrivals, token counts and gaps of the main conversation do
not depend on the client profile or on these options (only the content
keys of the shared prefix change, and the gap after a blocking sub-agent is
the trace's gap from the sub-agent's end); every sub-agent's parent is the
job before it in the returned list's order of its session.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .clients import TAGGED, ClientProfile, ReplyText, reply_segments, trace_tool_call
from .jobs import Segment, SimJob, SimTurn, stable_key
from .traces import TraceRequest, TraceSession, TraceSubagent

__all__ = ["jobs_from_traces"]

# A sub-agent starts within about a second of the end of the parent request
# that launched it (traces' module doc); its launcher is the last main
# request started before then.
_LAUNCH_SLACK_S = 1.0


@dataclass(frozen=True)
class _Limits:
    unit: int  # tokens per trace hash block in the replay
    max_turns: int | None
    max_context_tokens: int | None
    max_think_s: float
    max_output_tokens: int | None


def jobs_from_traces(
    sessions: Sequence[TraceSession],
    arrivals: Sequence[float],
    *,
    unit_tokens: int | None = None,
    max_turns: int | None = None,
    max_context_tokens: int | None = None,
    max_think_s: float = 120.0,
    max_output_tokens: int | None = None,
    client: ClientProfile = TAGGED,
    text: ReplyText | None = None,
    shared_system: bool = False,
    subagents: bool = False,
) -> list[SimJob]:
    """kv-cache-tester sessions as jobs, session ``i`` arriving at ``arrivals[i]``.

    * Each main-conversation request is a turn; sub-agent requests become
      jobs of their own with ``subagents`` (else they are left out).
    * ``unit_tokens``: tokens per trace hash block (default: the trace's own
      ``block_size``, 64); a smaller unit scales every prompt down by the same
      factor while keeping its prefix structure (for a CPU replay).
    * A turn's tool is ``"user"`` after an ``end_turn`` (a person's reply)
      and ``"tool_use"`` otherwise (a tool stop, or a streamed request whose
      stop the trace did not record); its gap is the trace's
      ``think_time``, capped at ``max_think_s`` (idle users come back after
      hours; such a gap frees any pin under every policy).
    * A conversation ends at its first turn whose prompt plus reply would
      exceed ``max_context_tokens`` (the model's length limit), or after
      ``max_turns``.
    * ``client``: text replies (``text`` required) are prose ending in a
      Claude Code tool call on a ``"tool_use"`` turn, prose alone before a
      user's reply and on the last turn.
    """
    if len(arrivals) < len(sessions):
        raise ValueError(f"{len(sessions)} sessions need as many arrivals, got {len(arrivals)}")
    if client.needs_tokenizer and text is None:
        raise ValueError(f"client {client.name!r} has text replies: jobs_from_traces needs a ReplyText")
    out: list[SimJob] = []
    for session, arrival in zip(sessions, arrivals):
        limits = _Limits(unit_tokens or session.block_size, max_turns, max_context_tokens, max_think_s,
                         max_output_tokens)
        sid = session.session_id
        main = session.main_requests()
        prefix = (session.system_tokens + session.tool_tokens) // session.block_size if shared_system else 0
        turns, turn_of = _conversation(session, main, "", prefix, ("main",), limits, client, text)
        if not turns:
            continue
        out.append(SimJob(sid, float(arrival), tuple(turns)))
        if subagents:
            out += _subagents(session, main, turn_of, len(turns), limits, client, text, shared_system)
    return out


def _conversation(
    session: TraceSession, requests: Sequence[TraceRequest], agent: str, prefix_blocks: int,
    prefix_scope: tuple[str, ...], limits: _Limits, client: ClientProfile, text: ReplyText | None,
) -> tuple[list[SimTurn], list[int]]:
    """One conversation's turns, and for each request the turn it became
    (-1: skipped or past the conversation's end). ``prefix_blocks``: how
    many leading blocks of its first prompt are the content shared across
    sessions (keyed by ``prefix_scope`` and position)."""
    sid = session.session_id
    unit = limits.unit
    scale = unit / session.block_size
    shared: dict[int, int] = {}
    if prefix_blocks and requests:
        shared = {h: p for p, h in enumerate(requests[0].hash_ids[:prefix_blocks])}
    # One Segment per hash id, shared by every turn that re-sends it: a
    # session re-sends its history each turn (~1M block references in the
    # shipped subset, ~60k distinct).
    blocks: dict[int, Segment] = {}
    turns: list[SimTurn] = []
    turn_of = [-1] * len(requests)
    prev_stop = ""
    for i, req in enumerate(requests):
        if limits.max_turns is not None and len(turns) >= limits.max_turns:
            break
        full = len(req.hash_ids)
        rest = max(0, round((req.input_tokens - full * session.block_size) * scale))
        prompt = []
        for h in req.hash_ids:
            seg = blocks.get(h)
            if seg is None:
                p = shared.get(h)
                key = stable_key(sid, h) if p is None else stable_key("trace-shared-prefix", *prefix_scope, p)
                seg = blocks[h] = Segment(key, unit)
            prompt.append(seg)
        if rest:
            prompt.append(Segment(stable_key(sid, agent, i, "tail") if agent else stable_key(sid, i, "tail"), rest))
        if not prompt:
            continue
        output = max(1, round(req.output_tokens * scale))
        if limits.max_output_tokens is not None:
            output = min(output, limits.max_output_tokens)
        tokens = sum(s.length for s in prompt)
        if limits.max_context_tokens is not None and tokens + output > limits.max_context_tokens:
            break
        think = 0.0 if not turns else min(max(0.0, _think_s(requests, i)), limits.max_think_s)
        if turns:  # the previous turn's tool is known now
            turns[-1] = replace(turns[-1], tool_name="user" if prev_stop == "end_turn" else "tool_use")
        turn_of[i] = len(turns)
        turns.append(SimTurn(tuple(prompt), output, think, ""))
        prev_stop = req.stop
    if client.needs_tokenizer:
        turns = _with_text_replies(sid, agent, turns, limits, client, text)
        turn_of = [t if t < len(turns) else -1 for t in turn_of]
    return turns, turn_of


def _with_text_replies(sid: str, agent: str, turns: list[SimTurn], limits: _Limits, client: ClientProfile,
                       text: ReplyText | None) -> list[SimTurn]:
    """``turns`` with the client's reply text; the conversation ends before a
    turn whose longer reply (a call that did not fit) passes the length
    limit."""
    out: list[SimTurn] = []
    for k, turn in enumerate(turns):
        key = stable_key(sid, agent, k, "reply")
        call = trace_tool_call(key) if turn.tool_name == "tool_use" else None

        def segment(tag: str, ids: Sequence[int], k: int = k) -> Segment:
            return Segment.text(stable_key(sid, agent, k, "text", tag), ids)

        reply, _ = reply_segments(segment, client, text, key, turn.output_tokens, call)
        output = sum(s.length for s in reply)
        if limits.max_context_tokens is not None and turn.prompt_tokens + output > limits.max_context_tokens:
            break
        out.append(replace(turn, output_tokens=output, reply=reply))
    return out


def _subagents(
    session: TraceSession, main: Sequence[TraceRequest], turn_of: list[int], main_turns: int, limits: _Limits,
    client: ClientProfile, text: ReplyText | None, shared_system: bool,
) -> list[SimJob]:
    """The session's sub-agents as jobs launched by the main conversation's
    turns (those whose launching request is not a turn are left out)."""
    out: list[SimJob] = []
    sid = session.session_id
    for sub in session.subagents:
        launcher = _launcher(main, sub)
        if launcher is None or turn_of[launcher] < 0 or not sub.requests:
            continue
        prefix = (sub.system_tokens + sub.tool_tokens) // session.block_size if shared_system else 0
        turns, _ = _conversation(session, sub.requests, sub.agent_id, prefix, ("subagent", sub.subagent_type),
                                 limits, client, text)
        if not turns:
            continue
        req = main[launcher]
        delay = min(max(0.0, sub.start_s - (req.t + (req.api_time_s or 0.0))), limits.max_think_s)
        blocking = sub.status == "completed" and sub.duration_ms is not None
        resume = 0.0
        if blocking and launcher + 1 < len(main) and turn_of[launcher] + 1 < main_turns:
            resume = min(max(0.0, main[launcher + 1].t - sub.end_s), limits.max_think_s)
        out.append(SimJob(f"{sid}/{sub.agent_id}", delay, tuple(turns), parent=sid, launch_after=turn_of[launcher],
                          blocking=blocking, resume_s=resume, session_id=sid))
    return out


def _launcher(main: Sequence[TraceRequest], sub: TraceSubagent) -> int | None:
    """Index of the main request that launched ``sub``: the last one started
    by ``sub``'s start (plus the traces' ~1 s rounding); None if none."""
    best: int | None = None
    for i, req in enumerate(main):
        if req.t > sub.start_s + _LAUNCH_SLACK_S:
            break
        best = i
    return best


def _think_s(requests: Sequence[Any], i: int) -> float:
    """The gap before request ``i``: the trace's ``think_time``, or where a
    file lacks it, the time between the previous request's end and this one's
    start (``t`` is whole seconds, so this fallback is coarse)."""
    req = requests[i]
    if req.think_time_s is not None:
        return float(req.think_time_s)
    prev = requests[i - 1]
    return float(req.t - prev.t - (prev.api_time_s or 0.0))
