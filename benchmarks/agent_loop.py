"""A mini-swe-agent style agent loop against an OpenAI-compatible vLLM server.

Each agent (job) gets a throw-away workspace: a small generated Python
project whose test fails (``calc.add`` subtracts), committed to a git
repository when ``git`` is available. The agent is asked to fix the bug. Every
turn re-sends the whole conversation (system prompt + all earlier messages)
with the plugin's job metadata in the request body::

    extra_body={"job_id": "job-0003", "is_last_step": False}

The reply must end with exactly one ```bash block; its command is parsed with
the plugin's own parser (``estimators.parser.extract_tool_call``), checked
against a command allow-list, run in the workspace with
``bash -lc`` under a timeout, and its (truncated) output becomes the next user
message. A reply without a ```bash block gets a format-error reminder
instead, as mini-swe-agent does.

Which request is flagged ``is_last_step``
    A client only knows a turn was the last after reading its reply, but the
    flag must be on the request. This loop therefore makes the flagged request
    really the job's last one:

    * when the step budget is about to run out (``step == max_steps - 1``) the
      request is sent with ``is_last_step=True`` and nothing in its reply is
      executed;
    * when the model submits (its command contains ``SUBMIT`` or runs
      ``submit``) on an earlier step, the command is still run, then one short
      wrap-up turn ("Summarize what you changed.") is sent with
      ``is_last_step=True``. The wrap-up uses the next step, so a job never
      sends more than ``max_steps`` requests.

    A job that ends on a request error never sends a flagged request; the
    server then keeps its last pin until the TTL expires.

Command policy (default on)
    Every simple command of the block (split on ``&&``, ``||``, ``;``,
    newlines and pipes outside quotes; heredoc bodies are data) must start
    (after ``VAR=value`` prefixes) with an allowed program: ls cat head tail
    grep find wc pwd echo sed python python3 pytest git diff sort uniq cd true
    submit; ``git`` only with status/diff/log/show; ``find`` without
    -exec/-delete. Network tools, sudo, package installers, ``rm -rf /``,
    variable and command substitution, and paths outside the workspace (absolute paths, ``~``, ``..`` escapes) are
    refused. A refused command is not run; the agent sees
    ``command not allowed: <reason>``. The policy guards against a weak model's
    accidents; it is not a sandbox (``python`` can do anything).
    ``--allow-any-command`` turns it off: DANGEROUS, the model then runs
    arbitrary shell commands as your user.

Trace (``--trace PATH``)
    JSON lines, one per turn (request), grouped by job in turn order::

        {"job": "job-0003", "turn": 0, "arrival_s": 1.25, "system_tokens": 120,
         "new_tokens": 180, "output_tokens": 24, "tool": "ls",
         "tool_command": "ls -la", "tool_seconds": 0.08}

    ``arrival_s``: offset of the job's first request from the run's start
    (same on every line of a job); ``system_tokens``: tokens of the system
    prompt; ``new_tokens``: tokens of the user message appended before this
    turn (the task on turn 0, then the previous tool output, refusal or
    format error); ``output_tokens``: completion tokens of the reply;
    ``tool``: the parser's tool key (``<no-tool>`` when the reply had no
    ```bash block); ``tool_command``: the command (``""`` if none);
    ``tool_seconds``: measured time from receiving this reply to sending the
    next request (the tool's real run time). The last turn has tool ``""``,
    command ``""`` and 0.0 seconds. Tokens are counted with the server's
    tokenizer (``POST /tokenize``), or ``len(text) // 4`` when that endpoint
    is unavailable; counting happens after a job ends so that it never adds
    to the measured tool gaps.

Weak models (the embedded SmolLM2-135M rarely writes a ```bash block) can be
held to the format with ``--force-bash-block``: vLLM structured outputs then
constrain each reply to a THOUGHT line and one single-line command starting
with an allowed program; the command itself is still the model's choice.

At the end a per-job summary is printed: steps, whether the agent submitted,
total tool seconds, mean request latency, prompt and cached prompt tokens
(cached needs the server's ``--enable-prompt-tokens-details``).

Example::

    python -m vllm_continuum_plugin.benchmarks.agent_loop \\
        --url http://127.0.0.1:8000 --agents 2 --max-steps 6 --trace trace.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import posixpath
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import IO, Protocol

import openai
import requests

from vllm_continuum_plugin.estimators.parser import (
    NO_TOOL_KEY,
    extract_tool_call,
    split_commands,
)

__all__ = [
    "AgentJob",
    "AgentRun",
    "ChatClient",
    "ChatReply",
    "CommandPolicy",
    "CommandResult",
    "CommandRunner",
    "JobResult",
    "LoopConfig",
    "OpenAIChatClient",
    "ServerTokenCounter",
    "TraceRecord",
    "TraceWriter",
    "TurnLog",
    "Workspace",
    "build_parser",
    "build_trace_records",
    "forced_reply_regex",
    "format_summary",
    "is_submission",
    "main",
    "truncate_output",
]

SUBMIT_TOKEN = "SUBMIT"
# Keys of a trace line, in order. Another component reads this format.
TRACE_KEYS: tuple[str, ...] = (
    "job", "turn", "arrival_s", "system_tokens", "new_tokens",
    "output_tokens", "tool", "tool_command", "tool_seconds",
)

SYSTEM_PROMPT = """\
You are a software engineering agent working in a small Python repository.
You interact with a Linux shell, one command per turn.

