"""Native tool-call recognition in raw decoded replies (pure logic).

Samples are written in the exact shapes vLLM's parsers read (file names are
relative to the installed ``vllm`` package) and the chat templates or agent
frameworks that produce them.
"""

from __future__ import annotations

import pytest

from vllm_continuum_plugin.estimators.native_calls import (
    CODE_TOOL,
    NativeCall,
    command_of,
    extract_native_calls,
    tool_key_of,
)


def _calls(text: str) -> list[tuple[str, dict, str]]:
    return [(c.name, c.arguments, c.format) for c in extract_native_calls(text)]


# --------------------------------------------------------------------------
# Hermes / Qwen2.5 (tool_parsers/hermes_tool_parser.py; Qwen2.5 chat template)

# Qwen2.5-Instruct reply as decoded with special tokens kept.
HERMES_QWEN25 = (
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n'
    "</tool_call><|im_end|>"
)
# NousResearch Hermes-2-Pro: arguments sent as a JSON string.
HERMES_STRING_ARGS = (
    '<tool_call>\n{"arguments": "{\\"command\\": \\"git status\\"}", '
    '"name": "execute_bash"}\n</tool_call>'
)
# Generation stopped before the closing tag (hermes regex `<tool_call>(.*)`).
HERMES_UNTERMINATED = '<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}'
# OpenHands CodeAct agent served by a Qwen2.5 model: the finish tool.
HERMES_FINISH = (
    "The fix is in place and the tests pass.\n<tool_call>\n"
    '{"name": "finish", "arguments": {"message": "Fixed the off-by-one.", '
    '"task_completed": "true"}}\n</tool_call>'
)


def test_hermes_qwen25() -> None:
    assert _calls(HERMES_QWEN25) == [("bash", {"command": "ls -la"}, "hermes")]
    assert command_of(extract_native_calls(HERMES_QWEN25)[0]) == "ls -la"


def test_hermes_string_arguments() -> None:
    (call,) = extract_native_calls(HERMES_STRING_ARGS)
    assert call == NativeCall("execute_bash", {"command": "git status"}, "hermes")
    assert command_of(call) == "git status"
    assert tool_key_of(call) == ""


def test_hermes_missing_close_tag() -> None:
    assert _calls(HERMES_UNTERMINATED) == [("bash", {"command": "pwd"}, "hermes")]


def test_finish_tool() -> None:
    (call,) = extract_native_calls(HERMES_FINISH)
    assert call.name == "finish"
    assert call.arguments["message"] == "Fixed the off-by-one."
    assert command_of(call) is None
    assert tool_key_of(call) == "finish"


def test_hermes_parallel_calls_in_order() -> None:
    text = (
        '<tool_call>\n{"name": "str_replace_editor", "arguments": {"command": "view", '
        '"path": "/workspace/app.py"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "bash", "arguments": {"command": "pytest -q"}}\n</tool_call>'
    )
    calls = extract_native_calls(text)
    assert [c.name for c in calls] == ["str_replace_editor", "bash"]
    assert [tool_key_of(c) for c in calls] == ["str_replace_editor view", ""]
    assert command_of(calls[1]) == "pytest -q"


def test_hermes_malformed_json_keeps_name() -> None:
    # Unescaped quote inside the command: json fails, the name is still known.
    text = '<tool_call>\n{"name": "bash", "arguments": {"command": "echo "hi""}}\n</tool_call>'
    assert _calls(text) == [("bash", {}, "hermes")]
    # Nothing recognisable inside the tags at all.
    assert extract_native_calls("<tool_call>\n{not json at all\n</tool_call>") == []


# --------------------------------------------------------------------------
# Qwen3-Coder XML (parser/qwen3.py, tool_parsers/qwen3_engine_tool_parser.py)

# Qwen3-Coder-30B-A3B-Instruct driving a SWE agent: multi-line command.
QWEN3_MULTILINE = (
    "I'll run the failing test first.\n"
    "<tool_call>\n<function=bash>\n<parameter=command>\n"
    "cd /testbed &&\npython -m pytest tests/test_utils.py -x -q\n"
    "</parameter>\n</function>\n</tool_call><|im_end|>"
)
# OpenHands str_replace_editor through the Qwen3-Coder template.
QWEN3_EDITOR_VIEW = (
    "<tool_call>\n<function=str_replace_editor>\n<parameter=command>\nview\n"
    "</parameter>\n<parameter=path>\n/workspace/django/django/db/models/query.py\n"
    "</parameter>\n<parameter=view_range>\n[120, 180]\n</parameter>\n"
    "</function>\n</tool_call>"
)


