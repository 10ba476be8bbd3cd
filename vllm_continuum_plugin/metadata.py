"""Job metadata carried by each request: job id, last-step flag, tool hints.

Clients send it in any of these forms (first match wins per field):

1. ``extra_body={"vllm_xargs": {"job_id": "j1", "is_last_step": false}}``
   (vLLM's own channel: ``SamplingParams.extra_args``);
2. ``extra_body={"job_id": "j1", "is_last_step": false}`` (top-level fields,
   the form the field report's clients send; the plugin copies them into
   ``extra_args`` in the API server, where stock vLLM would drop them);
3. vLLM's typed KV hints (``Request.kv_hints``, a ``KvHintsEnvelope``;
   engine-level in vLLM 0.32 and 0.33 -- ``LLMEngine.add_request`` /
   ``AsyncLLM.generate(kv_hints=...)``, not yet an HTTP field): an action
   with ``action_type`` ``"vllm_continuum.job"`` and ``action_version``
   ``"1"`` whose ``payload`` holds the fields above; other action types are
   left to their owners;
4. vLLM's ``session_id`` (body field or ``X-Session-ID`` header) as job id;
   the API server also fills it from the session headers harnesses send
   (Claude Code, OpenCode, Codex; the ``session_headers`` setting) and from
   Claude Code's ``metadata.user_id`` -- see ``session_ids`` for the order.

Booleans may arrive as JSON booleans, 0/1 or the strings "true"/"false"
(any case) -- ``vllm_xargs`` turns JSON booleans into 0/1 on the way. The API
server rejects anything else with HTTP 400 naming the field. In the engine the
same parser is lenient: a malformed value makes the request untagged (served
exactly like stock FCFS) and logs a warning, never an engine error.

Optional hints: ``tool_name`` / ``tool_command`` (override reply parsing) and
``expected_tool_seconds`` (the client's own estimate of the tool's duration).

Sub-agents (``agent_id``): a request of a sub-agent running under its
parent's job or session id names the sub-agent (any printable id, validated
like a job id). The API server also fills it from the header Claude Code
sends on every request of a sub-agent (``AGENT_HEADERS``:
``x-claude-code-agent-id``, measured on Claude Code 2.1.328, whose main
conversation sends none). Such a request continues only that sub-agent's
conversation, and its reply without a tool call ends the sub-agent's job:
the answer goes to the parent as a tool result, no person follows it up.

Declared retention (``retention``): vLLM PR #38514's ``retention_directives``
and ``retention_scope``, or TensorRT-LLM's ``kv_cache_retention_config``, in
any of the forms above (in ``vllm_xargs``, which carries only scalars, as
JSON text). ``retention_scope`` names the job when neither ``job_id`` nor a
session id does. See ``retention``.

Client scope (``continuum_scope``; see ``estimators.scopes`` and
docs/scoped-learning.md): whose learned state a request teaches and reads.
On a server started with API keys it is the hash of the request's verified
key (``key_scope``; the key itself is never kept) and overrides anything
the client names; otherwise the ``continuum_scope`` field (any of the forms
above) or the ``X-Continuum-Scope`` header (``SCOPE_HEADER``), a printable
name of at most ``MAX_SCOPE_CHARS`` characters. A request that names none
is in the default scope, which all such traffic shares.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .estimators.scopes import DEFAULT_SCOPE, is_key_scope, key_scope
from .retention import RETENTION_FIELDS, RETENTION_SCOPE, Retention, parse_retention

__all__ = [
    "AGENT_HEADERS",
    "AGENT_ID",
    "JOB_ID",
    "IS_LAST_STEP",
    "JobMetadata",
    "KV_HINT_ACTION",
    "MetadataError",
    "METADATA_FIELDS",
    "SCOPE",
    "SCOPE_HEADER",
    "TOOLS_OFFERED",
    "is_key_scope",
    "key_scope",
    "kv_hint_fields",
    "parse_bool",
    "parse_metadata",
    "parse_scope",
]

JOB_ID = "job_id"
# A sub-agent's own id within its session (Claude Code sends it as the
# ``x-claude-code-agent-id`` header on every request of a sub-agent).
AGENT_ID = "agent_id"
IS_LAST_STEP = "is_last_step"
TOOL_NAME = "tool_name"
TOOL_COMMAND = "tool_command"
EXPECTED_TOOL_SECONDS = "expected_tool_seconds"
SCOPE = "continuum_scope"
# Set by the API server (not a client field): did the request offer the
# model any tool (``tools`` given, ``tool_choice`` not "none")? Absent where
# the endpoint has no tools (completions) or the engine is driven directly.
TOOLS_OFFERED = "continuum_tools_offered"
METADATA_FIELDS = (JOB_ID, AGENT_ID, IS_LAST_STEP, TOOL_NAME, TOOL_COMMAND, EXPECTED_TOOL_SECONDS, SCOPE,
                   *RETENTION_FIELDS)
# Headers that name a sub-agent (``AGENT_ID``), in order: Claude Code 2.1.x
# sends its sub-agent's id on every request of the sub-agent (and
# ``x-claude-code-parent-agent-id`` on a nested one's, which is not needed:
# each agent's own id is unique in its session).
AGENT_HEADERS = ("x-claude-code-agent-id",)
# The header a client may name its scope with (when no API key decides it).
SCOPE_HEADER = "X-Continuum-Scope"
MAX_SCOPE_CHARS = 128
MAX_JOB_ID_LENGTH = 256
# Hints are parsed on the engine thread and kept per job: a request with a
# longer one is rejected (HTTP 400 naming the field). A command longer than
# the parser reads (``MAX_PARSED_CHARS``) is accepted and parsed in part.
MAX_TOOL_COMMAND_CHARS = 16384
MAX_TOOL_NAME_CHARS = 256
# A week: longer is no tool time the plugin could use (and keeps sums finite).
MAX_EXPECTED_TOOL_SECONDS = 7 * 24 * 3600.0


class MetadataError(ValueError):
    """A metadata field has a value the plugin cannot interpret."""

    def __init__(self, field: str, value: Any, expectation: str) -> None:
        super().__init__(f"invalid {field}={value!r}: expected {expectation}")
        self.field = field
        self.value = value


@dataclass(frozen=True)
class JobMetadata:
    """Parsed metadata. ``job_id is None`` means "not an agent request".

    ``is_last_step`` is None when the client did not send the flag. Only
    True ends the job; an explicit False also says the client itself
    decides when its job ends, so a reply without a tool call stays pinned
    (otherwise such a reply, after the job's tool calls, is its final answer).
    """

    job_id: str | None = None
    is_last_step: bool | None = None
    tool_name: str | None = None
    tool_command: str | None = None
    expected_tool_seconds: float | None = None
    # The client scope (module doc): whose learned state the turn teaches
    # and reads. Also set for requests without a job id.
    scope: str = DEFAULT_SCOPE
    # Did the request offer the model tools (``TOOLS_OFFERED``)? None: not
    # known. A reply without a tool call to a request that offered none
    # waits on a person, not a tool: it is the conversation's final answer.
    tools_offered: bool | None = None
    # What the client declared it will need again (``retention``), or None.
    retention: Retention | None = None
    # The request is a sub-agent's (``AGENT_ID``): that sub-agent's id in its
    # session. A sub-agent's conversation is its own (``conversations``) and
    # its answer goes to its parent, never to a person: it ends its job.
    agent_id: str | None = None


UNTAGGED = JobMetadata()
# (The scheduler keeps a request's parsed metadata in its record:
# ``request_record.request_meta``.)


_TRUE_STRINGS = frozenset({"true", "1"})
_FALSE_STRINGS = frozenset({"false", "0"})


def parse_bool(value: Any, field: str) -> bool:
    """Accept True/False, 1/0 and "true"/"false"/"1"/"0" (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, float) and value in (0.0, 1.0):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE_STRINGS:
            return True
        if text in _FALSE_STRINGS:
            return False
    raise MetadataError(field, value, 'a boolean: true/false, 1/0 or "true"/"false"')


def parse_job_id(value: Any, field: str = JOB_ID) -> str | None:
    """A job id as the plugin keys it: the string, or an integer's decimal
    digits (so ``17`` and ``"17"`` are one job), without surrounding
    whitespace (``" a"`` and ``"a"`` are one job)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise MetadataError(field, _shown(value), "a non-empty string (or an integer)")
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise MetadataError(field, _shown(value), "an integer that fits in 64 bits (or a string)")
    text = str(value).strip()
    if not text or len(text) > MAX_JOB_ID_LENGTH or not text.isprintable():
        # (Non-printable characters are reserved: implicit job ids use them.)
        raise MetadataError(
            field, _shown(value), f"a non-empty printable string of at most {MAX_JOB_ID_LENGTH} characters"
        )
    return text


def _parse_optional_str(value: Any, field: str, max_chars: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > max_chars:
        raise MetadataError(field, _shown(value), f"a string of at most {max_chars} characters")
    return value.strip() or None


def _shown(value: Any, limit: int = 64) -> Any:
    """A value as an error message may quote it: long strings cut (with
    their length), so a megabyte hint never reaches a log line whole."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}... ({len(value)} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**20:
        return f"<integer of {len(str(abs(value)))} digits>"
    return value


def _parse_seconds(value: Any) -> float | None:
    if value is None:
        return None
    expectation = f"a number of seconds in [0, {MAX_EXPECTED_TOOL_SECONDS:.0f}]"
    if isinstance(value, bool) or (isinstance(value, str) and len(value) > 64):
        raise MetadataError(EXPECTED_TOOL_SECONDS, _shown(value), expectation)
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a 400-digit integer
        raise MetadataError(EXPECTED_TOOL_SECONDS, _shown(value), expectation) from None
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_EXPECTED_TOOL_SECONDS:
        raise MetadataError(EXPECTED_TOOL_SECONDS, _shown(value), expectation)
    return seconds


def parse_scope(value: Any, field: str = SCOPE) -> str:
    """A client scope as the plugin keys it: ``DEFAULT_SCOPE`` for None or a
    blank name; a printable name of at most ``MAX_SCOPE_CHARS`` characters,
    without surrounding whitespace; or a key's scope (``key_scope``, which
    only the API server sets). Raises ``MetadataError`` naming ``field``."""
    if value is None:
        return DEFAULT_SCOPE
    if isinstance(value, str) and is_key_scope(value):
        return value
    if not isinstance(value, str) or len(value) > MAX_SCOPE_CHARS or not value.isprintable():
        raise MetadataError(field, _shown(value), f"a printable string of at most {MAX_SCOPE_CHARS} characters")
    return value.strip() or DEFAULT_SCOPE


KV_HINT_ACTION = "vllm_continuum.job"
KV_HINT_VERSIONS = ("1",)


def kv_hint_fields(kv_hints: Any) -> dict[str, Any]:
    """The plugin's fields from a vLLM ``KvHintsEnvelope`` (or ``None``):
    the payload of its ``vllm_continuum.job`` action; ``{}`` when it has
    none. Raises ``MetadataError`` for a version or payload key it does not
    know, naming it."""
    if kv_hints is None:
        return {}
    for action in getattr(kv_hints, "actions", None) or ():
        if getattr(action, "action_type", None) != KV_HINT_ACTION:
            continue  # another component's hint
        version = getattr(action, "action_version", None)
        if version not in KV_HINT_VERSIONS:
            raise MetadataError(f"kv_hints {KV_HINT_ACTION} action_version", _shown(version),
                                f"one of {list(KV_HINT_VERSIONS)}")
        payload = getattr(action, "payload", None)
        if not isinstance(payload, Mapping):
            raise MetadataError(f"kv_hints {KV_HINT_ACTION} payload", _shown(payload), "an object")
        unknown = sorted(str(k) for k in payload if k not in METADATA_FIELDS)
        if unknown:
            raise MetadataError(f"kv_hints {KV_HINT_ACTION} payload key", _shown(unknown),
                                f"only {list(METADATA_FIELDS)}")
        return dict(payload)
    return {}


def parse_metadata(
    extra_args: Mapping[str, Any] | None, session_id: str | None = None, kv_hints: Any = None
) -> JobMetadata:
    """Parse metadata strictly; raises ``MetadataError`` on a bad field.

    ``extra_args`` is ``SamplingParams.extra_args`` (already merged with the
    top-level fields by the API patch) and wins per field over ``kv_hints``
    (vLLM's typed hints, see module doc); ``session_id`` is the fallback job id.
    """
    args = {**kv_hint_fields(kv_hints), **(extra_args or {})}
    retention = parse_retention(args, MetadataError)
    retention_scope = parse_job_id(args.get(RETENTION_SCOPE), RETENTION_SCOPE)
    job_id = parse_job_id(args.get(JOB_ID))
    if job_id is None and session_id:
        job_id = parse_job_id(session_id, "session_id")
    if job_id is None and retention_scope is not None:
        job_id = retention_scope
    raw_last = args.get(IS_LAST_STEP)
    is_last = None if raw_last is None else parse_bool(raw_last, IS_LAST_STEP)
    return JobMetadata(
        job_id=job_id,
        is_last_step=is_last,
        tool_name=_parse_optional_str(args.get(TOOL_NAME), TOOL_NAME, MAX_TOOL_NAME_CHARS),
        tool_command=_parse_optional_str(args.get(TOOL_COMMAND), TOOL_COMMAND, MAX_TOOL_COMMAND_CHARS),
        expected_tool_seconds=_parse_seconds(args.get(EXPECTED_TOOL_SECONDS)),
        scope=parse_scope(args.get(SCOPE)),
        tools_offered=None if args.get(TOOLS_OFFERED) is None else parse_bool(args[TOOLS_OFFERED], TOOLS_OFFERED),
        retention=retention,
        agent_id=parse_job_id(args.get(AGENT_ID), AGENT_ID),
    )
