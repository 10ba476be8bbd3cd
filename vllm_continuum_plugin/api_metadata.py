"""API-server side of job metadata: accept top-level fields, reject bad ones.

Stock vLLM keeps unknown top-level body fields (``"job_id": ...`` sent through
the OpenAI client's ``extra_body``) in ``request.model_extra`` and drops them.
``patch_request_class`` wraps a protocol class's ``to_sampling_params`` so that

* top-level ``job_id`` / ``is_last_step`` / tool hints are copied into
  ``SamplingParams.extra_args`` (``vllm_xargs`` values win when both exist);
* the merged metadata is validated with the engine's parser, and a bad value
  raises vLLM's ``VLLMValidationError`` -> HTTP 400 naming the field.

``patch_session_lookup`` extends vLLM's ``_get_session_id`` (the one place
every generate endpoint -- chat, completions, responses, and ``/v1/messages``,
which converts to a chat request and calls the chat path with the same raw
request -- reads ``X-Session-ID``): when vLLM finds no session id and no
``job_id`` is named, the session a harness sends on its own becomes it
(``session_ids``); ``patch_anthropic_messages`` carries ``metadata.user_id``
over to the converted chat request, which would otherwise drop it.

The same wrapper also records whether the request offered the model any
tool (``metadata.TOOLS_OFFERED``; a reply without a tool call to a request
that offered none is its conversation's final answer), and the sub-agent a
harness names in a header (``metadata.AGENT_HEADERS``: Claude Code's
``x-claude-code-agent-id``) as ``agent_id``.

The same ``_get_session_id`` wrapper, the one hook that sees the HTTP request
(``raw_request``) of every generate endpoint, also settles the request's
client scope (``estimators.scopes``, docs/scoped-learning.md) and writes it
into ``SamplingParams.extra_args`` (which ``to_sampling_params`` made just
before and left on the request): on a server with API keys the hash of the
verified ``Authorization: Bearer`` key (``metadata.key_scope``; it overrides
any name the client sends), else the ``continuum_scope`` field, else the
``X-Continuum-Scope`` header, else the default scope. A bad name is an HTTP
400 naming its source.

The protocol modules are heavy and only the API server needs them, so the
patch is applied by a post-import hook (see ``registration``), never by
importing them from ``register()``.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import Any

from .estimators.scopes import DEFAULT_SCOPE
from .metadata import (
    AGENT_HEADERS,
    AGENT_ID,
    JOB_ID,
    METADATA_FIELDS,
    SCOPE,
    SCOPE_HEADER,
    TOOLS_OFFERED,
    MetadataError,
    is_key_scope,
    key_scope,
    parse_job_id,
    parse_metadata,
    parse_scope,
)
from .metrics import count_refused_directives
from .retention import RETENTION_FIELDS
from .session_ids import client_session_id

logger = logging.getLogger("vllm.continuum_plugin")

__all__ = [
    "PATCHED_ATTR",
    "client_scope",
    "keep_extra_fields",
    "patch_anthropic_messages",
    "patch_request_class",
    "patch_session_lookup",
    "session_headers_for",
]

PATCHED_ATTR = "_continuum_patched"
# Where a chat request converted from /v1/messages keeps the Anthropic
# request's metadata.user_id (an instance attribute outside the pydantic
# fields: never serialised, never sent to the engine).
_USER_ID_ATTR = "_continuum_user_id"
# Where ``to_sampling_params`` leaves the SamplingParams it made (same kind
# of attribute), for ``_get_session_id`` to write the client scope into.
_PARAMS_ATTR = "_continuum_params"


def _validation_error(error: MetadataError) -> Exception:
    try:
        from vllm.exceptions import VLLMValidationError

        return VLLMValidationError(str(error), parameter=error.field, value=error.value)
    except Exception:  # older layouts: a ValueError also becomes HTTP 400
        return ValueError(str(error))


def patch_request_class(cls: type) -> None:
    original = cls.__dict__.get("to_sampling_params")
    if original is None or getattr(original, PATCHED_ATTR, False):
        return

    @functools.wraps(original)
    def to_sampling_params(self: Any, *args: Any, **kwargs: Any) -> Any:
        params = original(self, *args, **kwargs)
        extra_fields = getattr(self, "model_extra", None) or {}
        top_level = {k: extra_fields[k] for k in METADATA_FIELDS if k in extra_fields}
        extra_args = getattr(params, "extra_args", None)
        if top_level:
            merged = dict(top_level)
            merged.update(extra_args or {})
            params.extra_args = extra_args = merged
        if extra_args or getattr(self, "session_id", None):
            try:
                parse_metadata(extra_args, getattr(self, "session_id", None))
            except MetadataError as e:
                if e.field.startswith(RETENTION_FIELDS):
                    count_refused_directives()
                raise _validation_error(e) from None
        # Outside the pydantic fields: never dumped, never sent anywhere.
        object.__setattr__(self, _PARAMS_ATTR, params)
        return params

    setattr(to_sampling_params, PATCHED_ATTR, True)
    cls.to_sampling_params = to_sampling_params


def _names_job_id(request: Any) -> bool:
    extra_fields = getattr(request, "model_extra", None) or {}
    xargs = getattr(request, "vllm_xargs", None) or {}
    return extra_fields.get(JOB_ID) is not None or xargs.get(JOB_ID) is not None


def patch_session_lookup(cls: type) -> None:
    """Wrap vLLM's ``_get_session_id``. Its own result (body ``session_id``,
    ``X-Session-ID`` header, ``vllm_xargs.session_id``) is returned
    unchanged, and validated when it becomes the job id (no ``job_id``
    given): a bad one is an HTTP 400 naming ``session_id``, not a request
    silently served untagged. When it finds none and no ``job_id`` is named,
    the session a harness sends on its own (``session_ids``: the
    ``session_headers`` setting, then ``metadata.user_id`` on
    ``/v1/messages``) is returned instead, validated the same way."""
    original = cls.__dict__.get("_get_session_id")
    if not isinstance(original, staticmethod) or getattr(original.__func__, PATCHED_ATTR, False):
        return
    lookup = original.__func__

    @functools.wraps(lookup)
    def _get_session_id(request: Any, raw_request: Any) -> Any:
        value = lookup(request, raw_request)
        try:
            _set_client_scope(request, raw_request)
            _set_tools_offered(request, raw_request)
            _set_agent_id(request, raw_request)
        except MetadataError as e:
            raise _validation_error(e) from None
        if _names_job_id(request):
            return value  # the plugin's own field wins; vLLM's value is only a tag
        try:
            if value is not None:
                parse_job_id(value, "session_id")
                return value
            return _client_session_id(request, raw_request)
        except MetadataError as e:
            raise _validation_error(e) from None

    setattr(_get_session_id, PATCHED_ATTR, True)
    cls._get_session_id = staticmethod(_get_session_id)


def _client_session_id(request: Any, raw_request: Any) -> str | None:
    """A harness's own session id for ``request`` (validated), or None."""
    names = session_headers_for(raw_request)
    if names is None:
        return None  # the plugin does not schedule this server
    headers = getattr(raw_request, "headers", None)  # Starlette's: case-insensitive

    def header(name: str) -> str | None:
        return headers.get(name) if headers is not None else None

    return client_session_id(header, names, getattr(request, _USER_ID_ATTR, None))