def test_qwen3_multiline_command() -> None:
    (call,) = extract_native_calls(QWEN3_MULTILINE)
    assert call.format == "qwen3_xml"
    assert command_of(call) == "cd /testbed &&\npython -m pytest tests/test_utils.py -x -q"


def test_openhands_str_replace_editor_view() -> None:
    (call,) = extract_native_calls(QWEN3_EDITOR_VIEW)
    assert call.name == "str_replace_editor"
    assert call.arguments == {
        "command": "view",
        "path": "/workspace/django/django/db/models/query.py",
        "view_range": "[120, 180]",  # values stay strings (no tool schema here)
    }
    assert tool_key_of(call) == "str_replace_editor view"
    assert command_of(call) is None


def test_qwen3_without_outer_tags_and_several_functions() -> None:
    text = (
        "<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n"
        "<function=think>\n<parameter=thought>\nok\n</parameter>\n</function>"
    )
    assert _calls(text) == [
        ("bash", {"command": "ls"}, "qwen3_xml"),
        ("think", {"thought": "ok"}, "qwen3_xml"),
    ]


def test_qwen3_truncated_parameter() -> None:
    text = "<tool_call>\n<function=bash>\n<parameter=command>\nmake -j8"
    assert _calls(text) == [("bash", {"command": "make -j8"}, "qwen3_xml")]


# --------------------------------------------------------------------------
# Llama-3 JSON (tool_parsers/llama_tool_parser.py; Llama-3.1/3.2 templates)

# Llama-3.1-8B-Instruct with <|python_tag|> and the eom token kept.
LLAMA_TAGGED = (
    '<|python_tag|>{"name": "bash", "parameters": {"command": "cat README.md"}}<|eom_id|>'
)
# Llama-3.2 JSON tool calling (no tag), two calls separated by ';'.
LLAMA_TWO = (
    '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
    '{"name": "bash", "arguments": {"command": "date"}}<|eot_id|>'
)


def test_llama3_tagged() -> None:
    assert _calls(LLAMA_TAGGED) == [("bash", {"command": "cat README.md"}, "llama3_json")]


def test_llama3_semicolon_separated_in_order() -> None:
    assert _calls(LLAMA_TWO) == [
        ("get_weather", {"city": "Paris"}, "llama3_json"),
        ("bash", {"command": "date"}, "llama3_json"),
    ]


def test_llama3_json_that_is_not_a_call() -> None:
    assert extract_native_calls('{"answer": 42, "unit": "m"}') == []
    # JSON quoted inside prose is not a Llama-3 call (the reply must be the call).
    assert extract_native_calls('Use {"name": "bash", "parameters": {}} next time.') == []


# --------------------------------------------------------------------------
# Mistral (parser/mistral.py, tool_parsers/mistral_tool_parser.py)

# Mistral-7B-Instruct-v0.3 (tokenizer < v11): JSON list after [TOOL_CALLS].
MISTRAL_LEGACY = (
    '[TOOL_CALLS][{"name": "bash", "arguments": {"command": "ls src"}}, '
    '{"name": "str_replace_editor", "arguments": {"command": "create", '
    '"path": "/tmp/a.py", "file_text": "print(1)"}}]</s>'
)
# Mistral-Small / Devstral (tokenizer v11+): NAME[ARGS]{...}, one marker per call.
MISTRAL_V11 = (
    '[TOOL_CALLS]bash[ARGS]{"command": "grep -rn TODO ."}'
    '[TOOL_CALLS]finish[ARGS]{"message": "done"}</s>'
)


def test_mistral_legacy_list() -> None:
    calls = extract_native_calls(MISTRAL_LEGACY)
    assert [(c.name, c.format) for c in calls] == [
        ("bash", "mistral"),
        ("str_replace_editor", "mistral"),
    ]
    assert command_of(calls[0]) == "ls src"
    assert tool_key_of(calls[1]) == "str_replace_editor create"


def test_mistral_v11_args_marker() -> None:
    assert _calls(MISTRAL_V11) == [
        ("bash", {"command": "grep -rn TODO ."}, "mistral"),
        ("finish", {"message": "done"}, "mistral"),
    ]


