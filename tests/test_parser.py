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
