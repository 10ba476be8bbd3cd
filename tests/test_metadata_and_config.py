"""Job metadata parsing, the API-side patch, and plugin settings."""

import pytest

from vllm_continuum_plugin.config import ContinuumConfig, load_config
from vllm_continuum_plugin.metadata import JobMetadata, MetadataError, parse_bool, parse_metadata


@pytest.mark.parametrize("value, expected", [
    (True, True), (False, False), (1, True), (0, False), ("true", True), ("False", False),
    (" TRUE ", True), ("1", True), ("0", False), (1.0, True),
])
def test_parse_bool_accepts_bools_ints_and_strings(value, expected):
    assert parse_bool(value, "is_last_step") is expected


@pytest.mark.parametrize("value", ["yes", "maybe", 2, -1, None, [], {}, 0.5, ""])
def test_parse_bool_rejects_everything_else_naming_the_field(value):
    with pytest.raises(MetadataError, match="is_last_step"):
        parse_bool(value, "is_last_step")


def test_parse_metadata_sources_and_defaults():
    assert parse_metadata(None) == JobMetadata()
    assert parse_metadata({}, session_id="sess-1").job_id == "sess-1"
    meta = parse_metadata({"job_id": 42, "is_last_step": 1, "tool_name": "pytest", "expected_tool_seconds": "3.5"})
    assert meta == JobMetadata("42", True, "pytest", None, 3.5)
    # vllm_xargs wins over session_id.
    assert parse_metadata({"job_id": "x"}, session_id="s").job_id == "x"
    # A sub-agent's id, normalised like a job id.
    assert parse_metadata({"agent_id": " a9 "}, session_id="s") == JobMetadata("s", agent_id="a9")


@pytest.mark.parametrize("bad", [
    {"job_id": ["a"]}, {"job_id": ""}, {"job_id": True}, {"job_id": "x" * 300},
    {"job_id": "a", "expected_tool_seconds": -1}, {"job_id": "a", "tool_name": 5},
    # Control characters are reserved for implicit job ids: no client can name one.
    {"job_id": "\x00implicit-1"}, {"job_id": "a\nb"},
    # msgspec cannot carry integers past 64 bits to the engine.
    {"job_id": 10**29}, {"job_id": -(2**63) - 1},
    # Hints are bounded: they are parsed on the engine thread and kept per job.
    {"tool_command": " " * 16385}, {"tool_name": "x" * 257},
    {"expected_tool_seconds": 10**400}, {"expected_tool_seconds": 1e308}, {"expected_tool_seconds": "9" * 400},
    {"agent_id": "x" * 300}, {"agent_id": ""}, {"agent_id": ["a"]},
])
def test_parse_metadata_rejects_malformed_fields(bad):
    with pytest.raises(MetadataError) as info:
        parse_metadata(bad)
    assert info.value.field in bad


def test_errors_quote_long_values_in_part_and_ids_normalise_as_documented():
    with pytest.raises(MetadataError) as info:
        parse_metadata({"tool_command": "a" * 100_000})
    assert "100000 characters" in str(info.value) and len(str(info.value)) < 300
    with pytest.raises(MetadataError, match="30 digits"):
        parse_metadata({"job_id": 10**29})
    # One job: an integer and its digits; surrounding whitespace.
    assert parse_metadata({"job_id": 17}).job_id == parse_metadata({"job_id": "17"}).job_id == "17"
    assert parse_metadata({"job_id": " a "}).job_id == "a"
    assert parse_metadata({"job_id": 2**63 - 1}).job_id == str(2**63 - 1)
    assert parse_metadata({"tool_command": " " * 16384}).tool_command is None  # at the limit: accepted


def test_api_patch_copies_top_level_fields_and_rejects_bad_ones():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.exceptions import VLLMValidationError

    from vllm_continuum_plugin.registration import register

    register()  # installs the post-import patch (module may already be imported)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "job_id": "j1", "is_last_step": "false"}
    params = ChatCompletionRequest(**body).to_sampling_params(16, {})
    assert params.extra_args == {"job_id": "j1", "is_last_step": "false"}
    # vllm_xargs wins over top-level fields.
    params = ChatCompletionRequest(**body, vllm_xargs={"is_last_step": 1}).to_sampling_params(16, {})
    assert params.extra_args["is_last_step"] == 1
    with pytest.raises(VLLMValidationError, match="is_last_step"):
        ChatCompletionRequest(**{**body, "is_last_step": "maybe"}).to_sampling_params(16, {})
    plain = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    assert not plain.to_sampling_params(16, {}).extra_args