def test_mistral_call_id_and_broken_args() -> None:
    text = '[TOOL_CALLS]bash[CALL_ID]a1B2c3D4e[ARGS]{"command": "uname -a"}'
    assert _calls(text) == [("bash", {"command": "uname -a"}, "mistral")]
    assert _calls('[TOOL_CALLS]bash[ARGS]{"command": "ls') == [("bash", {}, "mistral")]


# --------------------------------------------------------------------------
# gpt-oss / Harmony (parser/harmony.py, entrypoints/openai/parser/harmony_utils.py)

# gpt-oss-20b: analysis channel, then a commentary-channel function call.
HARMONY_CALL = (
    "<|channel|>analysis<|message|>Need to list files. Maybe ```bash\nrm -rf /\n```"
    "<|end|><|start|>assistant<|channel|>commentary to=functions.bash "
    '<|constrain|>json<|message|>{"command":"ls -la"}<|call|>'
)
# Recipient in the role part, before <|channel|>; the <|call|> stop token is
# not part of the decoded text.
HARMONY_RECIPIENT_FIRST = (
    "<|start|>assistant to=functions.str_replace_editor<|channel|>commentary json"
    '<|message|>{"command": "view", "path": "/repo/setup.py"}'
)


def test_harmony_function_call() -> None:
    assert _calls(HARMONY_CALL) == [("bash", {"command": "ls -la"}, "harmony")]


def test_harmony_recipient_before_channel() -> None:
    (call,) = extract_native_calls(HARMONY_RECIPIENT_FIRST)
    assert call.format == "harmony"
    assert tool_key_of(call) == "str_replace_editor view"


def test_harmony_final_answer_fence_outside_analysis() -> None:
    # mini-swe-agent text mode with gpt-oss: the action is a fence in the
    # final channel; the fence in the analysis channel is only reasoning.
    text = (
        "<|channel|>analysis<|message|>try ```bash\nrm -rf /\n```<|end|>"
        "<|start|>assistant<|channel|>final<|message|>THOUGHT: list.\n"
        "```mswea_bash_command\nls -la\n```<|return|>"
    )
    assert _calls(text) == [("bash", {"command": "ls -la"}, "fence")]


def test_harmony_bad_json_body() -> None:
    text = "<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{oops<|call|>"
    assert _calls(text) == [("bash", {}, "harmony")]


# --------------------------------------------------------------------------
# Fenced blocks (mini-swe-agent text mode)

# mini-swe-agent v1 default template (```bash) and v2 (```mswea_bash_command).
MSWEA_V2 = (
    "THOUGHT: I need to find where the parser is defined.\n\n"
    "```mswea_bash_command\ngrep -rn \"def parse\" src/ | head -20\n```"
)


def test_mini_swe_agent_fence() -> None:
    (call,) = extract_native_calls(MSWEA_V2)
    assert call == NativeCall("bash", {"command": 'grep -rn "def parse" src/ | head -20'}, "fence")
    assert command_of(call) == 'grep -rn "def parse" src/ | head -20'
    assert tool_key_of(call) == ""


def test_fences_all_shell_blocks_in_order_skip_others() -> None:
    # A ```python block is a code action (smolagents before 1.20), not a
    # shell command; untagged and other-language fences are neither.
    text = (
        "```python\nprint('code')\n```\n```\nuntagged\n```\n```json\n{}\n```\n"
        "```bash\ncd /repo\n```\nthen\n```sh\nmake test\n```\n```shell\ngit diff"
    )
    calls = extract_native_calls(text)
    assert calls[0] == NativeCall(CODE_TOOL, {"code": "print('code')"}, "code")
    assert [command_of(c) for c in calls[1:]] == ["cd /repo", "make test", "git diff"]


def test_structured_call_wins_over_fence_in_prose() -> None:
    text = "Equivalent to:\n```bash\nls\n```\n" + HERMES_QWEN25
    assert _calls(text) == [("bash", {"command": "ls -la"}, "hermes")]


# --------------------------------------------------------------------------
# Thinking

def test_thinking_before_call_is_ignored() -> None:
    text = (
        "<think>\nMaybe <tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>"
        " ... no.\n</think>\n\n" + QWEN3_MULTILINE
    )
    assert [c.name for c in extract_native_calls(text)] == ["bash"]


