"""Tool-call parsing from agent replies (pure logic)."""

import pytest

from vllm_continuum_plugin.estimators.parser import (
    NO_TOOL_KEY,
    extract_tool_call,
    split_commands,
    strip_thinking,
    tool_key_for_command,
)


@pytest.mark.parametrize(
    "reply, command",
    [
        ("Let me look.\n```bash\nls -la\n```", "ls -la"),
        ("```sh\ncat main.py\n```", "cat main.py"),
        ("```shell\ngit status\n```\n", "git status"),
        # Last block wins: the command the agent actually wants run.
        ("First ```bash\nls\n``` then\n```bash\npytest -x\n```", "pytest -x"),
        # Generation stopped at the closing fence (stop string): unterminated.
        ("THOUGHT: run tests\n```bash\npython -m pytest tests/", "python -m pytest tests/"),
    ],
)
def test_extracts_last_fenced_shell_block(reply, command):
    call = extract_tool_call(reply)
    assert call is not None
    assert call.command == command


def test_thinking_is_removed_before_parsing():
    reply = "<think>maybe ```bash\nrm -rf /\n``` no</think>\nOK.\n```bash\nls\n```"
    assert extract_tool_call(reply).command == "ls"


def test_unterminated_thinking_yields_no_call():
    # Qwen3-style reply that ran out of tokens while thinking.
    assert extract_tool_call("<think>I should run ```bash\nls\n``` but") is None


def test_opening_think_tag_in_prompt():
    # Template pre-opened <think>: only the closing tag is in the reply.
    assert extract_tool_call("reasoning... ```bash\nrm x\n```</think>\n```bash\npwd\n```").command == "pwd"


def test_reply_without_tool_call():
    assert extract_tool_call("I am done, the fix is complete.") is None
    assert extract_tool_call("") is None
    # Untagged fences are code, not commands.
    assert extract_tool_call("```\nprint(1)\n```") is None


@pytest.mark.parametrize(
    "command, key",
    [
        ("python -m pytest -x tests/", "python -m pytest"),
        ("python3 script.py --flag", "python <script>"),
        ("python -c 'print(1)'", "python -c"),
        ("git status", "git status"),
        ("git log --oneline -5", "git log"),
        ("pip install -e .", "pip install"),
        ("cd repo && pytest -q", "pytest"),
        ("cat main.py | grep TODO", "cat"),
        ("FOO=1 sudo -E make test", "make test"),
        ("timeout 30 ./run_tests.sh", "sh <script>"),
        ("/usr/bin/ls -la", "ls"),
        ("cd /tmp", NO_TOOL_KEY),
        ("echo 'unbalanced", "echo"),
    ],
)
def test_tool_key_is_finer_than_first_word(command, key):
    assert tool_key_for_command(command) == key


def test_split_commands_on_operators_and_pipes():
    assert split_commands("cd a && cat f | grep x; ls || true") == ["cd a", "cat f", "grep x", "ls", "true"]


def test_parse_rate_on_realistic_replies():
    replies = [
        "THOUGHT: I need to see the files.\n\n```bash\nls -la\n```",
        "<think>\nThe test fails because add subtracts.\n</think>\nLet me open it.\n```bash\ncat main.py\n```",
        "```bash\nsed -i 's/a - b/a + b/' main.py && python -m pytest -q\n```",
        "Let's check the history.\n```sh\ngit log --oneline | head -5\n```",
        "<think>long reasoning without closing",
        "Done!",
    ]
    parsed = [extract_tool_call(r) for r in replies]
    assert [p.tool_key if p else None for p in parsed] == [
        "ls", "cat", "python -m pytest", "git log", None, None,
    ]
    assert strip_thinking("<think>a</think>b") == "b"


def test_parsing_is_bounded_whatever_the_input():
    from vllm_continuum_plugin.estimators.parser import MAX_PARSED_CHARS, shell_call

    # A run of spaces used to backtrack quadratically in the sequence split;
    # one huge word made shlex quadratic. Both are cut to what is parsed.
    spaces = shell_call(" " * 400_000 + "&& ls")
    assert len(spaces.command) == MAX_PARSED_CHARS and spaces.tool_key == NO_TOOL_KEY
    word = shell_call("x" * 400_000)
    assert len(word.command) == MAX_PARSED_CHARS and len(word.tool_key) <= 128
    assert split_commands("ls" + " " * 5000 + "&&" + " " * 5000 + "pwd") == ["ls", "pwd"]
    long_reply = "```bash\n" + "y" * 10_000 + "\n```"
    call = extract_tool_call(long_reply)
    assert call is not None and len(call.command) <= MAX_PARSED_CHARS


# --------------------------------------------------------------------------
# Agent clients' own formats: what each one's reply parses to (key, command)

from vllm_continuum_plugin.estimators.code_actions import MAX_FUNCTIONS, called_functions  # noqa: E402
from vllm_continuum_plugin.estimators.parser import CODE_KEY, CODE_TOOL, is_finish_action  # noqa: E402

FINISH = ("submit", "finish", "final_answer")


