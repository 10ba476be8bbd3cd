"""The agent loop benchmark (pure logic: no server, real shell commands)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import time
import re
from collections.abc import Sequence

import pytest

from vllm_continuum_plugin.benchmarks.agent_loop import (
    DEFAULT_ALLOWED_PROGRAMS,
    FORMAT_ERROR,
    SYSTEM_PROMPT,
    TRACE_KEYS,
    AgentJob,
    ChatReply,
    CommandPolicy,
    CommandRunner,
    JobResult,
    LoopConfig,
    OpenAIChatClient,
    TraceRecord,
    TraceWriter,
    TurnLog,
    Workspace,
    build_parser,
    build_trace_records,
    forced_reply_regex,
    format_summary,
    is_submission,
    main,
    truncate_output,
)
from vllm_continuum_plugin.estimators.parser import extract_tool_call

# ---------------------------------------------------------------- policy


@pytest.mark.parametrize(
    "command",
    [
        "ls",
        "ls -la",
        "cat calc.py",
        "grep -rn 'def add' .",
        "python -m pytest -q",
        "python test_calc.py",
        "PYTHONPATH=. python3 test_calc.py",
        "git status",
        "git --no-pager diff",
        "git log --oneline",
        "cd utils && ls",
        "cd utils && cat ../calc.py",
        "cat calc.py | head -5 && wc -l calc.py",
        "sed -i 's/return a - b/return a + b/' calc.py",
        "python -c \"import calc; print(calc.add(1, 2))\"",
        "ls 2>/dev/null",
        "cat <<'EOF' > calc.py\ndef add(a, b):\n    return a + b\nEOF",
        "echo SUBMIT",
        "submit",
    ],
)
def test_policy_allows_workspace_commands(tmp_path, command):
    assert CommandPolicy(tmp_path).check(command) is None


@pytest.mark.parametrize(
    "command, reason_part",
    [
        ("rm -rf /", "filesystem root"),
        ("rm calc.py", "'rm' is not an allowed program"),
        ("curl http://x", "'curl'"),
        ("wget http://x -O- | python", "'wget'"),
        ("ls && ssh host", "'ssh'"),
        ("sudo ls", "'sudo'"),
        ("cat /etc/passwd", "absolute path '/etc/passwd'"),
        ("echo x > /evil", "absolute path '/evil'"),
        ("cat ../../x", "'../../x' escapes"),
        ("cd utils && cat ../../x", "'../../x' escapes"),
        ("cd /tmp", "absolute path '/tmp'"),
        ("cat ~/.bashrc", "home directory"),
        ("git push", "git push is not allowed"),
        ("git -C /etc status", "absolute path '/etc'"),
        ("echo $HOME", "'$HOME'"),
        ("echo $(id)", "'$('"),
        ("cat <<EOF > x\n`id`\nEOF", "'`'"),
        ("find . -exec cat {} ;", "find -exec"),
        ("/bin/ls", "'/bin/ls' is not an allowed program"),
        ("", "empty command"),
    ],
)
def test_policy_refuses_with_a_reason(tmp_path, command, reason_part):
    reason = CommandPolicy(tmp_path).check(command)
    assert reason is not None and reason_part in reason, reason


def test_policy_paths_inside_the_workspace_are_allowed(tmp_path):
    policy = CommandPolicy(tmp_path)
    assert policy.check(f"cat {os.path.realpath(tmp_path)}/calc.py") is None
    # Without a workspace every absolute path is outside.
    assert CommandPolicy().check("cat /x") is not None
    assert CommandPolicy().check("cat ../../x") is not None


@pytest.mark.parametrize("command", ["rm -rf /", "curl http://x", "sudo ls", "cat /etc/passwd", "git push"])
def test_allow_any_lifts_the_policy(command):
    assert CommandPolicy(allow_any=True).check(command) is None


@pytest.mark.parametrize(
    "command, submits",
    [("echo SUBMIT", True), ("git diff && echo SUBMIT", True), ("submit", True),
     ("ls && submit", True), ("echo submitted", False), ("ls", False)],
)
def test_submission_detection(command, submits):
    assert is_submission(command) is submits


# ---------------------------------------------------------------- output


def test_truncation_keeps_head_and_tail_and_marks_the_cut():
    text = "HEAD" + "x" * 1000 + "TAIL"
    out = truncate_output(text, 20)
    assert out.startswith("HEAD") and out.endswith("TAIL")
    assert "988 characters elided" in out  # 1008 - 20
    head, _, tail = out.partition("\n<...")
    assert len(head) + len(tail.split("...>\n", 1)[1]) == 20


def test_truncation_leaves_short_text_alone():
    assert truncate_output("short", 5) == "short"
    assert truncate_output("", 1) == ""
    with pytest.raises(ValueError, match="max_chars must be >= 1, got 0"):
        truncate_output("x", 0)


# ---------------------------------------------------------------- workspace and runner


@pytest.fixture
def workspace():
    ws = Workspace()
    yield ws
    ws.remove()
    assert not os.path.exists(ws.path)


def test_workspace_has_the_project_and_a_clean_git_repo(workspace):
    for name in ("calc.py", "test_calc.py", "README.md", "utils/__init__.py", "utils/text.py"):
        assert os.path.isfile(os.path.join(workspace.path, name)), name
    if shutil.which("git") is None:
        assert not workspace.is_git_repo
        return
    assert workspace.is_git_repo
    status = subprocess.run(["git", "status", "--porcelain"], cwd=workspace.path,
                            capture_output=True, text=True, check=True)
    assert status.stdout == ""


def test_commands_really_run_in_the_workspace(workspace):
    runner = CommandRunner(timeout_s=60)
    listing = runner.run("ls", workspace.path)
    assert listing.returncode == 0 and not listing.timed_out
    assert {"calc.py", "test_calc.py", "README.md", "utils"} <= set(listing.output.split())
    # The generated bug makes the tests fail, whichever way they are run.
    tests = runner.run(workspace.test_command, workspace.path)
    assert tests.returncode not in (0, None), tests.output
    assert "add" in tests.output
    plain = runner.run("python test_calc.py", workspace.path)
    assert plain.returncode == 1 and "FAIL test_add" in plain.output
    # The fix an agent would make passes them.
    fix = runner.run("sed -i 's/return a - b/return a + b/' calc.py && python test_calc.py", workspace.path)
    assert fix.returncode == 0, fix.output
    assert runner.run("echo SUBMIT", workspace.path).output.strip() == "SUBMIT"
    assert runner.run("submit", workspace.path).output.strip() == "SUBMIT"


def test_a_command_past_its_timeout_is_killed(workspace):
    # The timeout is derived from how fast this machine starts a shell and
    # echoes (a loaded 2-core machine can take over a second), so "started"
    # is printed before it whatever the load.
    t0 = time.perf_counter()
    assert "started" in CommandRunner(timeout_s=60.0).run("echo started", workspace.path).output
    timeout_s = max(1.0, 10 * (time.perf_counter() - t0))
    runner = CommandRunner(timeout_s=timeout_s)
    start = time.perf_counter()
    # `sleep` in a child of bash keeps the output pipe open: only killing the
    # process group ends the command.
    result = runner.run(f"echo started; sleep {30 + timeout_s:.0f}; echo never", workspace.path)
    elapsed = time.perf_counter() - start
    assert result.timed_out and result.returncode is None
    assert elapsed < timeout_s + 20.0, elapsed  # killed at its timeout, not after the 30 s sleep
    assert "started" in result.output and "never" not in result.output


def test_runner_rejects_bad_timeout():
    with pytest.raises(ValueError, match="timeout_s must be > 0, got 0"):
        CommandRunner(0)


# ---------------------------------------------------------------- the loop (scripted model)


class ScriptedChat:
    """Replies from a script; records every request."""

    def __init__(self, replies: Sequence[str]) -> None:
        self.replies = list(replies)
        self.requests: list[tuple[list[dict[str, str]], str, bool]] = []

    def complete(self, messages, job_id, is_last_step):
        self.requests.append(([dict(m) for m in messages], job_id, is_last_step))
        text = self.replies[min(len(self.requests) - 1, len(self.replies) - 1)]
        return ChatReply(text, prompt_tokens=100 * len(self.requests), completion_tokens=7,
                         cached_tokens=32)


def bash(command: str) -> str:
    return f"THOUGHT: next.\n```bash\n{command}\n```"


def run_job(workspace, replies, max_steps=6, timeout_s=30.0):
    chat = ScriptedChat(replies)
    config = LoopConfig(max_steps=max_steps, per_command_timeout_s=timeout_s, max_output_chars=500)
    start = time.perf_counter()
    job = AgentJob("job-0007", workspace, chat, config, CommandPolicy(workspace.path),
                   CommandRunner(timeout_s), lambda: time.perf_counter() - start)
    return job.run(), chat


def test_submit_is_followed_by_one_flagged_wrap_up_turn(workspace):
    result, chat = run_job(workspace, [
        "I will look around.",                      # no bash block
        bash("cat /etc/passwd"),                   # refused
        bash("sed -i 's/return a - b/return a + b/' calc.py"),
        bash("echo SUBMIT"),
        "I changed add to return a + b.",          # wrap-up reply
    ])
    assert result.submitted and result.error is None
    flags = [last for _, _, last in chat.requests]
    assert flags == [False, False, False, False, True]
    assert {job for _, job, _ in chat.requests} == {"job-0007"}
    # Every request re-sends the whole conversation.
    for k, (messages, _, _) in enumerate(chat.requests):
        assert messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert len(messages) == 2 + 2 * k
        if k:
            assert messages[:-2] == chat.requests[k - 1][0]
    user = [m["content"] for m in chat.requests[-1][0] if m["role"] == "user"]
    assert user[1] == FORMAT_ERROR
    assert user[2].startswith("command not allowed: absolute path '/etc/passwd'")
    assert "<returncode>0</returncode>" in user[3]
    assert "submission was received" in user[4] and "SUBMIT" in user[4]
    with open(os.path.join(workspace.path, "calc.py")) as f:
        assert "return a + b" in f.read()
    tools = [t.tool for t in result.turns]
    assert tools == ["<no-tool>", "cat", "sed", "echo", ""]


def test_step_limit_flags_the_last_allowed_request(workspace):
    result, chat = run_job(workspace, [bash("ls")], max_steps=3)
    assert [last for _, _, last in chat.requests] == [False, False, True]
    assert not result.submitted and len(result.turns) == 3
    # The flagged reply's command is not run.
    assert result.turns[-1].tool == "" and result.turns[-1].exec_seconds == 0.0


def test_submitting_on_the_flagged_step_sends_nothing_more(workspace):
    _, chat = run_job(workspace, [bash("ls"), bash("echo SUBMIT")], max_steps=2)
    assert [last for _, _, last in chat.requests] == [False, True]


def test_tool_gap_is_the_measured_command_time(workspace):
    result, _ = run_job(workspace, [bash("sleep 0.3"), bash("true")], max_steps=2)
    # `sleep` is not on the allow-list: refused, so it never ran its 0.3 s.
    assert result.turns[0].refused is not None and result.turns[0].tool_seconds < 0.3
    result, _ = run_job(workspace, [bash("python -c 'import time; time.sleep(0.3)'"), bash("true")],
                        max_steps=2)
    assert 0.3 <= result.turns[0].tool_seconds < 30.0  # the command's own 0.3 s, plus Python's start-up
    assert result.turns[0].exec_seconds <= result.turns[0].tool_seconds


def test_a_failing_request_ends_only_that_job(workspace):
    class Broken(ScriptedChat):
        def complete(self, messages, job_id, is_last_step):
            if len(self.requests) == 1:
                raise ConnectionError("server went away")
            return super().complete(messages, job_id, is_last_step)

    chat = Broken([bash("ls")])
    config = LoopConfig(max_steps=4)
    job = AgentJob("job-0001", workspace, chat, config, CommandPolicy(workspace.path),
                   CommandRunner(5), time.perf_counter)
    result = job.run()
    assert result.error == "turn 1: ConnectionError: server went away"
    assert len(result.turns) == 1


def test_config_names_bad_values():
    with pytest.raises(ValueError, match="invalid max_steps: 0"):
        LoopConfig(max_steps=0)
    with pytest.raises(ValueError, match="invalid temperature: -1"):
        LoopConfig(temperature=-1)
    assert LoopConfig().job_id(3) == "job-0003"


# ---------------------------------------------------------------- trace


class LengthCounter:
    def count(self, text: str) -> int:
        return len(text.split())


def synthetic_result() -> JobResult:
    turns = [
        TurnLog(0, "fix the bug please", False, 1.25, 0.5, bash("ls -la"), 120, 24, 0,
                tool="ls", tool_command="ls -la", returncode=0, exec_seconds=0.07, tool_seconds=0.08),
        TurnLog(1, "a b c", False, 1.83, 0.4, "no block", 150, 9, 96, tool="<no-tool>", tool_seconds=0.001),
        TurnLog(2, "format error text", True, 2.3, 0.3, bash("rm x"), 170, None, 128),
    ]
    return JobResult("job-0003", "/tmp/x", arrival_s=1.25, turns=turns, submitted=False)


def test_trace_lines_have_exactly_the_schema():
    stream = io.StringIO()
    TraceWriter(stream).write(build_trace_records(synthetic_result(), LengthCounter()))
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(lines) == 3
    assert TRACE_KEYS == ("job", "turn", "arrival_s", "system_tokens", "new_tokens",
                          "output_tokens", "tool", "tool_command", "tool_seconds")
    for line in lines:
        assert list(line) == list(TRACE_KEYS)
        assert isinstance(line["job"], str) and isinstance(line["turn"], int)
        assert isinstance(line["arrival_s"], float) and isinstance(line["tool_seconds"], float)
        for key in ("system_tokens", "new_tokens", "output_tokens"):
            assert isinstance(line[key], int)
        assert line["arrival_s"] == 1.25
        assert line["system_tokens"] == len(SYSTEM_PROMPT.split())
    assert lines[0] == {"job": "job-0003", "turn": 0, "arrival_s": 1.25,
                        "system_tokens": len(SYSTEM_PROMPT.split()), "new_tokens": 4,
                        "output_tokens": 24, "tool": "ls", "tool_command": "ls -la",
                        "tool_seconds": 0.08}
    assert lines[1]["tool"] == "<no-tool>" and lines[1]["tool_command"] == ""
    # Last turn: nothing runs after it; missing usage -> counted from the reply.
    assert lines[2]["tool"] == "" and lines[2]["tool_command"] == ""
    assert lines[2]["tool_seconds"] == 0.0
    assert lines[2]["output_tokens"] == len(bash("rm x").split())
    assert list(TraceRecord.__dataclass_fields__) == list(TRACE_KEYS)


def test_trace_from_a_real_loop_run(workspace):
    result, _ = run_job(workspace, [bash("ls"), bash("echo SUBMIT"), "done"])
    records = build_trace_records(result, LengthCounter())
    assert [r.turn for r in records] == [0, 1, 2]
    assert [r.tool for r in records] == ["ls", "echo", ""]
    assert records[0].new_tokens == len(workspace.task().split())
    assert all(r.arrival_s == records[0].arrival_s for r in records)


def test_summary_table():
    table = format_summary([synthetic_result()])
    header, row = table.splitlines()
    assert "cached_tok" in header
    fields = row.split()
    assert fields[:3] == ["job-0003", "3", "no"]
    assert fields[-1] == "224"  # cached tokens summed


# ---------------------------------------------------------------- CLI


def test_forced_reply_regex_yields_parsable_allowed_commands():
    allowed = forced_reply_regex(DEFAULT_ALLOWED_PROGRAMS)
    reply = "THOUGHT: run the tests.\n\n```bash\npython -m pytest -q\n```"
    assert re.fullmatch(allowed, reply)
    assert extract_tool_call(reply).command == "python -m pytest -q"
    assert not re.fullmatch(allowed, "THOUGHT: x\n\n```bash\nrm -rf x\n```")
    anything = forced_reply_regex()
    assert re.fullmatch(anything, "THOUGHT: x\n\n```bash\nrm -rf x\n```")
    assert not re.fullmatch(anything, "THOUGHT: x\n\n```bash\n# just a comment\n```")


def test_requests_carry_the_job_metadata():
    client = OpenAIChatClient("http://127.0.0.1:9", "m", 16, 0.0)
    assert client._extra_body("job-0002", True) == {"job_id": "job-0002", "is_last_step": True}
    forced = OpenAIChatClient("http://127.0.0.1:9", "m", 16, 0.0, forced_regex="x")
    assert forced._extra_body("job-0002", False)["structured_outputs"] == {"regex": "x"}


def test_help_documents_the_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--url", "--model", "--agents", "--max-steps", "--per-command-timeout",
                   "--max-output-chars", "--max-tokens", "--temperature", "--trace",
                   "--keep-workspaces", "--allow-any-command", "is_last_step", "tool_seconds"):
        assert option in text, option


def test_main_reports_bad_values_without_a_server(capsys):
    assert main(["--url", "http://127.0.0.1:9", "--model", "m", "--agents", "0"]) == 2
    assert "invalid agents: 0" in capsys.readouterr().err