def test_lone_close_think_drops_prompted_reasoning() -> None:
    # Qwen3 / DeepSeek-R1 templates put "<think>\n" in the prompt.
    text = "I could run ```bash\nrm -rf build\n```\n</think>\n\n" + MISTRAL_V11
    assert [c.name for c in extract_native_calls(text)] == ["bash", "finish"]


def test_unterminated_think_is_dropped() -> None:
    assert extract_native_calls("<think>\nI should run\n```bash\nls\n```\nbut") == []
    text = HERMES_QWEN25[: -len("<|im_end|>")] + "\n<think>\nnext I will <tool_call>"
    assert _calls(text) == [("bash", {"command": "ls -la"}, "hermes")]


def test_mistral_think_tokens() -> None:
    text = '[THINK]use [TOOL_CALLS]rm[ARGS]{}[/THINK][TOOL_CALLS]bash[ARGS]{"command": "ls"}'
    assert _calls(text) == [("bash", {"command": "ls"}, "mistral")]


# --------------------------------------------------------------------------
# Prose, bounds, robustness

@pytest.mark.parametrize(
    "text",
    [
        "",
        "The tests pass now. Let me know if you need anything else.",
        "Use the `bash` tool with {braces} and [brackets]; call me maybe.",
        "Use ```inline``` code",
        "<tool_call></tool_call>",
        "[TOOL_CALLS] and then some prose",
        "to=functions.bash without a message",
    ],
)
def test_plain_prose_has_no_calls(text: str) -> None:
    assert extract_native_calls(text) == []


def test_long_spaces_and_long_word() -> None:
    assert extract_native_calls(" " * 200_000) == []
    assert extract_native_calls("a" * 200_000) == []


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>" * 20_000,
        "<function=" * 20_000,
        "<parameter=" * 20_000 + "<function=x>",
        "```" * 70_000,
        "{" * 200_000,
        '{"a":' * 50_000,
        "[TOOL_CALLS]" + "[" * 200_000,
        "<|message|>" * 20_000,
        "<think>" * 30_000,
        '"name"' + " " * 200_000,
    ],
)
def test_adversarial_inputs_do_not_raise(text: str) -> None:
    assert isinstance(extract_native_calls(text), list)


def test_only_the_tail_is_read() -> None:
    text = HERMES_QWEN25 + "x" * 70_000
    assert extract_native_calls(text) == []
    assert len(extract_native_calls(text, max_chars=100_000)) == 1
    assert extract_native_calls(HERMES_QWEN25, max_chars=0) == []


def test_command_of_and_tool_key_of_rules() -> None:
    assert command_of(NativeCall("Execute_Bash", {"cmd": "ls"}, "hermes")) == "ls"
    assert command_of(NativeCall("run", {"script": "make"}, "hermes")) == "make"
    assert command_of(NativeCall("bash", {"command": ["ls"]}, "hermes")) == "ls"
    assert command_of(NativeCall("bash", {"command": ["ls", 3]}, "hermes")) is None
    assert command_of(NativeCall("bash", {"command": []}, "hermes")) is None
    assert command_of(NativeCall("python", {"code": "print(1)"}, "hermes")) is None
    git = NativeCall("git", {"subcommand": "status", "args": []}, "hermes")
    assert tool_key_of(git) == "git status"
    # Long or non-identifier values are data, not a sub-action.
    edit = NativeCall("editor", {"action": "replace all the things"}, "hermes")
    assert tool_key_of(edit) == "editor"
    assert tool_key_of(NativeCall("terminal", {"command": "view"}, "hermes")) == ""


def test_native_call_is_frozen_and_hashable() -> None:
    call = NativeCall("bash", {"command": "ls"}, "fence")
    with pytest.raises(AttributeError):
        call.name = "sh"  # type: ignore[misc]
    assert hash(call) == hash(NativeCall("bash", {"command": "pwd"}, "fence"))


# --------------------------------------------------------------------------
# Claude Code over /v1/messages: vLLM's Anthropic endpoint turns the model's
# raw tool call (here Hermes, --tool-call-parser hermes) into a tool_use
# block, and renders that tool_use back into the next prompt in the same
# raw format. Tool names are Claude Code's own (capitalised).