def _hermes(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call><|im_end|>'


def test_smolagents_code_tag_is_keyed_by_the_tools_it_calls():
    # smolagents 1.26: generation stops at the "</code>" stop string.
    reply = (
        "Thought: I need the page and a search.\n<code>\n"
        'page = visit_webpage(url="https://example.com")\n'
        'hits = web_search(query="example")\nprint(page[:200], hits)\n'
    )
    call = extract_tool_call(reply)
    assert call.tool == CODE_TOOL and call.tool_key == "visit_webpage+web_search"
    assert call.command.startswith("page = visit_webpage(") and call.functions == ("visit_webpage", "web_search")
    assert call.commands == () and not is_finish_action(call, FINISH)


def test_smolagents_legacy_py_fence_is_a_code_action():
    reply = 'Thought: search.\nCode:\n```py\nresult = web_search(query="x")\nprint(result)\n```<end_code>'
    call = extract_tool_call(reply)
    assert (call.tool, call.tool_key, call.command) == (CODE_TOOL, "web_search", 'result = web_search(query="x")\nprint(result)')
    python = extract_tool_call("```python\nanswer = wikipedia_search('Paris')\n```")
    assert python.tool_key == "wikipedia_search"


@pytest.mark.parametrize(
    "reply",
    [
        '<code>\nfinal_answer("Paris has 2.1 million inhabitants")\n</code>',
        "Thought: done.\n<code>\nx = web_search('a')\nfinal_answer(x)\n",
        "Code:\n```py\nfinal_answer(answer=42)\n```<end_code>",
        '{"thought": "I know it.", "code": "final_answer(42)"}',
    ],
)
def test_a_code_action_that_calls_final_answer_is_a_finish_action(reply):
    call = extract_tool_call(reply)
    assert call is not None and "final_answer" in call.functions
    assert is_finish_action(call, FINISH)
    assert not is_finish_action(call, ("submit", "finish"))  # only when final_answer is configured


def test_a_code_action_without_tool_calls_has_the_code_key():
    call = extract_tool_call("<code>\nimport math\nprint(math.sqrt(2) * len([1, 2]))\n</code>")
    assert call.tool_key == CODE_KEY and call.functions == ()


def test_called_functions_skips_strings_comments_methods_builtins_and_definitions():
    code = (
        "def helper(x):\n    return sorted(x)\n"
        "class Row(dict):\n    pass\n"
        "# web_search('in a comment')\n"
        "note = 'call foo() later' + \"and bar()\"\n"
        "doc = '''visit_webpage(x)\n'''\n"
        "rows = re.findall(r'a', s)\n"
        "@lru_cache(maxsize=None)\ndef cached(): pass\n"
        "helper(rows); Row(); text = f'{x}'\n"
        "final_answer(web_search (query='q'))\n"
    )
    assert called_functions(code) == ("final_answer", "web_search")
    many = "\n".join(f"tool_{i}()" for i in range(40))
    kept = called_functions(many)
    assert len(kept) == MAX_FUNCTIONS and kept[0] == "tool_0" and kept[-1] == "tool_39"


def test_claude_code_bash_tool_is_keyed_by_its_command():
    call = extract_tool_call(_hermes("Bash", '{"command": "cd /repo && pytest -q", "description": "Run tests"}'))
    assert (call.tool, call.tool_key, call.command) == ("bash", "pytest", "cd /repo && pytest -q")


@pytest.mark.parametrize(
    "name", ["Read", "Edit", "Write", "Grep", "Glob", "Task", "WebFetch", "WebSearch", "TodoWrite", "NotebookEdit"]
)
def test_claude_code_tool_names_are_keys(name):
    call = extract_tool_call(_hermes(name, '{"file_path": "/repo/a.py", "pattern": "x"}'))
    assert (call.tool, call.tool_key, call.command, call.commands) == (name, name, name, ())
    assert not is_finish_action(call, FINISH)


@pytest.mark.parametrize(
    "name, arguments, key, command",
    [
        ("shell", '{"command": ["bash", "-lc", "pytest -q"], "workdir": "/repo"}', "pytest", "pytest -q"),
        ("shell", '{"command": ["git", "diff", "--stat"]}', "git diff", "git diff --stat"),
        ("shell", '{"command": ["apply_patch", "*** Begin Patch\\n*** End Patch"]}', "apply_patch", "apply_patch"),
        ("exec_command", '{"cmd": "python -m pytest -x tests/"}', "python -m pytest", "python -m pytest -x tests/"),
        ("shell_command", '{"command": "ls -la"}', "ls", "ls -la"),
    ],
)
def test_codex_shell_tools_give_the_shell_command(name, arguments, key, command):
    call = extract_tool_call(_hermes(name, arguments))
    assert (call.tool, call.tool_key, call.command) == ("bash", key, command)


def test_codex_apply_patch_tool_is_keyed_by_name():
    call = extract_tool_call(_hermes("apply_patch", '{"input": "*** Begin Patch\\n*** End Patch"}'))
    assert (call.tool, call.tool_key) == ("apply_patch", "apply_patch")