Every reply MUST have this format:

THOUGHT: one or two sentences on what you will do next and why.

```bash
<exactly one shell command>
```

Rules:
- Exactly one ```bash block per reply; its command is run in the repository
  root and you receive its output in the next message.
- Allowed commands: ls, cat, head, tail, grep, find, wc, pwd, echo, sed,
  python, python3, pytest, git status/diff/log/show, diff, sort, uniq, cd.
  Edit files with sed -i (for example: sed -i 's/old/new/' file.py).
- Stay inside the repository: no absolute paths, no "..".
- When the task is done, reply with the command: echo SUBMIT
"""

FORMAT_ERROR = """\
Format error: your reply must contain exactly one ```bash block with one \
command, for example:

THOUGHT: I will list the files.

```bash
ls
```

If you are done, reply with the command `echo SUBMIT`."""

WRAP_UP = """\
Your submission was received.
{observation}
Summarize what you changed in one or two sentences. Do not run any more \
commands."""

TASK_TEMPLATE = """\
The tests of this repository fail. Find the bug in the code and fix it.
Run the tests with: {test_command}
When the tests pass, submit with: echo SUBMIT"""


# --------------------------------------------------------------------------
# Workspace
# --------------------------------------------------------------------------

WORKSPACE_FILES: dict[str, str] = {
    "README.md": """\
# calc

A tiny arithmetic library.

