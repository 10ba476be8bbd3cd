"""The agent's tool: one shell command per turn, checked and run.

``CommandPolicy`` decides whether a command may run in the workspace (the
allow-list of ``agent_loop``'s docstring); ``CommandRunner`` runs it as
``bash -lc`` under a wall-clock timeout; ``format_observation`` turns the
outcome into the next user message; ``is_submission`` tells whether a command
submits the job.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

from vllm_continuum_plugin.estimators.parser import split_commands

from .agent_task import SUBMIT_TOKEN

__all__ = [
    "DEFAULT_ALLOWED_PROGRAMS",
    "DEFAULT_GIT_SUBCOMMANDS",
    "CommandPolicy",
    "CommandResult",
    "CommandRunner",
    "format_observation",
    "is_submission",
    "truncate_output",
]

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


def is_submission(command: str) -> bool:
    """Whether a command submits: it mentions ``SUBMIT`` or runs ``submit``."""
    if re.search(rf"\b{SUBMIT_TOKEN}\b", command):
        return True
    return any(_words(simple)[:1] == ["submit"] for simple in split_commands(command))


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

    # Makes `submit` a command the shell knows, and `python` the Python
    # running the loop: agents type `python`, and a machine may have only
    # `python3` (or a login profile that drops the venv from PATH).
    PREAMBLE = (f"submit() {{ echo {SUBMIT_TOKEN}; }}\n"
                f"export PATH={shlex.quote(os.path.dirname(sys.executable))}:\"$PATH\"\n")
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
