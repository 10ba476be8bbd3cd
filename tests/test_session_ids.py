"""Session ids harnesses send on their own: precedence and validation.

The API-server side runs through vLLM's own classes with the plugin's
patches applied: ``GenerateBaseServing._get_session_id`` (every generate
endpoint, ``/v1/messages`` included) and ``AnthropicServingMessages.
to_chat_completion_request`` (the ``/v1/messages`` -> chat conversion).
"""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.datastructures import Headers

from vllm_continuum_plugin.config import ContinuumConfig, load_config
from vllm_continuum_plugin.metadata import MetadataError, parse_metadata
from vllm_continuum_plugin.registration import register
from vllm_continuum_plugin.session_ids import (
    DEFAULT_SESSION_HEADERS,
    MAX_USER_ID_CHARS,
    client_session_id,
    parse_session_headers,
    session_from_user_id,
)

register()  # installs the post-import patches before vLLM's modules load

from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest  # noqa: E402
from vllm.entrypoints.anthropic.serving import AnthropicServingMessages  # noqa: E402
from vllm.entrypoints.generate.base.serving import GenerateBaseServing  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402

CLAUDE = "X-Claude-Code-Session-Id"
UUID_A = "3f1c2a9e-7d41-4b8e-9c55-0a6e2b1d4f10"
UUID_B = "8b0d5e21-1c3a-4f7e-a2d9-6e4c3b2a1f00"


def claude_user_id(session: Any = UUID_A) -> str:
    """Claude Code 2.1.x's metadata.user_id: a JSON string."""
    return json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": session})


def raw_request(headers: dict[str, str] | None = None, policy: str = "continuum",
                continuum: dict[str, Any] | None = None) -> Any:
    """What the route hands vLLM: headers and the app's state (vllm_config)."""
    vllm_config = SimpleNamespace(
        scheduler_config=SimpleNamespace(policy=policy, scheduler_cls=None),
        additional_config={"continuum": continuum} if continuum else {},
    )
    return SimpleNamespace(headers=Headers(headers or {}), app=SimpleNamespace(state=SimpleNamespace(vllm_config=vllm_config)))


def chat_request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)


def session_of(request: Any, raw: Any) -> str | None:
    return GenerateBaseServing._get_session_id(request, raw)


def messages_request(user_id: Any = None) -> ChatCompletionRequest:
    """A /v1/messages body converted the way vLLM serves it."""
    body: dict[str, Any] = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    if user_id is not None:
        body["metadata"] = {"user_id": user_id}
    return AnthropicServingMessages.to_chat_completion_request(AnthropicMessagesRequest(**body))


# ---------------------------------------------------------------- the setting

def test_default_setting_lists_the_harness_headers_in_precedence_order():
    assert ContinuumConfig().session_header_list == (CLAUDE, "x-opencode-session", "session_id", "conversation_id",
                                                     "X-Dynamo-Session-ID", "X-Session-Affinity")
    assert ContinuumConfig().session_headers == DEFAULT_SESSION_HEADERS


def test_custom_headers_as_pipes_or_a_json_list_and_empty_turns_them_off():
    assert load_config({"continuum": {"session_headers": "X-My-Agent | x-run"}}).session_header_list == (
        "X-My-Agent", "x-run")
    assert load_config({"continuum": {"session_headers": ["X-My-Agent"]}}).session_header_list == ("X-My-Agent",)
    assert load_config({}, environ={"CONTINUUM_SESSION_HEADERS": "x-env"}).session_header_list == ("x-env",)
    assert load_config({"continuum": {"session_headers": ""}}).session_header_list == ()


@pytest.mark.parametrize("bad, named", [
    ("X Session", "X Session"), ("x:y", "x:y"), ("x\ny", None), ("é-session", "é-session"),
    ("a|A", "'A' is listed twice"), ("x" * 65, "x" * 64), ("|".join(f"h{i}" for i in range(17)), "17 header names"),
])
def test_the_setting_takes_header_names_only_and_names_the_bad_one(bad, named):
    with pytest.raises(ValueError, match="session_headers") as info:
        load_config({"continuum": {"session_headers": bad}})
    if named:
        assert named in str(info.value)


def test_a_json_list_item_with_the_separator_is_refused():
    with pytest.raises(ValueError, match="session_headers"):
        load_config({"continuum": {"session_headers": ["a|b"]}})


# ----------------------------------------------------- metadata.user_id

def test_claude_code_user_id_json_carries_the_session():
    assert session_from_user_id(claude_user_id()) == UUID_A
    assert session_from_user_id(claude_user_id(17)) == "17"  # ids normalise like job_id