def test_api_patch_covers_responses_and_session_ids():
    from vllm.entrypoints.generate.base.serving import GenerateBaseServing
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.exceptions import VLLMValidationError

    from vllm_continuum_plugin.registration import register

    register()
    with pytest.raises(VLLMValidationError, match="job_id"):
        ResponsesRequest(model="m", input="hi", job_id=10**29).to_sampling_params(16, {})
    params = ResponsesRequest(model="m", input="hi", job_id="r1").to_sampling_params(16, {})
    assert params.extra_args["job_id"] == "r1"
    messages = [{"role": "user", "content": "hi"}]
    # A session id becomes the job id when there is none: validated like one.
    with pytest.raises(VLLMValidationError, match="session_id"):
        GenerateBaseServing._get_session_id(ChatCompletionRequest(model="m", messages=messages,
                                                                  session_id="s" * 300), None)
    ok = ChatCompletionRequest(model="m", messages=messages, session_id="sess-1")
    assert GenerateBaseServing._get_session_id(ok, None) == "sess-1"
    # With a job id the session id is vLLM's own business.
    with_job = ChatCompletionRequest(model="m", messages=messages, session_id="s" * 300, job_id="j")
    assert GenerateBaseServing._get_session_id(with_job, None) == "s" * 300


def test_config_precedence_env_then_additional_config():
    env = {"CONTINUUM_DEFAULT_TTL_S": "5", "CONTINUUM_TTL_POLICY": "fixed", "CONTINUUM_PIN_ON_STOP_STRING": "off"}
    cfg = load_config({"continuum": {"default_ttl_s": 7}}, environ=env)
    assert cfg.default_ttl_s == 7.0 and cfg.ttl_policy == "fixed" and cfg.pin_on_stop_string is False
    assert load_config(None, environ={}) == ContinuumConfig()


@pytest.mark.parametrize("section, message", [
    ({"ttl_policy": "magic"}, "ttl_policy='magic'"),
    ({"max_pinned_fraction": 1.5}, "max_pinned_fraction=1.5"),
    ({"default_ttl_s": "soon"}, "default_ttl_s='soon'"),
    ({"cold_start_samples": 2.5}, "cold_start_samples=2.5"),
    ({"no_such_setting": 1}, "unknown continuum setting 'no_such_setting'"),
    ({"implicit_max_jobs": -1}, "implicit_max_jobs=-1"),
    ({"finish_actions": ["a|b"]}, "finish_actions=['a|b']"),
    ({"finish_actions": 3}, "finish_actions=3"),
])
def test_config_errors_name_the_bad_value(section, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(".", r"\.")):
        load_config({"continuum": section}, environ={})


def test_finish_actions_from_a_json_list_or_a_string():
    cfg = load_config({"continuum": {"finish_actions": ["submit", "  echo   DONE "]}}, environ={})
    assert cfg.finish_action_list == ("submit", "echo DONE")
    env = {"CONTINUUM_FINISH_ACTIONS": "finish|exit 0", "CONTINUUM_IMPLICIT_JOBS": "false"}
    cfg = load_config(None, environ=env)
    assert cfg.finish_action_list == ("finish", "exit 0") and cfg.implicit_jobs is False
    assert "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in ContinuumConfig().finish_action_list


def _envelope(*actions):
    from vllm.v1.kv_hints.protocol import KvHintAction, KvHintsEnvelope

    return KvHintsEnvelope(protocol_version="1", message_id="m1", actions=[
        KvHintAction(action_id=f"a{i}", action_type=t, action_version=v, payload=p)
        for i, (t, v, p) in enumerate(actions)
    ])


def test_vllm_kv_hints_are_one_more_metadata_form():
    """vLLM's typed KvHintsEnvelope (Request.kv_hints): the plugin reads its
    own action, leaves other components' actions alone, and the
    vllm_xargs/top-level fields win per field."""
    hints = _envelope(("offload.prefetch", "1", {"anything": 1}),
                      ("vllm_continuum.job", "1", {"job_id": "h-1", "is_last_step": "true",
                                                   "expected_tool_seconds": 2}))
    assert parse_metadata(None, kv_hints=hints) == JobMetadata("h-1", True, None, None, 2.0)
    assert parse_metadata({"is_last_step": False}, kv_hints=hints).is_last_step is False
    assert parse_metadata(None, session_id="s", kv_hints=hints).job_id == "h-1"
    assert parse_metadata(None, session_id="s", kv_hints=_envelope(("other", "1", {}))).job_id == "s"
    for bad, named in [
        (("vllm_continuum.job", "2", {"job_id": "x"}), "action_version"),
        (("vllm_continuum.job", "1", {"jobid": "x"}), "payload key"),
        (("vllm_continuum.job", "1", {"job_id": ["x"]}), "job_id"),
    ]:
        with pytest.raises(MetadataError, match=named):
            parse_metadata(None, kv_hints=_envelope(bad))
