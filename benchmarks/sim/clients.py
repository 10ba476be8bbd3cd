"""What a client sends: the simulator's client profiles.

The plugin is documented for clients that tag every request (``job_id``, an
exact ``is_last_step``, a ``tool_name`` that tells a tool gap from a human
one) and re-send each reply verbatim. Real clients do less. A profile fixes,
for the same jobs and the same arrivals, what the simulated client does on
three axes:

* **metadata** -- ``tagged``: the plugin's job metadata in
  ``SamplingParams.extra_args`` (job id, ``is_last_step`` on every request,
  False included, and the tool name on a turn that runs one); ``session``:
  only a session id on the request (``Request.session_id``, what vLLM's API
  server sets from the ``X-Session-ID`` header), as AIPerf
  (``--session-header``), Claude Code and other harnesses send. The plugin
  then finds conversations by shared prefix and ends a task by reading the
  final answer; ``session-last``: the session id, and ``is_last_step: true``
  on a conversation's last request only (nothing on the others) -- what a
  replay tool that knows each conversation's final turn can add as a
  per-turn body field (AIPerf knows it, ``is_final_turn``, and its trace
  datasets' per-turn ``extra`` merges such a field into the request body;
  its ``weka_trace`` replay sends none); ``none``: nothing at all -- no job
  id, no session header (AIPerf with its default ``X-Session-Affinity``
  turned off -- without ``--session-header`` AIPerf 0.13 still sends that
  header, one of the plugin's ``session_headers`` -- or a client behind a
  proxy that drops headers). The plugin then has only the prompts
  to go by (implicit jobs, ``vllm_continuum_plugin.implicit_jobs``).
* **history** -- how turn ``k + 1``'s prompt re-sends turn ``k``:
  ``exact`` (the prompt and the reply verbatim, then the new tokens);
  ``aiperf`` (rebuilt from hash blocks as AIPerf's trace datasets do: the
  full blocks of the previous prompt, then fresh content -- the previous
  prompt's partial last block is not carried over and the reply is not
  appended); ``reasoning`` (each reply opens with a reasoning section that
  the next prompts drop, as chat templates strip ``<think>`` from history).
* **replies** -- ``scripted``: token ids no tokenizer reads (the plugin
  sees no text: its scheduler is built without a tokenizer); ``calls``: text
  a tokenizer made -- prose ending in a Hermes ``<tool_call>`` with the
  turn's tool on a turn that runs one, prose alone on a final answer or
  before a user's reply; ``prose``: text with no tool call ever (what a
  model answers to AIPerf's synthetic prompts).

A fourth axis, for a client that sends a session id, **sub-agents** --
``parent``: a sub-agent's requests carry its parent's session id and
nothing that tells them apart; ``agent-id``: its parent's session id and
the sub-agent's own id (``agent_id``), as Claude Code sends them (measured
on Claude Code 2.1.328 against a recording server: every request of a
``Task``/``Agent`` sub-agent carries the session's
``X-Claude-Code-Session-Id`` and the sub-agent's ``x-claude-code-agent-id``,
the main conversation's none; docs/clients.md); ``own``: each sub-agent conversation has a session id of its own, as AIPerf's ``weka_trace`` replay sends it (its loader
makes each trace's ``subagent`` entry a child conversation, and AIPerf mints
every conversation a fresh correlation id, sent as the ``--session-header``;
the parent's id goes only in an opt-in ``X-Dynamo-Parent-Session-ID``).

A fifth axis, **retention** -- ``none``, or ``continuum-policy``: every
request carries retention directives (vLLM PR #38514's shape) as that PR's
own benchmark's "ContinuumPolicy" writes them: the system prompt (the
prompt's first segment) at priority 90, the history (up to the previous
prompt's length) at 70, the tail at 50; durations from the think time the
client will spend before its next turn (it knows it: the best a client can
declare), the system prompt's for ``SYSTEM_HOLD_S``; on a job's last turn
only the system prompt (:func:`retention_directives`).

Named profiles (:data:`CLIENTS`): ``tagged`` (today's replay: tagged,
exact, scripted), ``headers-only`` (session, exact, calls), ``aiperf``
(session, aiperf, prose, sub-agents own), ``reasoning`` (session, reasoning, calls),
``directives`` (``headers-only`` plus continuum-policy directives),
``aiperf-last-step`` (``aiperf`` with the last request of each conversation
flagged: session-last, aiperf, prose, sub-agents own -- it tells what AIPerf's missing
session end costs, since prose replies never say a session is over),
``no-header`` (none, exact, calls) and ``aiperf-no-header`` (none, aiperf,
prose): the same clients without any session id. Three more tell which of
the signals ``headers-only`` lacks costs what: ``headers-last`` (its
requests with ``is_last_step: true`` on each conversation's last: session-last,
exact, calls -- what a batch harness that knows its end can add),
``headers-own`` (its requests with each sub-agent under a session id of its
own: session, exact, calls, sub-agents own -- what a router or proxy that
tells sub-agents apart could send) and ``headers-last-own`` (both).
``claude-code`` is ``headers-only`` with the sub-agent id Claude Code sends
(session, exact, calls, sub-agents agent-id): what Claude Code sends.

The profiles change only what a job's turns send; arrivals, turn counts,
token counts of new content and tool times are the same under every
profile (a reply is longer only where its tool call does not fit the
recorded length; the ``reasoning`` prompts are shorter by the dropped
sections), so each profile is an arm over the same arrivals.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AIPERF_BLOCK_TOKENS",
    "CLIENTS",
    "DEFAULT_TOKENIZER",
    "REASONING_SHARE",
    "TAGGED",
    "ClientProfile",
    "ReplyText",
    "load_reply_text",
    "parse_clients",
    "reply_segments",
    "request_metadata",
    "retention_directives",
    "split_reasoning",
    "trace_tool_call",
]

_METADATA = ("tagged", "session", "session-last", "none")
_HISTORY = ("exact", "aiperf", "reasoning")
_REPLIES = ("scripted", "calls", "prose")
_RETENTION = ("none", "continuum-policy")
_SUB_AGENTS = ("parent", "agent-id", "own")
# vLLM PR #38514's benchmark's "ContinuumPolicy" priorities, and how long a
# directive keeps the system prompt (shared by every session).
SYSTEM_PRIORITY, HISTORY_PRIORITY, TAIL_PRIORITY = 90, 70, 50
SYSTEM_HOLD_S = 600.0

# Share of a reply's tokens that is reasoning (``reasoning`` history): the
# rest is the answer (and its tool call) the next prompt keeps.
REASONING_SHARE = 0.5
# Tokens per hash block of AIPerf's rebuilt prompts (the kv-cache-tester
# traces' block size: AIPerf's ``weka_trace`` dataset keeps it).
AIPERF_BLOCK_TOKENS = 64


@dataclass(frozen=True)
class ClientProfile:
    """What a simulated client sends (see the module doc for each axis).

    Invariants: ``metadata``, ``history`` and ``replies`` are among the
    values listed there; a ``scripted`` reply goes with ``exact`` history
    only (the other histories are defined on text the next prompt re-sends
    or drops, which scripted replies are not).
    """

    name: str
    metadata: str = "tagged"
    history: str = "exact"
    replies: str = "scripted"
    retention: str = "none"
    sub_agents: str = "parent"

    def __post_init__(self) -> None:
        for field, value, allowed in (("metadata", self.metadata, _METADATA), ("history", self.history, _HISTORY),
                                      ("replies", self.replies, _REPLIES), ("retention", self.retention, _RETENTION),
                                      ("sub_agents", self.sub_agents, _SUB_AGENTS)):
            if value not in allowed:
                raise ValueError(f"ClientProfile {self.name!r}: {field} must be one of {allowed}, got {value!r}")
        if self.replies == "scripted" and self.history != "exact":
            raise ValueError(f"ClientProfile {self.name!r}: {self.history!r} history needs text replies")

    @property
    def needs_tokenizer(self) -> bool:
        """Replies are text: the jobs need a tokenizer to be built and the
        plugin's scheduler one to read them."""
        return self.replies != "scripted"