def _set_client_scope(request: Any, raw_request: Any) -> None:
    """Write the request's client scope into the ``extra_args`` of the
    SamplingParams its ``to_sampling_params`` made (module doc); nothing
    on a server that does not run a plugin policy, or when no such params
    were made (beam search)."""
    params = getattr(request, _PARAMS_ATTR, None)
    if params is None or session_headers_for(raw_request) is None:
        return
    extra_args = getattr(params, "extra_args", None) or {}
    scope = client_scope(raw_request, extra_args.get(SCOPE))
    if scope != DEFAULT_SCOPE:
        params.extra_args = {**extra_args, SCOPE: scope}
    elif SCOPE in extra_args:
        params.extra_args = {k: v for k, v in extra_args.items() if k != SCOPE} or None


def _set_tools_offered(request: Any, raw_request: Any) -> None:
    """Write whether ``request`` offered the model any tool (``TOOLS_OFFERED``)
    into its SamplingParams' ``extra_args``: on a plugin server, for an
    endpoint whose requests carry ``tools`` (chat, responses, and
    ``/v1/messages`` through its chat request). The server's answer
    replaces any value a client put there."""
    params = getattr(request, _PARAMS_ATTR, None)
    if params is None or not hasattr(request, "tools") or session_headers_for(raw_request) is None:
        return
    offered = bool(getattr(request, "tools", None)) and getattr(request, "tool_choice", None) != "none"
    params.extra_args = {**(getattr(params, "extra_args", None) or {}), TOOLS_OFFERED: offered}