@pytest.mark.parametrize("user_id", [
    "user-1234",                       # a plain user id (the Anthropic API's meaning)
    '{"session_id": "a"',              # malformed JSON
    '{"session_id": "a", }',
    "[" * 900 + "]" * 900,             # not an object (and deep)
    "{" + '"a":[' * 300 + "]" * 300 + "}",
    '{"device_id": "d"}',              # no session_id
    '{"session_id": null}',
    '"{\\"session_id\\": \\"a\\"}"',   # a JSON string, not an object
    "",
    42, None, {"session_id": "a"},     # not a string at all
])
def test_user_id_without_a_session_json_is_ignored(user_id):
    assert session_from_user_id(user_id) is None


def test_malformed_user_id_is_logged_at_debug_and_never_raises(caplog):
    with caplog.at_level(logging.DEBUG, logger="vllm.continuum_plugin"):
        assert session_from_user_id('{"session_id": ') is None
    assert "not valid JSON" in caplog.text


def test_oversized_user_id_is_not_parsed():
    huge = json.dumps({"session_id": UUID_A, "pad": "x" * MAX_USER_ID_CHARS})
    assert session_from_user_id(huge) is None


@pytest.mark.parametrize("session", ["x" * 300, "", "a\nb", ["a"], True])
def test_a_bad_session_inside_user_id_is_refused_like_x_session_id(session):
    with pytest.raises(MetadataError) as info:
        session_from_user_id(claude_user_id(session))
    assert info.value.field == "metadata.user_id session_id"


# ------------------------------------------------------------ precedence

def test_headers_in_the_listed_order_then_user_id():
    headers = {"session_id": "codex", "x-opencode-session": "opencode", CLAUDE: "claude", "conversation_id": "conv",
               "X-Session-Affinity": "affinity", "X-Dynamo-Session-ID": "dynamo"}
    names = parse_session_headers(DEFAULT_SESSION_HEADERS)
    for expected in ("claude", "opencode", "codex", "conv", "dynamo", "affinity"):
        h = Headers(headers)
        assert client_session_id(h.get, names, claude_user_id()) == expected
        del headers[next(k for k, v in headers.items() if v == expected)]
    assert client_session_id(Headers({}).get, names, claude_user_id()) == UUID_A
    assert client_session_id(Headers({}).get, names, None) is None


def test_vllm_session_id_wins_over_the_harness_headers():
    raw = raw_request({"X-Session-ID": "vllm-header", CLAUDE: UUID_A})
    assert session_of(chat_request(), raw) == "vllm-header"
    assert session_of(chat_request(session_id="vllm-body"), raw) == "vllm-body"


def test_the_plugin_job_id_wins_and_leaves_vllm_behaviour_unchanged():
    raw = raw_request({CLAUDE: "x" * 300})  # invalid, but never read: job_id names the job
    assert session_of(chat_request(job_id="mine"), raw) is None
    raw = raw_request({"X-Session-ID": "kept", CLAUDE: UUID_A})
    assert session_of(chat_request(job_id="mine"), raw) == "kept"  # vLLM's own value, untouched


def test_aiperf_without_a_session_header_flag_names_its_conversations():
    """AIPerf 0.13 (``transports/base_transports.py``) sends each request
    of a conversation its correlation id as ``X-Correlation-ID`` (renamed
    by ``--session-header``) and, by default, as ``X-Session-Affinity``; a
    replayed sub-agent is a conversation of its own with its own id (and,
    with Dynamo's headers on, its parent's in ``X-Dynamo-Parent-Session-ID``).
    The affinity key names the job; the correlation header alone (a tracing
    id elsewhere) names none."""
    parent, child = "5f0c6a2e-1d3b-4e8f-9a7c-2b4d6e8f0a1c", "5f0c6a2e-1d3b-4e8f-9a7c-2b4d6e8f0a1c::sa:a1b2"
    assert session_of(chat_request(), raw_request({"X-Correlation-ID": parent, "X-Session-Affinity": parent})) == parent
    child_headers = {"X-Correlation-ID": child, "X-Session-Affinity": child,
                     "X-Dynamo-Session-ID": child, "X-Dynamo-Parent-Session-ID": parent}
    assert session_of(chat_request(), raw_request(child_headers)) == child
    assert session_of(chat_request(), raw_request({"X-Correlation-ID": parent})) is None
    # --session-header X-Session-ID: vLLM's own header, the same value.
    assert session_of(chat_request(), raw_request({"X-Session-ID": child, "X-Session-Affinity": child})) == child


def test_two_harness_headers_at_once_the_first_listed_wins():
    raw = raw_request({"x-opencode-session": "ses_open", CLAUDE: UUID_A})
    assert session_of(chat_request(), raw) == UUID_A
    assert session_of(chat_request(), raw_request({"x-opencode-session": "ses_open", "session_id": UUID_B})) == "ses_open"


def test_header_names_are_case_insensitive():
    assert session_of(chat_request(), raw_request({CLAUDE.lower(): UUID_A})) == UUID_A
    assert session_of(chat_request(), raw_request({"Session_Id": UUID_B})) == UUID_B