CLIENTS: dict[str, ClientProfile] = {
    "tagged": ClientProfile("tagged"),
    "headers-only": ClientProfile("headers-only", "session", "exact", "calls"),
    "aiperf": ClientProfile("aiperf", "session", "aiperf", "prose", sub_agents="own"),
    "reasoning": ClientProfile("reasoning", "session", "reasoning", "calls"),
    "directives": ClientProfile("directives", "session", "exact", "calls", "continuum-policy"),
    "aiperf-last-step": ClientProfile("aiperf-last-step", "session-last", "aiperf", "prose", sub_agents="own"),
    "no-header": ClientProfile("no-header", "none", "exact", "calls"),
    "aiperf-no-header": ClientProfile("aiperf-no-header", "none", "aiperf", "prose"),
    "headers-last": ClientProfile("headers-last", "session-last", "exact", "calls"),
    "headers-own": ClientProfile("headers-own", "session", "exact", "calls", sub_agents="own"),
    "headers-last-own": ClientProfile("headers-last-own", "session-last", "exact", "calls", sub_agents="own"),
    "claude-code": ClientProfile("claude-code", "session", "exact", "calls", sub_agents="agent-id"),
}
TAGGED = CLIENTS["tagged"]


def parse_clients(spec: str) -> list[ClientProfile]:
    """``"tagged,headers-only"`` -> the profiles, in that order; an unknown
    or repeated name is an error naming it and the known ones."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise ValueError(f"no client profile named in {spec!r}; choose from {', '.join(CLIENTS)}")
    for name in names:
        if name not in CLIENTS:
            raise ValueError(f"unknown client profile {name!r}; choose from {', '.join(CLIENTS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"a client profile is named twice in {spec!r}")
    return [CLIENTS[n] for n in names]


def request_metadata(
    client: ClientProfile, job_id: str, last: bool, tool_name: str, session_id: str = "",
) -> tuple[dict[str, Any] | None, str | None]:
    """``(extra_args, session_id)`` of a request of job ``job_id``: the
    tagged metadata, or the session id alone (``session_id``, default the
    job id: a sub-agent's parent's session, sent as such when the profile's
    ``sub_agents`` is ``parent`` or ``agent-id`` -- the latter adding the
    sub-agent's own id, ``agent_id``: its job id; with ``own`` every job
    sends its own id). ``last``: the job's last request; ``tool_name``: the
    tool its reply runs ("" for none)."""
    if client.metadata == "none":
        return None, None
    session = job_id if client.sub_agents == "own" else session_id or job_id
    agent = {"agent_id": job_id} if client.sub_agents == "agent-id" and session != job_id else {}
    if client.metadata == "session":
        return agent or None, session
    if client.metadata == "session-last":
        return {**agent, **({"is_last_step": True} if last else {})} or None, session
    extra: dict[str, Any] = {"job_id": job_id, "is_last_step": last}
    if tool_name and not last:
        extra["tool_name"] = tool_name
    return extra, None


def retention_directives(system_tokens: int, previous_tokens: int, prompt_tokens: int, next_think_s: float | None,
                         ) -> list[dict[str, Any]]:
    """The continuum-policy directives of a request whose prompt holds
    ``prompt_tokens`` tokens, the first ``system_tokens`` its system prompt,
    the first ``previous_tokens`` the previous turn's prompt (0 on a first
    turn); ``next_think_s``: the think time before the job's next turn (None:
    this is its last turn, only the system prompt is declared)."""
    system = min(system_tokens, prompt_tokens)
    out = [{"start": 0, "end": system, "priority": SYSTEM_PRIORITY, "duration": SYSTEM_HOLD_S}] if system else []
    if next_think_s is None:
        return out
    history = min(max(previous_tokens, system), prompt_tokens)
    if history > system:
        out.append({"start": system, "end": history, "priority": HISTORY_PRIORITY, "duration": next_think_s})
    if prompt_tokens > history:
        out.append({"start": history, "end": prompt_tokens, "priority": TAIL_PRIORITY, "duration": next_think_s})
    return out


# ----------------------------------------------------------------------
# Reply text
# ----------------------------------------------------------------------
# A paragraph of an agent's narration, cycled to fill replies. Plain words
# and punctuation only: no backquote, angle bracket, brace or colon-led
# label, so no window of it parses as a tool call (a fence, a tag, JSON, a
# ReAct "Action:").
_PROSE = (
    "I will look at the failing test first and then check the module it imports, because the error "
    "mentions a missing attribute on the parser object. The traceback points at the configuration "
    "loader, so the default values are probably read before the file is opened. Next I want to see "
    "how the settings are merged and whether the command line flags override them in the right order. "
    "If the fix is small I will add a regression test that covers the empty file and the file with "
    "only comments, then run the whole suite again to make sure nothing else depends on the old "
    "behaviour. The summary so far is that the loader works for complete files and fails for partial "
    "ones, and the change should stay inside the merge function. "
)
_THINK_OPEN = "<think>\n"
_THINK_CLOSE = "\n</think>\n\n"

# Claude Code's tools as a trace turn's call (the traces record that a turn
# called a tool, not which): reads and searches most often.
_TRACE_CALLS: tuple[tuple[str, dict[str, str]], ...] = (
    ("Read", {"file_path": "src/config/loader.py"}),
    ("Read", {"file_path": "tests/test_loader.py"}),
    ("Grep", {"pattern": "def merge", "path": "src"}),
    ("Edit", {"file_path": "src/config/loader.py", "old_string": "a", "new_string": "b"}),
    ("Bash", {"command": "python -m pytest -q tests/test_loader.py"}),
    ("Bash", {"command": "git status"}),
)


def trace_tool_call(key: int) -> tuple[str, dict[str, str]]:
    """The call a trace turn with key ``key`` makes (deterministic)."""
    return _TRACE_CALLS[key % len(_TRACE_CALLS)]


class ReplyText:
    """Reply token ids a tokenizer made, so the plugin's reader decodes
    them to text it parses.

    Invariants: every id comes from ``encode`` (valid for the tokenizer);
    the same arguments give the same ids; a reply with a call ends with the
    call's tokens, after a newline, and decodes to text whose last tool call
    is that call; prose alone holds no tool call.
    """

    def __init__(self, encode: Callable[[str], list[int]]) -> None:
        self._encode = encode
        self._prose = tuple(encode(_PROSE))
        self._open = tuple(encode(_THINK_OPEN))
        self._close = tuple(encode(_THINK_CLOSE))
        self._calls: dict[str, tuple[int, ...]] = {}

    def prose(self, key: int, n: int) -> tuple[int, ...]:
        """``n`` ids of narration, from a window of the paragraph that
        ``key`` picks (so replies differ)."""
        if n <= 0:
            return ()
        p = self._prose
        start = key % len(p)
        reps = -(-(start + n) // len(p))
        return (p * reps)[start:start + n]

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[int, ...]:
        """A Hermes tool call (``<tool_call>{"name": ..., "arguments": ...}
        </tool_call>``) after a newline."""
        text = "\n<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"
        ids = self._calls.get(text)
        if ids is None:
            ids = self._calls[text] = tuple(self._encode(text))
        return ids

    def reply(self, key: int, n: int, call: tuple[str, dict[str, Any]] | None) -> tuple[int, ...]:
        """A reply of ``n`` ids (more when the call alone is longer): prose,
        then ``call`` if given."""
        tail = self.call(*call) if call is not None else ()
        if n <= len(tail):
            return tail if tail else self.prose(key, max(1, n))
        return self.prose(key, n - len(tail)) + tail

    def reasoning(self, key: int, n: int) -> tuple[int, ...]:
        """A reasoning section of ``n`` ids: ``<think>`` prose ``</think>``
        when it fits, else prose alone."""
        inner = n - len(self._open) - len(self._close)
        if inner < 1:
            return self.prose(key, n)
        return self._open + self.prose(key, inner) + self._close


# The tokenizer replies are made with by default: the shipped small chat
# model's (scripts/build_models.py puts it here).
DEFAULT_TOKENIZER = "~/.cache/vllm-continuum/models/smollm2-135m-instruct"


def load_reply_text(path: str) -> ReplyText:
    """A :class:`ReplyText` over the Hugging Face tokenizer at ``path``
    (the directory the plugin's scheduler loads too)."""
    import os

    from transformers import AutoTokenizer

    full = os.path.expanduser(path)
    if not os.path.isdir(full):
        raise FileNotFoundError(f"client tokenizer directory not found: {full} (run scripts/build_models.py?)")
    tokenizer = AutoTokenizer.from_pretrained(full)
    return ReplyText(lambda text: list(tokenizer.encode(text, add_special_tokens=False)))


def split_reasoning(n: int, share: float = REASONING_SHARE) -> int:
    """Tokens of an ``n``-token reply that are reasoning: ``share`` of it,
    leaving the answer at least one token (0 for a one-token reply)."""
    return min(max(0, n - 1), round(n * share))


def reply_segments(
    segment: Callable[[str, Sequence[int]], Any], client: ClientProfile, text: ReplyText | None, key: int, n: int,
    call: tuple[str, dict[str, Any]] | None,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``(reply, kept)``: a text reply's segments and the ones the next
    prompt re-sends (the answer; the reasoning is dropped). ``segment(tag,
    ids)`` makes one explicit segment. Only for text replies."""
    if text is None or client.replies == "scripted":
        raise ValueError(f"client {client.name!r}: reply segments need text replies and a ReplyText")
    if client.replies == "prose":
        call = None
    if client.history != "reasoning":
        body = segment("reply", text.reply(key, n, call))
        return (body,), (body,)
    think = split_reasoning(n)
    answer = segment("answer", text.reply(key, n - think, call))
    if not think:
        return (answer,), (answer,)
    return (segment("think", text.reasoning(key, think)), answer), (answer,)