def _hermes(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call><|im_end|>'


def test_claude_code_bash_tool_is_a_shell_command() -> None:
    text = _hermes("Bash", '{"command": "pytest -q", "description": "Run the tests"}')
    (call,) = extract_native_calls(text)
    assert call == NativeCall("Bash", {"command": "pytest -q", "description": "Run the tests"}, "hermes")
    assert command_of(call) == "pytest -q" and tool_key_of(call) == ""


@pytest.mark.parametrize(
    "name, arguments",
    [
        ("Read", '{"file_path": "/repo/a.py"}'),
        ("Edit", '{"file_path": "/repo/a.py", "old_string": "a - b", "new_string": "a + b"}'),
        ("Write", '{"file_path": "/repo/b.py", "content": "x = 1"}'),
        ("Grep", '{"pattern": "def parse", "path": "src"}'),
        ("Glob", '{"pattern": "**/*.py"}'),
        ("Task", '{"description": "find callers", "prompt": "...", "subagent_type": "general-purpose"}'),
        ("WebFetch", '{"url": "https://example.com", "prompt": "summarise"}'),
        ("WebSearch", '{"query": "vllm scheduler"}'),
        ("TodoWrite", '{"todos": [{"content": "fix", "status": "pending"}]}'),
        ("NotebookEdit", '{"notebook_path": "a.ipynb", "new_source": "x"}'),
    ],
)
def test_claude_code_tools_are_keyed_by_name(name: str, arguments: str) -> None:
    (call,) = extract_native_calls(_hermes(name, arguments))
    assert call.name == name and command_of(call) is None and tool_key_of(call) == name


# --------------------------------------------------------------------------
# Codex CLI: "shell" takes an argv list, "exec_command" a string "cmd"

@pytest.mark.parametrize(
    "arguments, command",
    [
        ('{"command": ["bash", "-lc", "pytest -q"], "workdir": "/repo"}', "pytest -q"),
        ('{"command": ["/bin/zsh", "-l", "-c", "cd src && make"]}', "cd src && make"),
        ('{"command": ["rg", "-n", "def parse", "src"]}', "rg -n 'def parse' src"),
        ('{"command": ["apply_patch", "*** Begin Patch\\n*** Update File: a.py\\n*** End Patch"]}', "apply_patch"),
    ],
)
def test_codex_shell_argv_list_is_the_command_it_runs(arguments: str, command: str) -> None:
    (call,) = extract_native_calls(_hermes("shell", arguments))
    assert command_of(call) == command


def test_codex_exec_command_and_shell_command() -> None:
    (call,) = extract_native_calls(_hermes("exec_command", '{"cmd": "git status", "yield_time_ms": 1000}'))
    assert command_of(call) == "git status"
    (call,) = extract_native_calls(_hermes("shell_command", '{"command": "ls -la"}'))
    assert command_of(call) == "ls -la"
    (call,) = extract_native_calls(_hermes("apply_patch", '{"input": "*** Begin Patch"}'))
    assert command_of(call) is None and tool_key_of(call) == "apply_patch"


# --------------------------------------------------------------------------
# smolagents CodeAgent code actions

SMOLAGENTS_126 = (  # stopped at the "</code>" stop string: unterminated
    "Thought: I will search the web for the population.\n"
    "<code>\nresult = web_search(query=\"population of Paris\")\nprint(result)\n"
)
SMOLAGENTS_LEGACY = (
    "Thought: I will search.\nCode:\n```py\nresult = web_search(query=\"x\")\nprint(result)\n```<end_code>"
)


@pytest.mark.parametrize("text", [SMOLAGENTS_126, SMOLAGENTS_126 + "</code>", SMOLAGENTS_LEGACY])
def test_smolagents_code_action_is_a_code_call(text: str) -> None:
    (call,) = extract_native_calls(text)
    assert call == NativeCall(
        CODE_TOOL, {"code": 'result = web_search(query="population of Paris")\nprint(result)'
                    if "Paris" in text else 'result = web_search(query="x")\nprint(result)'}, "code",
    )


def test_code_tag_inside_prose_is_not_a_code_action() -> None:
    assert extract_native_calls("Wrap it in <code>foo()</code> tags.") == []
    assert extract_native_calls("<code>\n\n</code>") == []


def test_smolagents_structured_output_code_action() -> None:
    text = '{"thought": "Done.", "code": "final_answer(42)"}'
    assert extract_native_calls(text) == [NativeCall(CODE_TOOL, {"code": "final_answer(42)"}, "code")]
