"""Session ids that agent harnesses send on their own, found in the API server.

Real harnesses already name their conversation on every request; the plugin
takes that name as the job id, so an unchanged harness gets explicit jobs
instead of relying on prefix matching. Order of precedence for the job id
(the first present wins; later sources are not read, so a bad later one
never fails a request):

1. the plugin's own ``job_id`` (body field, ``vllm_xargs``; engine-level
   ``kv_hints`` payload below it);
2. vLLM's own session id: body ``session_id``, ``X-Session-ID`` header,
   ``vllm_xargs.session_id`` (vLLM's ``_get_session_id``, unchanged);
3. the ``session_headers`` setting, in its order; by default
   ``X-Claude-Code-Session-Id`` (Claude Code 2.1.x, every request),
   ``x-opencode-session`` (OpenCode), ``session_id`` then
   ``conversation_id`` (Codex CLI: ``build_conversation_headers`` in
   codex-rs/codex-api/src/requests/headers.rs sends ``session_id``; older
   releases also sent ``conversation_id``), then the load generators' and
   routers' session keys: ``X-Dynamo-Session-ID`` (NVIDIA Dynamo's session
   affinity key; AIPerf sends it when
   ``AIPERF_HTTP_X_DYNAMO_SESSION_ID_FROM_CORRELATION_ID`` is set) and
   ``X-Session-Affinity`` (AIPerf 0.13 sends it on
   every request of a conversation by default, ``--session-header`` or
   not: ``transports/base_transports.py``). AIPerf replays a trace's
   sub-agent as a conversation of its own (``::sa:`` children), under its
   own id in all three. A session key some router sets per *user* rather
   than per conversation is safe too: a session's requests that continue
   different conversations are told apart by prefix (``conversations``).
   AIPerf's ``X-Correlation-ID`` is not read: elsewhere the name is a
   per-request tracing id, which would make every request a job of its own;
4. on ``/v1/messages``, the ``session_id`` inside Claude Code's
   ``metadata.user_id`` (a JSON *string*:
   ``'{"device_id": ..., "account_uuid": ..., "session_id": "<uuid>"}'``);
5. implicit jobs (prefix matching in the engine).

The value found is handed to vLLM as the request's session id (what
``X-Session-ID`` would have been), which the engine takes as the job id.
Whatever wins is validated like ``X-Session-ID`` (``parse_job_id``): a bad
value is an HTTP 400 naming its source. ``metadata.user_id`` is the
Anthropic API's opaque user identifier, so one that is not such a JSON
object (a plain string, malformed or oversized JSON) is ignored with a
DEBUG line: only a ``session_id`` it does carry is validated.

Invariants: parsing is bounded (a header list of at most
``MAX_SESSION_HEADERS`` names of at most ``MAX_HEADER_NAME_CHARS``; a
``user_id`` is parsed only up to ``MAX_USER_ID_CHARS``) and never raises
anything but ``MetadataError`` (validation) or, for the setting,
``ValueError`` naming the bad value.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from .metadata import parse_job_id

logger = logging.getLogger("vllm.continuum_plugin")

__all__ = [
    "DEFAULT_SESSION_HEADERS",
    "MAX_HEADER_NAME_CHARS",
    "MAX_SESSION_HEADERS",
    "MAX_USER_ID_CHARS",
    "USER_ID_FIELD",
    "client_session_id",
    "parse_session_headers",
    "session_from_user_id",
]

DEFAULT_SESSION_HEADERS = ("X-Claude-Code-Session-Id|x-opencode-session|session_id|conversation_id"
                           "|X-Dynamo-Session-ID|X-Session-Affinity")
# Each listed header costs one lookup per request without a job id.
MAX_SESSION_HEADERS = 16
MAX_HEADER_NAME_CHARS = 64
# Claude Code's user_id is ~150 characters; a longer one is no session JSON
# worth parsing on the request path (and stays far from json's recursion limit).
MAX_USER_ID_CHARS = 1024
USER_ID_FIELD = "metadata.user_id session_id"
# RFC 9110 token characters, without "|" (the setting's separator).
_HEADER_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+-.^_`~")


def parse_session_headers(value: str) -> tuple[str, ...]:
    """The header names of the ``session_headers`` setting (``|``-separated;
    a JSON list arrives joined). Raises ``ValueError`` naming the bad name:
    not an HTTP token, too long, a duplicate (header names ignore case), or
    more than ``MAX_SESSION_HEADERS`` names."""
    names = tuple(name.strip() for name in value.split("|") if name.strip())
    if len(names) > MAX_SESSION_HEADERS:
        raise ValueError(f"{len(names)} header names; at most {MAX_SESSION_HEADERS}")
    seen: set[str] = set()
    for name in names:
        if len(name) > MAX_HEADER_NAME_CHARS or not set(name) <= _HEADER_NAME_CHARS:
            raise ValueError(
                f"header name {name[:MAX_HEADER_NAME_CHARS]!r} is not an HTTP header name of at most "
                f"{MAX_HEADER_NAME_CHARS} characters (letters, digits, -_.!#$%&'*+^`~)"
            )
        if name.lower() in seen:
            raise ValueError(f"header name {name!r} is listed twice")
        seen.add(name.lower())
    return names


def session_from_user_id(user_id: Any) -> str | None:
    """The ``session_id`` inside Claude Code's ``metadata.user_id`` JSON
    string, validated (``MetadataError`` when it is not a valid job id);
    None, with a DEBUG line, when ``user_id`` is no such JSON object."""
    if not isinstance(user_id, str) or not user_id:
        return None
    if len(user_id) > MAX_USER_ID_CHARS:
        logger.debug("continuum: metadata.user_id of %d characters ignored (limit %d)",
                     len(user_id), MAX_USER_ID_CHARS)
        return None
    if not user_id.lstrip().startswith("{"):
        return None  # a plain user id, as the Anthropic API defines it
    try:
        parsed = json.loads(user_id)
    except (ValueError, RecursionError):
        logger.debug("continuum: metadata.user_id is not valid JSON; ignored")
        return None
    if not isinstance(parsed, dict) or parsed.get("session_id") is None:
        logger.debug("continuum: metadata.user_id carries no session_id; ignored")
        return None
    return parse_job_id(parsed["session_id"], USER_ID_FIELD)


def client_session_id(
    header: Callable[[str], str | None], header_names: Sequence[str], user_id: Any = None
) -> str | None:
    """The job id a harness names on its own (sources 3 and 4 of the module
    doc), validated; None when it names none.

    ``header(name)`` returns a request header (case-insensitive, None when
    absent); an empty header counts as absent, as vLLM treats an empty
    ``X-Session-ID``. Raises ``MetadataError`` naming the source whose value
    is not a valid job id."""
    for name in header_names:
        value = header(name)
        if value:
            return parse_job_id(value, f"{name} header")
    return session_from_user_id(user_id)