def _set_agent_id(request: Any, raw_request: Any) -> None:
    """Write the sub-agent a harness names in a header (``AGENT_HEADERS``:
    Claude Code's ``x-claude-code-agent-id``) into the request's
    SamplingParams' ``extra_args`` as ``AGENT_ID``, validated like a job id
    (``MetadataError`` naming the header); on a plugin server only, and
    not over an ``agent_id`` the client sent in the body."""
    params = getattr(request, _PARAMS_ATTR, None)
    if params is None or session_headers_for(raw_request) is None:
        return
    extra_args = getattr(params, "extra_args", None) or {}
    headers = getattr(raw_request, "headers", None)
    if AGENT_ID in extra_args or headers is None:
        return
    # The first listed header present, validated: the session headers' lookup.
    agent = client_session_id(headers.get, AGENT_HEADERS)
    if agent is not None:
        params.extra_args = {**extra_args, AGENT_ID: agent}


def client_scope(raw_request: Any, named: Any) -> str:
    """The client scope of a request: its verified API key's
    (``metadata.key_scope``) when the server has API keys, else the scope
    ``named`` in the body (``continuum_scope``), else the
    ``X-Continuum-Scope`` header's, else ``DEFAULT_SCOPE``. Raises
    ``MetadataError`` naming the source of a bad name; a client may not
    name a key's scope."""
    headers = getattr(raw_request, "headers", None)  # Starlette's: case-insensitive
    if _server_has_api_keys(raw_request) and headers is not None:
        scheme, _, token = (headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and token:
            # vLLM's AuthenticationMiddleware let the request through: the
            # key is one of the server's, so it names the client.
            return key_scope(token)
    for value, source in ((named, SCOPE), (headers.get(SCOPE_HEADER) if headers is not None else None,
                                             f"{SCOPE_HEADER} header")):
        if value is None:
            continue
        if isinstance(value, str) and is_key_scope(value):
            raise MetadataError(source, "<reserved>", "a scope name (a key's scope is the server's to set)")
        scope = parse_scope(value, source)
        if scope != DEFAULT_SCOPE:
            return scope
    return DEFAULT_SCOPE


def _server_has_api_keys(raw_request: Any) -> bool:
    """Was the server started with API keys (``--api-key`` or
    ``VLLM_API_KEY``, as vLLM's middleware reads them)?"""
    args = getattr(getattr(getattr(raw_request, "app", None), "state", None), "args", None)
    keys = getattr(args, "api_key", None)
    if isinstance(keys, str):
        keys = [keys]
    return any(keys or ()) or bool(os.environ.get("VLLM_API_KEY"))


# (vllm_config, its session header names): one server has one config.
_headers_cache: tuple[Any, tuple[str, ...] | None] | None = None


def session_headers_for(raw_request: Any) -> tuple[str, ...] | None:
    """The ``session_headers`` of the server ``raw_request`` reached (from
    ``app.state.vllm_config``, vLLM's API-server state; environment and
    defaults without one), or None when that server does not run a
    plugin policy: installing the plugin must not change a stock server."""
    global _headers_cache
    state = getattr(getattr(raw_request, "app", None), "state", None)
    vllm_config = getattr(state, "vllm_config", None)
    cached = _headers_cache
    if cached is not None and cached[0] is vllm_config:
        return cached[1]
    names = _load_session_headers(vllm_config)
    _headers_cache = (vllm_config, names)
    return names


def _load_session_headers(vllm_config: Any) -> tuple[str, ...] | None:
    from .config import load_config
    from .policies import PLUGIN_POLICIES

    if vllm_config is not None and not _runs_plugin(vllm_config, PLUGIN_POLICIES):
        return None
    try:
        return load_config(getattr(vllm_config, "additional_config", None)).session_header_list
    except ValueError:
        # The engine refuses the same config at startup with this error.
        logger.warning("vllm-continuum-plugin: invalid settings; no session headers read", exc_info=True)
        return ()


def _runs_plugin(vllm_config: Any, policies: tuple[str, ...]) -> bool:
    """Does this server schedule with the plugin (policy or --scheduler-cls)?"""
    scheduler_config = getattr(vllm_config, "scheduler_config", None)
    if str(getattr(scheduler_config, "policy", "")) in policies:
        return True
    cls = getattr(scheduler_config, "scheduler_cls", None)
    name = cls if isinstance(cls, str) else f"{getattr(cls, '__module__', '')}.{getattr(cls, '__name__', '')}"
    return name.startswith("vllm_continuum_plugin.")


def keep_extra_fields(cls: type) -> None:
    """Let a pydantic request class keep the fields it does not declare in
    ``model_extra`` (vLLM's ``AnthropicMessagesRequest`` drops them), so
    that the plugin's top-level fields (``job_id``, retention directives)
    reach ``patch_anthropic_messages``. Nothing else reads them there."""
    config = getattr(cls, "model_config", None)
    if not isinstance(config, dict) or config.get("extra") == "allow" or getattr(cls, PATCHED_ATTR, False):
        return
    config["extra"] = "allow"
    cls.model_rebuild(force=True)
    setattr(cls, PATCHED_ATTR, True)


def patch_anthropic_messages(cls: type) -> None:
    """Carry ``metadata.user_id`` of an Anthropic ``/v1/messages`` request
    over to the chat request vLLM converts it to (``to_chat_completion_request``
    drops ``metadata``), where ``_get_session_id`` can read it, and the
    plugin's top-level fields (``METADATA_FIELDS``: job metadata, retention
    directives) into the chat request's own extra fields, where
    ``to_sampling_params`` reads them."""
    original = cls.__dict__.get("to_chat_completion_request")
    if not isinstance(original, classmethod) or getattr(original.__func__, PATCHED_ATTR, False):
        return
    convert = original.__func__

    @functools.wraps(convert)
    def to_chat_completion_request(klass: type, anthropic_request: Any, *args: Any, **kwargs: Any) -> Any:
        chat_request = convert(klass, anthropic_request, *args, **kwargs)
        metadata = getattr(anthropic_request, "metadata", None)
        user_id = metadata.get("user_id") if isinstance(metadata, Mapping) else None
        if isinstance(user_id, str):
            # Outside the pydantic fields: never dumped, never reaches the engine.
            object.__setattr__(chat_request, _USER_ID_ATTR, user_id)
        given = getattr(anthropic_request, "model_extra", None) or {}
        extra = getattr(chat_request, "__pydantic_extra__", None)
        if extra is not None:
            extra.update({k: given[k] for k in METADATA_FIELDS if k in given})
        return chat_request

    setattr(to_chat_completion_request, PATCHED_ATTR, True)
    cls.to_chat_completion_request = classmethod(to_chat_completion_request)