* `calc.py` -- `add`, `sub`, `mul`, `mean`
* `utils/text.py` -- `slugify`
* `test_calc.py` -- the tests (`python -m pytest -q` or `python test_calc.py`)
""",
    "calc.py": '''\
"""Small arithmetic helpers."""


def add(a, b):
    """Return a + b."""
    return a - b


def sub(a, b):
    """Return a - b."""
    return add(a, -b)


def mul(a, b):
    """Return a * b."""
    return a * b


def mean(values):
    """Arithmetic mean of a non-empty sequence."""
    total = 0
    for v in values:
        total = add(total, v)
    return total / len(values)
''',
    "utils/__init__.py": '"""Helpers shared by the project."""\n',
    "utils/text.py": '''\
"""Text helpers."""


def slugify(text):
    """Lower-case words joined by dashes."""
    return "-".join(text.lower().split())
''',
    "test_calc.py": '''\
"""Tests: run with `python -m pytest -q` or `python test_calc.py`."""

from calc import add, mean, mul, sub
from utils.text import slugify


def test_add():
    assert add(2, 3) == 5, f"add(2, 3) returned {add(2, 3)}"


def test_sub():
    assert sub(5, 3) == 2


def test_mul():
    assert mul(4, 3) == 12


def test_mean():
    assert mean([1, 2, 3]) == 2, f"mean([1, 2, 3]) returned {mean([1, 2, 3])}"


def test_slugify():
    assert slugify("Hello World") == "hello-world"


if __name__ == "__main__":
    import sys
    import traceback

    failed = 0
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]
    for name, fn in tests:
        try:
            fn()
            print(f"PASS {name}")
        except AssertionError:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
    print(f"{len(tests) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
''',
}


@functools.cache
def login_shell_test_command() -> str:
    """``python -m pytest -q`` when the agent's shell has pytest, else
    ``python test_calc.py``.

    Probed once per process with the same ``bash -lc`` the agent's commands
    use: a login shell may reset PATH and not see the caller's virtualenv.
    """
    probe = subprocess.run(
        ["bash", "-lc", "python -c 'import pytest'"], cwd=tempfile.gettempdir(),
        stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
    )
    return "python -m pytest -q" if probe.returncode == 0 else "python test_calc.py"


class Workspace:
    """A throw-away directory holding the generated project.

    Invariants: ``path`` is an absolute, symlink-free directory that exists
    from construction until ``remove()``; when ``git`` is available it is a
    git repository whose single commit holds exactly ``WORKSPACE_FILES``
    (so ``git status`` is clean and ``git diff`` shows the agent's edits).
    """

    def __init__(self, prefix: str = "agent-ws-", files: dict[str, str] | None = None) -> None:
        self.path = os.path.realpath(tempfile.mkdtemp(prefix=prefix))
        self.files = dict(WORKSPACE_FILES if files is None else files)
        for relative, content in self.files.items():
            target = os.path.join(self.path, relative)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w") as f:
                f.write(content)
        self.is_git_repo = self._init_git()

    def _init_git(self) -> bool:
        if shutil.which("git") is None:
            return False
        identity = ["-c", "user.name=agent", "-c", "user.email=agent@localhost",
                    "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false"]
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "Initial commit"]):
            done = subprocess.run(["git", *identity, *args], cwd=self.path,
                                  capture_output=True, text=True, timeout=60)
            if done.returncode != 0:
                raise RuntimeError(f"git {' '.join(args)} failed in {self.path}: {done.stderr.strip()}")
        return True

    @property
    def test_command(self) -> str:
        """How the agent runs the tests (see ``login_shell_test_command``)."""
        return login_shell_test_command()

    def task(self) -> str:
        """The first user message of the job."""
        return TASK_TEMPLATE.format(test_command=self.test_command)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


# --------------------------------------------------------------------------
# Command policy
# --------------------------------------------------------------------------

DEFAULT_ALLOWED_PROGRAMS: frozenset[str] = frozenset({
    "ls", "cat", "head", "tail", "grep", "find", "wc", "pwd", "echo", "sed",
    "python", "python3", "pytest", "git", "diff", "sort", "uniq", "cd", "true",
    "submit",
})
DEFAULT_GIT_SUBCOMMANDS: frozenset[str] = frozenset({"status", "diff", "log", "show"})
# Words refused anywhere in a command: privilege escalation, network access,
# package installers (which reach the network).
_DENIED_WORDS = re.compile(
    r"(?<![\w.-])(sudo|su|doas|curl|wget|ssh|scp|sftp|rsync|nc|ncat|netcat|socat|"
    r"telnet|ftp|nmap|ping|pip|pip3|apt|apt-get|dnf|yum|docker)(?![\w-])"
)
_RM_ROOT = re.compile(r"\brm\s+(-\S+\s+)*(/|/\*|~)(\s|$)")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON_NAME = re.compile(r"^python3(\.\d+)?$")
_SINGLE_QUOTED = re.compile(r"'[^']*'")
_SUBSTITUTION = re.compile(r"\$(?:[A-Za-z_]\w*|[{(])|`|[<>]\(")
_HEREDOC = re.compile(r"(?<!<)<<(?!<)-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
_CD_IN_PIPELINE = re.compile(r"(?<!\|)\|(?!\|)\s*cd\b|\bcd\b[^|;&\n]*(?<!\|)\|(?!\|)")
_REDIRECTION_PREFIX = re.compile(r"^[0-9]*[<>&|]+")
_FIND_ACTIONS = frozenset({"-exec", "-execdir", "-ok", "-okdir", "-delete",
                           "-fprint", "-fprint0", "-fprintf", "-fls"})
_DEVICE_PATHS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/zero"})


def _strip_heredoc_bodies(command: str) -> tuple[str, str]:
    """Split a command into (shell text, bodies that the shell expands).

    Heredoc bodies are data, not commands, so they must not be split into
    "simple commands"; bodies of heredocs with an unquoted delimiter are still
    subject to ``$``/backtick expansion and are returned for that check.
    """
    kept: list[str] = []
    expanded: list[str] = []
    pending: list[tuple[str, bool]] = []  # (delimiter, body is expanded)
    for line in command.split("\n"):
        if pending:
            delimiter, expands = pending[0]
            if line.strip() == delimiter:
                pending.pop(0)
            elif expands:
                expanded.append(line)
            continue
        kept.append(line)
        pending.extend((m.group(2), m.group(1) == "") for m in _HEREDOC.finditer(line))
    return "\n".join(kept), "\n".join(expanded)


_QUOTED = re.compile(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"")
_PLACEHOLDER = re.compile(r"\0(\d+)\0")


def _simple_commands(shell_text: str) -> list[str]:
    """``split_commands`` that leaves quoted strings whole.

    ``python -c "import os; print(1)"`` is one simple command: quoted strings
    are masked before splitting on ``;``/``&&``/``|``/newlines and restored
    in each piece afterwards.
    """
    quoted: list[str] = []

    def mask(match: re.Match[str]) -> str:
        quoted.append(match.group(0))
        return f"\0{len(quoted) - 1}\0"

    masked = _QUOTED.sub(mask, shell_text)
    return [_PLACEHOLDER.sub(lambda m: quoted[int(m.group(1))], piece)
            for piece in split_commands(masked)]


def _words(simple_command: str) -> list[str]:
    try:
        return shlex.split(simple_command, comments=True)
    except ValueError:  # unbalanced quotes: whitespace split is still useful
        return simple_command.split()


class CommandPolicy:
    """Decides whether the agent may run a command in its workspace.

    ``check(command)`` returns None when the command may run, else a reason
    naming the offending part. With ``allow_any=True`` every command is
    allowed. Paths are checked lexically against ``workspace`` (the directory
    the command runs in; a virtual root when None, so that every absolute
    path is outside), following ``cd`` within the command line.
    """

    def __init__(
        self,
        workspace: str | os.PathLike[str] | None = None,
        *,
        allow_any: bool = False,
        allowed_programs: Iterable[str] = DEFAULT_ALLOWED_PROGRAMS,
        git_subcommands: Iterable[str] = DEFAULT_GIT_SUBCOMMANDS,
    ) -> None:
        # Without a workspace, a root no real path can lie under (it holds a
        # NUL byte): every absolute path is outside, ".." escapes are caught.
        self.root = os.path.realpath(workspace) if workspace is not None else "/\0workspace"
        self.allow_any = allow_any
        self.allowed_programs = frozenset(allowed_programs)
        self.git_subcommands = frozenset(git_subcommands)

    def check(self, command: str) -> str | None:
        if self.allow_any:
            return None
        if not command.strip():
            return "empty command"
        if _RM_ROOT.search(command):
            return "deleting the filesystem root or home directory is never allowed"
        denied = _DENIED_WORDS.search(command)
        if denied:
            return f"'{denied.group(1)}' is not allowed (no privilege escalation, network or package installs)"
        shell_text, expanded_bodies = _strip_heredoc_bodies(command)
        unquoted = _SINGLE_QUOTED.sub("''", shell_text) + "\n" + expanded_bodies
        substitution = _SUBSTITUTION.search(unquoted)
        if substitution:
            return (f"shell expansion '{substitution.group(0)}' is not allowed "
                    "(no $VAR, ${...}, $(...), backticks or process substitution)")
        if _CD_IN_PIPELINE.search(shell_text):
            return "cd inside a pipeline is not allowed"
        cwd = self.root
        for simple in _simple_commands(shell_text):
            reason, cwd = self._check_simple(simple, cwd)
            if reason is not None:
                return reason
        return None

    def _check_simple(self, simple: str, cwd: str) -> tuple[str | None, str]:
        """Check one simple command; returns (reason or None, cwd after it)."""
        words = _words(simple)
        while words and _ENV_ASSIGNMENT.match(words[0]):
            words.pop(0)
        if not words:
            return None, cwd
        program, args = words[0], words[1:]
        if program not in self.allowed_programs and not (
            _PYTHON_NAME.match(program) and "python3" in self.allowed_programs
        ):
            return f"'{program}' is not an allowed program (allowed: {', '.join(sorted(self.allowed_programs))})", cwd
        if program == "git":
            reason = self._check_git(args)
            if reason is not None:
                return reason, cwd
        if program == "find":
            actions = sorted(_FIND_ACTIONS.intersection(args))
            if actions:
                return f"find {actions[0]} is not allowed", cwd
        for word in args:
            reason = self._check_path_word(word, cwd)
            if reason is not None:
                return reason, cwd
        if program == "cd":
            targets = [a for a in args if not _REDIRECTION_PREFIX.match(a)]
            if len(targets) != 1 or targets[0] == "-":
                return "cd needs exactly one directory inside the workspace", cwd
            return None, posixpath.normpath(posixpath.join(cwd, targets[0]))
        return None, cwd

    def _check_git(self, args: list[str]) -> str | None:
        i = 0
        while i < len(args) and args[i].startswith("-"):
            i += 2 if args[i] in ("-C", "-c") else 1
        subcommand = args[i] if i < len(args) else None
        if subcommand not in self.git_subcommands:
            allowed = ", ".join(f"git {s}" for s in sorted(self.git_subcommands))
            return f"git {subcommand or '(no subcommand)'} is not allowed (only {allowed})"
        return None

    def _check_path_word(self, word: str, cwd: str) -> str | None:
        """Refuse words that name a path outside the workspace."""
        word = _REDIRECTION_PREFIX.sub("", word)
        candidates = [word]
        if "=" in word:
            candidates.append(word.split("=", 1)[1])
        for candidate in candidates:
            if candidate.startswith("~"):
                return f"path {candidate!r} is outside the workspace (home directory)"
            if candidate.startswith("/"):
                if candidate in _DEVICE_PATHS:
                    continue
                if not self._inside(posixpath.normpath(candidate)):
                    return f"absolute path {candidate!r} is outside the workspace"
            elif ".." in candidate.split("/"):
                if not self._inside(posixpath.normpath(posixpath.join(cwd, candidate))):
                    return f"path {candidate!r} escapes the workspace"
        return None

    def _inside(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root.rstrip("/") + "/")


# --------------------------------------------------------------------------
# Running commands
# --------------------------------------------------------------------------


def truncate_output(text: str, max_chars: int) -> str:
    """Keep the first and last characters of ``text``, marking the cut.

    Invariant: texts of at most ``max_chars`` characters come back unchanged;
    longer ones become ``head + marker + tail`` where ``head`` and ``tail``
    together are exactly ``max_chars`` characters of the original (head gets
    the odd one) and the marker says how many characters were elided.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    if len(text) <= max_chars:
        return text
    head = (max_chars + 1) // 2
    tail = max_chars - head
    elided = len(text) - max_chars
    marker = f"\n<... {elided} characters elided ...>\n"
    return text[:head] + marker + (text[-tail:] if tail else "")


@dataclass(frozen=True)
class CommandResult:
    """Outcome of one command. ``returncode`` is None when it timed out."""

    output: str
    returncode: int | None
    seconds: float
    timed_out: bool


class CommandRunner:
    """Runs one shell command in a directory under a wall-clock timeout.

    The command runs as ``bash -lc <preamble + command>`` in a new session
    with stdin closed and stderr merged into stdout. On timeout the whole
    process group is killed (not only bash: a ``sleep`` it started would keep
    the output pipe open and make collecting the output hang), so the call
    returns within about ``timeout_s`` plus the kill's latency.
    """

    # Makes `submit` a command the shell knows.
    PREAMBLE = f"submit() {{ echo {SUBMIT_TOKEN}; }}\n"
    ENV_OVERRIDES = {"PAGER": "cat", "GIT_PAGER": "cat", "MANPAGER": "cat",
                     "TERM": "dumb", "LESS": "-R", "PYTHONDONTWRITEBYTECODE": "1"}

    def __init__(self, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s

    def run(self, command: str, cwd: str) -> CommandResult:
        start = time.perf_counter()
        proc = subprocess.Popen(
            ["bash", "-lc", self.PREAMBLE + command],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
            env={**os.environ, **self.ENV_OVERRIDES},
        )
        try:
            output, _ = proc.communicate(timeout=self.timeout_s)
            return CommandResult(output, proc.returncode, time.perf_counter() - start, False)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            output, _ = proc.communicate()
            return CommandResult(output or "", None, time.perf_counter() - start, True)


def format_observation(result: CommandResult, max_chars: int, timeout_s: float) -> str:
    """The user message reporting a command's outcome to the agent."""
    output = truncate_output(result.output, max_chars)
    if result.timed_out:
        return (f"<error>command timed out after {timeout_s:g} s and was killed</error>\n"
                f"<output>\n{output}</output>")
    return f"<returncode>{result.returncode}</returncode>\n<output>\n{output}</output>"


# --------------------------------------------------------------------------
# Talking to the server
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatReply:
    """One reply; token counts are None when the server sent no usage."""

    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None


class ChatClient(Protocol):
    def complete(self, messages: Sequence[dict[str, str]], job_id: str, is_last_step: bool) -> ChatReply:
        ...


def forced_reply_regex(programs: Iterable[str] | None = None) -> str:
    """vLLM structured-outputs regex for ``--force-bash-block``: a THOUGHT
    line and one single-line ```bash command, starting with one of
    ``programs`` when given, else with anything but a comment."""
    if programs is None:
        command = r"[^\n`#][^\n`]{0,159}"
    else:
        names = "|".join(re.escape(p) for p in sorted(programs))
        command = rf"({names})( [^\n`]{{1,150}})?"
    return rf"THOUGHT: [^\n`]{{1,160}}\n\n```bash\n{command}\n```"


class OpenAIChatClient:
    """Chat completions with the plugin's job metadata in ``extra_body``.

    ``forced_regex``, when set, constrains every reply with vLLM structured
    outputs (see ``forced_reply_regex``), for models too weak to follow the
    format; the commands are still the model's own.
    """

    def __init__(self, url: str, model: str, max_tokens: int, temperature: float,
                 request_timeout_s: float = 600.0, forced_regex: str | None = None) -> None:
        self.forced_regex = forced_regex
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._client = openai.OpenAI(
            base_url=url.rstrip("/") + "/v1",
            api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"),
            max_retries=0,
            timeout=request_timeout_s,
        )

    def complete(self, messages: Sequence[dict[str, str]], job_id: str, is_last_step: bool) -> ChatReply:
        reply = self._client.chat.completions.create(
            model=self.model,
            messages=list(messages),  # type: ignore[arg-type]
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            extra_body=self._extra_body(job_id, is_last_step),
        )
        usage = reply.usage
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        return ChatReply(
            text=reply.choices[0].message.content or "",
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            cached_tokens=getattr(details, "cached_tokens", None) if details else None,
        )

    def _extra_body(self, job_id: str, is_last_step: bool) -> dict[str, object]:
        body: dict[str, object] = {"job_id": job_id, "is_last_step": is_last_step}
        if self.forced_regex is not None:
            body["structured_outputs"] = {"regex": self.forced_regex}
        return body


def fetch_default_model(url: str, timeout_s: float = 30.0) -> str:
    """The first model id served at ``url`` (``GET /v1/models``)."""
    response = requests.get(url.rstrip("/") + "/v1/models", timeout=timeout_s)
    response.raise_for_status()
    models = response.json().get("data") or []
    if not models:
        raise RuntimeError(f"{url}/v1/models lists no models")
    return str(models[0]["id"])


class ServerTokenCounter:
    """Counts tokens with the server's tokenizer (``POST /tokenize``).

    Falls back to ``len(text) // 4`` for good once the endpoint fails
    (``used_fallback`` then says so). Results are cached; thread-safe.
    """

    def __init__(self, url: str, model: str, timeout_s: float = 30.0) -> None:
        self.endpoint = url.rstrip("/") + "/tokenize"
        self.model = model
        self.timeout_s = timeout_s
        self.used_fallback = False
        self._cache: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, text: str) -> int:
        with self._lock:
            if text in self._cache:
                return self._cache[text]
            use_server = not self.used_fallback
        n: int | None = None
        if use_server:
            try:
                response = requests.post(
                    self.endpoint,
                    json={"model": self.model, "prompt": text, "add_special_tokens": False},
                    timeout=self.timeout_s,
                )
                response.raise_for_status()
                n = int(response.json()["count"])
            except (requests.RequestException, KeyError, TypeError, ValueError):
                n = None
        with self._lock:
            if n is None:
                self.used_fallback = True
                n = len(text) // 4
            self._cache[text] = n
        return n


# --------------------------------------------------------------------------
# The agent loop
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class LoopConfig:
    """Settings of one run; ``__post_init__`` rejects bad values by name."""

    agents: int = 1
    max_steps: int = 20
    per_command_timeout_s: float = 30.0
    max_output_chars: int = 4000
    max_tokens: int = 512
    temperature: float = 0.0
    stagger_s: float = 1.0
    allow_any_command: bool = False
    job_prefix: str = "job"

    def __post_init__(self) -> None:
        checks = {
            "agents": self.agents >= 1,
            "max_steps": self.max_steps >= 1,
            "per_command_timeout_s": self.per_command_timeout_s > 0,
            "max_output_chars": self.max_output_chars >= 1,
            "max_tokens": self.max_tokens >= 1,
            "temperature": self.temperature >= 0,
            "stagger_s": self.stagger_s >= 0,
            "job_prefix": bool(self.job_prefix.strip()),
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"invalid {name}: {getattr(self, name)!r}")

    def job_id(self, index: int) -> str:
        return f"{self.job_prefix}-{index:04d}"


@dataclass
class TurnLog:
    """What happened on one request of a job (times are run-relative)."""

    turn: int
    new_message: str
    is_last_step: bool
    sent_s: float
    latency_s: float
    reply: str
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    tool: str = ""
    tool_command: str = ""
    refused: str | None = None
    returncode: int | None = None
    timed_out: bool = False
    exec_seconds: float = 0.0
    tool_seconds: float = 0.0


@dataclass
class JobResult:
    job: str
    workspace: str
    arrival_s: float = 0.0
    turns: list[TurnLog] = field(default_factory=list)
    submitted: bool = False
    error: str | None = None


def is_submission(command: str) -> bool:
    """Whether a command submits: it mentions ``SUBMIT`` or runs ``submit``."""
    if re.search(rf"\b{SUBMIT_TOKEN}\b", command):
        return True
    return any(_words(simple)[:1] == ["submit"] for simple in split_commands(command))


class AgentJob:
    """Runs one agent job to completion.

    Invariants: request ``k`` carries the system prompt and every earlier
    message; at most ``max_steps`` requests are sent; exactly one request is
    flagged ``is_last_step`` and it is the last one sent (unless a request
    fails, which ends the job with ``error`` set and no flagged request).
    """

    def __init__(
        self,
        job_id: str,
        workspace: Workspace,
        chat: ChatClient,
        config: LoopConfig,
        policy: CommandPolicy,
        runner: CommandRunner,
        clock: Callable[[], float],
        on_turn: Callable[[str, TurnLog], None] | None = None,
    ) -> None:
        self.job_id = job_id
        self.workspace = workspace
        self.chat = chat
        self.config = config
        self.policy = policy
        self.runner = runner
        self.clock = clock
        self.on_turn = on_turn

    def run(self) -> JobResult:
        result = JobResult(self.job_id, self.workspace.path)
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        new_message = self.workspace.task()
        wrap_up_pending = False
        for step in range(self.config.max_steps):
            last = wrap_up_pending or step == self.config.max_steps - 1
            messages.append({"role": "user", "content": new_message})
            sent = self.clock()
            if step == 0:
                result.arrival_s = sent
            elif result.turns:
                previous = result.turns[-1]
                previous.tool_seconds = sent - (previous.sent_s + previous.latency_s)
            try:
                reply = self.chat.complete(messages, self.job_id, last)
            except Exception as exc:  # noqa: BLE001 - any failure ends this job only
                result.error = f"turn {step}: {type(exc).__name__}: {exc}"
                break
            turn = TurnLog(step, new_message, last, sent, self.clock() - sent, reply.text,
                           reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens)
            result.turns.append(turn)
            messages.append({"role": "assistant", "content": reply.text})
            if last:
                self._report(turn)
                break
            new_message, submitted = self._act(turn)
            self._report(turn)
            if submitted:
                result.submitted = True
                wrap_up_pending = True
        return result

    def _act(self, turn: TurnLog) -> tuple[str, bool]:
        """Run the reply's command; returns (next user message, submitted)."""
        call = extract_tool_call(turn.reply)
        if call is None:
            turn.tool = NO_TOOL_KEY
            return FORMAT_ERROR, False
        turn.tool, turn.tool_command = call.tool_key, call.command
        submitted = is_submission(call.command)
        turn.refused = self.policy.check(call.command)
        if turn.refused is not None:
            observation = f"command not allowed: {turn.refused}\nThe command was not run."
        else:
            outcome = self.runner.run(call.command, self.workspace.path)
            turn.returncode, turn.timed_out, turn.exec_seconds = (
                outcome.returncode, outcome.timed_out, outcome.seconds)
            observation = format_observation(outcome, self.config.max_output_chars,
                                             self.config.per_command_timeout_s)
        if submitted:
            return WRAP_UP.format(observation=observation), True
        return observation, False

    def _report(self, turn: TurnLog) -> None:
        if self.on_turn is not None:
            self.on_turn(self.job_id, turn)


# --------------------------------------------------------------------------
# Trace and summary
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceRecord:
    """One trace line; field order is the file's key order (``TRACE_KEYS``)."""

    job: str
    turn: int
    arrival_s: float
    system_tokens: int
    new_tokens: int
    output_tokens: int
    tool: str
    tool_command: str
    tool_seconds: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)