def test_an_empty_header_counts_as_absent():
    assert session_of(chat_request(), raw_request({CLAUDE: "", "session_id": UUID_B})) == UUID_B


def test_the_custom_header_setting_replaces_the_list():
    raw = raw_request({"X-My-Harness": "run-9", CLAUDE: UUID_A}, continuum={"session_headers": "X-My-Harness"})
    assert session_of(chat_request(), raw) == "run-9"
    raw = raw_request({CLAUDE: UUID_A}, continuum={"session_headers": "X-My-Harness"})
    assert session_of(chat_request(), raw) is None


def test_a_stock_policy_server_reads_no_harness_header():
    assert session_of(chat_request(), raw_request({CLAUDE: UUID_A}, policy="fcfs")) is None
    # vLLM's own X-Session-ID is as before.
    assert session_of(chat_request(), raw_request({"X-Session-ID": "s"}, policy="fcfs")) == "s"


def test_the_plugin_scheduler_class_with_a_stock_policy_reads_them():
    raw = raw_request({CLAUDE: UUID_A}, policy="fcfs")
    raw.app.state.vllm_config.scheduler_config.scheduler_cls = "vllm_continuum_plugin.scheduler.ContinuumScheduler"
    assert session_of(chat_request(), raw) == UUID_A


# ------------------------------------------------------------ validation

@pytest.mark.parametrize("value", ["x" * 300, "a\x01b", "y" * 100_000])
def test_a_bad_winning_header_is_a_400_naming_it(value):
    with pytest.raises(VLLMValidationError) as info:
        session_of(chat_request(), raw_request({CLAUDE: value}))
    assert f"{CLAUDE} header" in str(info.value) and len(str(info.value)) < 400


def test_a_bad_lower_precedence_header_is_never_read():
    raw = raw_request({CLAUDE: UUID_A, "session_id": "z" * 300})
    assert session_of(chat_request(), raw) == UUID_A


def test_the_winning_value_becomes_the_engine_job_id():
    raw = raw_request({CLAUDE: f"  {UUID_A} "})
    session = session_of(chat_request(), raw)
    assert session == UUID_A  # normalised like a job id
    assert parse_metadata(None, session_id=session).job_id == UUID_A


# ------------------------------------------------------------ /v1/messages

def test_messages_user_id_reaches_the_session_lookup():
    request = messages_request(claude_user_id())
    assert session_of(request, raw_request()) == UUID_A
    assert "device_id" not in request.model_dump_json()  # never serialised onwards


def test_messages_header_beats_user_id():
    assert session_of(messages_request(claude_user_id(UUID_B)), raw_request({CLAUDE: UUID_A})) == UUID_A


@pytest.mark.parametrize("user_id", ["plain-user", '{"session_id": ', "{" * MAX_USER_ID_CHARS])
def test_messages_with_a_malformed_user_id_are_served_untagged(user_id):
    assert session_of(messages_request(user_id), raw_request()) is None


def test_messages_with_a_bad_session_in_user_id_is_a_400():
    with pytest.raises(VLLMValidationError, match="metadata.user_id"):
        session_of(messages_request(claude_user_id("q" * 300)), raw_request())


def test_messages_without_metadata_fall_through_to_implicit_jobs():
    assert session_of(messages_request(), raw_request()) is None


# ------------------------------------------------------------ sub-agents

AGENT = "x-claude-code-agent-id"


def agent_of(request: Any, raw: Any) -> Any:
    """The ``agent_id`` the API server hands the engine for ``request``."""
    params = request.to_sampling_params(16, {})
    session_of(request, raw)
    return parse_metadata(params.extra_args, session_id=UUID_A).agent_id


def test_claude_codes_sub_agent_header_names_the_sub_agent():
    # Claude Code 2.1.328: every request of a sub-agent carries its id; the
    # main conversation's carry none.
    assert agent_of(chat_request(), raw_request({CLAUDE: UUID_A, AGENT: " a93945a99209facb3 "})) == "a93945a99209facb3"
    assert agent_of(chat_request(), raw_request({CLAUDE: UUID_A})) is None
    # The client's own field wins; a stock-policy server reads no header.
    assert agent_of(chat_request(agent_id="mine"), raw_request({AGENT: "a1"})) == "mine"
    assert agent_of(chat_request(), raw_request({AGENT: "a1"}, policy="fcfs")) is None


def test_a_bad_sub_agent_header_is_a_400_naming_it():
    request = chat_request()
    request.to_sampling_params(16, {})
    with pytest.raises(VLLMValidationError) as info:
        session_of(request, raw_request({CLAUDE: UUID_A, AGENT: "x" * 300}))
    assert f"{AGENT} header" in str(info.value)