class TokenCounter(Protocol):
    def count(self, text: str) -> int:
        ...


def build_trace_records(result: JobResult, counter: TokenCounter) -> list[TraceRecord]:
    """Trace lines of a finished job, one per request, in turn order.

    The last turn always has tool ``""``, command ``""`` and 0.0 seconds
    (nothing runs after it). ``output_tokens`` falls back to counting the
    reply when the server sent no usage.
    """
    system_tokens = counter.count(SYSTEM_PROMPT)
    records: list[TraceRecord] = []
    for i, turn in enumerate(result.turns):
        final = i == len(result.turns) - 1
        output_tokens = (turn.completion_tokens if turn.completion_tokens is not None
                         else counter.count(turn.reply))
        records.append(TraceRecord(
            job=result.job,
            turn=turn.turn,
            arrival_s=round(result.arrival_s, 3),
            system_tokens=system_tokens,
            new_tokens=counter.count(turn.new_message),
            output_tokens=output_tokens,
            tool="" if final else turn.tool,
            tool_command="" if final else turn.tool_command,
            tool_seconds=0.0 if final else round(max(0.0, turn.tool_seconds), 4),
        ))
    return records


class TraceWriter:
    """Appends trace lines to a file; thread-safe, flushed per job."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, records: Iterable[TraceRecord]) -> None:
        lines = "".join(r.to_json() + "\n" for r in records)
        with self._lock:
            self._stream.write(lines)
            self._stream.flush()


def format_summary(results: Sequence[JobResult]) -> str:
    """The per-job table printed at the end of a run."""
    header = (f"{'job':<12} {'steps':>5} {'submitted':>9} {'refused':>7} {'tool_s':>7} "
              f"{'mean_lat_s':>10} {'prompt_tok':>10} {'cached_tok':>10}  error")
    lines = [header]
    for r in results:
        turns = r.turns
        tool_s = sum(t.tool_seconds for t in turns[:-1])
        mean_latency = sum(t.latency_s for t in turns) / len(turns) if turns else 0.0
        prompt = sum(t.prompt_tokens or 0 for t in turns)
        cached_values = [t.cached_tokens for t in turns if t.cached_tokens is not None]
        cached = str(sum(cached_values)) if cached_values else "-"
        refused = sum(1 for t in turns if t.refused is not None)
        lines.append(
            f"{r.job:<12} {len(turns):>5} {'yes' if r.submitted else 'no':>9} {refused:>7} "
            f"{tool_s:>7.2f} {mean_latency:>10.2f} {prompt:>10} {cached:>10}  {r.error or ''}"
        )
    return "\n".join(lines)


def _turn_line(job: str, turn: TurnLog) -> str:
    if turn.is_last_step:
        what = "final turn (is_last_step)"
    elif turn.tool == NO_TOOL_KEY:
        what = "no ```bash block -> format error"
    elif turn.refused is not None:
        what = f"refused {turn.tool_command!r}: {turn.refused}"
    elif turn.timed_out:
        what = f"{turn.tool_command!r} timed out after {turn.exec_seconds:.1f}s"
    else:
        what = f"{turn.tool_command!r} rc={turn.returncode} ({turn.exec_seconds:.2f}s)"
    cached = f" cached={turn.cached_tokens}" if turn.cached_tokens is not None else ""
    return (f"[{job} turn {turn.turn}] {turn.latency_s:.2f}s prompt={turn.prompt_tokens}"
            f"{cached} out={turn.completion_tokens}  {what}")


# --------------------------------------------------------------------------
# Orchestration and CLI
# --------------------------------------------------------------------------


class AgentRun:
    """Runs ``config.agents`` jobs concurrently (one thread each), starting
    job ``i`` at ``i * stagger_s`` seconds after the run's start, and writes
    each job's trace lines when it ends. Workspaces are removed at the end
    unless ``keep_workspaces``."""

    def __init__(self, config: LoopConfig, chat: ChatClient, counter: TokenCounter,
                 trace: TraceWriter | None, keep_workspaces: bool = False,
                 verbose: bool = True, show_replies: bool = False) -> None:
        self.config = config
        self.chat = chat
        self.counter = counter
        self.trace = trace
        self.keep_workspaces = keep_workspaces
        self.verbose = verbose
        self.show_replies = show_replies
        self._print_lock = threading.Lock()

    def _print(self, line: str) -> None:
        if self.verbose:
            with self._print_lock:
                print(line, flush=True)

    def _report(self, job: str, turn: TurnLog) -> None:
        line = _turn_line(job, turn)
        if self.show_replies:
            reply = truncate_output(turn.reply.strip(), 400)
            line += "".join(f"\n    | {reply_line}" for reply_line in reply.split("\n"))
        self._print(line)

    def run(self) -> list[JobResult]:
        workspaces = [Workspace(prefix=f"{self.config.job_id(i)}-") for i in range(self.config.agents)]
        results: list[JobResult | None] = [None] * self.config.agents
        runner = CommandRunner(self.config.per_command_timeout_s)
        login_shell_test_command()  # probe now, not inside the first job's arrival
        start = time.perf_counter()
        clock = lambda: time.perf_counter() - start  # noqa: E731

        def work(index: int) -> None:
            delay = index * self.config.stagger_s - clock()
            if delay > 0:
                time.sleep(delay)
            ws = workspaces[index]
            job = AgentJob(
                self.config.job_id(index), ws, self.chat, self.config,
                CommandPolicy(ws.path, allow_any=self.config.allow_any_command),
                runner, clock, on_turn=self._report,
            )
            result = job.run()
            results[index] = result
            if self.trace is not None:
                self.trace.write(build_trace_records(result, self.counter))

        threads = [threading.Thread(target=work, args=(i,), name=self.config.job_id(i), daemon=True)
                   for i in range(self.config.agents)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            if self.keep_workspaces:
                for ws in workspaces:
                    self._print(f"kept workspace {ws.path}")
            else:
                for ws in workspaces:
                    ws.remove()
        return [r for r in results if r is not None]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_continuum_plugin.benchmarks.agent_loop",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", required=True,
                        help="server base URL, e.g. http://127.0.0.1:8000 (no /v1)")
    parser.add_argument("--model", default=None,
                        help="served model name (default: the first model of GET /v1/models)")
    parser.add_argument("--agents", type=int, default=1, help="concurrent agent jobs (default: 1)")
    parser.add_argument("--stagger", type=float, default=1.0,
                        help="seconds between the starts of consecutive jobs (default: 1.0)")
    parser.add_argument("--max-steps", type=int, default=20,
                        help="most requests per job, wrap-up turn included (default: 20)")
    parser.add_argument("--per-command-timeout", type=float, default=30.0,
                        help="seconds a command may run before its process group is killed (default: 30)")
    parser.add_argument("--max-output-chars", type=int, default=4000,
                        help="command output kept per turn, head + tail (default: 4000)")
    parser.add_argument("--max-tokens", type=int, default=512,
                        help="max_tokens of each reply (default: 512)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: 0.0)")
    parser.add_argument("--request-timeout", type=float, default=600.0,
                        help="seconds to wait for one reply (default: 600)")
    parser.add_argument("--job-prefix", default="job",
                        help="job ids are PREFIX-0000, PREFIX-0001, ... (default: job)")
    parser.add_argument("--trace", default=None, metavar="PATH",
                        help="write the JSON-lines trace (one line per turn) to PATH")
    parser.add_argument("--keep-workspaces", action="store_true",
                        help="do not delete the generated workspaces at the end")
    parser.add_argument("--allow-any-command", action="store_true",
                        help="DANGEROUS: run every command the model emits, with your "
                             "user's rights, without the allow-list")
    parser.add_argument("--force-bash-block", action="store_true",
                        help="constrain every reply with vLLM structured outputs to THOUGHT + one "
                             "single-line ```bash block whose first word is an allowed program "
                             "(any non-comment with --allow-any-command); for models too weak "
                             "to follow the format")
    parser.add_argument("--quiet", action="store_true", help="no per-turn lines, only the summary")
    parser.add_argument("--show-replies", action="store_true",
                        help="print each reply (head and tail of 400 characters) under its turn line")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    url = args.url.rstrip("/")
    try:
        config = LoopConfig(
            agents=args.agents,
            max_steps=args.max_steps,
            per_command_timeout_s=args.per_command_timeout,
            max_output_chars=args.max_output_chars,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            stagger_s=args.stagger,
            allow_any_command=args.allow_any_command,
            job_prefix=args.job_prefix,
        )
        model = args.model or fetch_default_model(url)
    except (ValueError, RuntimeError, requests.RequestException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if config.allow_any_command:
        print("WARNING: --allow-any-command: the model's commands run unchecked", file=sys.stderr)
    chat = OpenAIChatClient(url, model, config.max_tokens, config.temperature, args.request_timeout,
                            forced_regex=forced_reply_regex(
                                None if config.allow_any_command else DEFAULT_ALLOWED_PROGRAMS)
                            if args.force_bash_block else None)
    counter = ServerTokenCounter(url, model)
    trace_file = open(args.trace, "w") if args.trace else None
    try:
        run = AgentRun(config, chat, counter, TraceWriter(trace_file) if trace_file else None,
                       keep_workspaces=args.keep_workspaces, verbose=not args.quiet,
                       show_replies=args.show_replies)
        started = time.perf_counter()
        results = run.run()
        elapsed = time.perf_counter() - started
    finally:
        if trace_file is not None:
            trace_file.close()
    print(f"\n{len(results)} jobs on {model} in {elapsed:.1f}s")
    print(format_summary(results))
    if args.trace:
        note = " (token counts estimated as len/4: /tokenize unavailable)" if counter.used_fallback else ""
        print(f"trace: {args.trace}{note}")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
