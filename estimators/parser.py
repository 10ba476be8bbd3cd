"""Extract the tool call an agent turn ends with, and a key for its history.

The scheduler decodes a finished turn's reply in the EngineCore and asks this
module which tool the agent is about to run. The answer only steers how long
the turn's KV cache is kept, so parsing is best effort and never raises:
replies without a recognisable tool call yield ``None`` and the caller falls
back to the ``NO_TOOL_KEY`` history.

Supported: native tool calls in the raw text models emit for them
(Hermes/Qwen ``<tool_call>``, Qwen3-Coder XML, Llama-3 JSON, Mistral
``[TOOL_CALLS]``, gpt-oss/Harmony ``to=functions.NAME``; see
``native_calls``), mini-swe-agent's ```` ```mswea_bash_command ```` fences and
fenced ``bash`` / ``sh`` / ``shell`` / ``console`` / ``zsh`` blocks (the last
call wins; an unterminated final block counts, since agents often stop
generation at the closing fence), with ``<think>`` sections removed first
(terminated, unterminated, or only closed because the opening tag lived in
the prompt). A shell tool is keyed by its command; any other tool by its name
and sub-action (``str_replace_editor view``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection
from dataclasses import dataclass, field

from .native_calls import command_of, extract_native_calls, tool_key_of

__all__ = [
    "MAX_PARSED_CHARS",
    "NO_TOOL_KEY",
    "ToolCall",
    "shell_call",
    "extract_tool_call",
    "is_finish_action",
    "split_commands",
    "strip_thinking",
    "tool_key_for_command",
]

# History key for turns whose reply has no parsable tool call. Agents still
# come back quickly after such turns (format error message), so they get a
# history of their own instead of "no pin".
NO_TOOL_KEY = "<no-tool>"
# What is parsed of one command, and of one reply. Parsing runs on the
# engine thread and its results are stored per job and per tool, so both
# are bounded whatever a client sends or a model emits: a command is cut to
# its first MAX_PARSED_CHARS characters (the program and its first
# arguments decide its key and class), a reply to its last MAX_REPLY_CHARS
# (the tool call sits at the end).
MAX_PARSED_CHARS = 2048
MAX_REPLY_CHARS = 16384
# Longest history key kept (a program name can be a single huge word).
MAX_KEY_CHARS = 128

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(
    r"```[ \t]*(bash|sh|shell|console|zsh|terminal)?[ \t]*\n(.*?)(?:\n?```|\Z)",
    re.DOTALL | re.IGNORECASE,
)
# Splits a command line into simple commands. Pipes are kept apart from the
# sequencing operators because they pick a different "main" command. No
# \s* around the operators: on a long run of spaces that backtracks
# quadratically; pieces are stripped afterwards instead.
_SEQUENCE_SPLIT = re.compile(r"&&|\|\||;|\n")
_PIPE_SPLIT = re.compile(r"(?<!\|)\|(?!\|)")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")

# Commands that only prepare the shell for the real work; a chain's key is
# taken from the last command that is not one of these.
_SETUP_COMMANDS = frozenset(
    {"cd", "export", "source", ".", "set", "unset", "pushd", "popd", "alias"}
)
# Wrappers whose first non-option argument is the real command.
_WRAPPERS = frozenset({"sudo", "time", "nice", "nohup", "env", "command", "exec"})
# Tools whose first positional argument selects very different work.
_SUBCOMMAND_TOOLS = frozenset(
    {
        "git", "pip", "pip3", "uv", "poetry", "conda", "npm", "pnpm", "yarn",
        "cargo", "go", "docker", "kubectl", "apt", "apt-get", "make", "mvn",
        "gradle", "dotnet", "bazel", "cmake", "systemctl", "brew", "gh",
    }
)
_PYTHON_NAMES = re.compile(r"^python(\d+(\.\d+)?)?$")


@dataclass(frozen=True)
class ToolCall:
    """A parsed tool call.

    Attributes:
        command: the full command text of the block that won (for a tool
            that is not a shell: its name).
        tool_key: the history key (see ``tool_key_for_command``).
        commands: the simple commands the block consists of, in order
            (empty for a tool that is not a shell).
        tool: ``SHELL_TOOL`` for shell commands, else the tool's name.
    """

    command: str
    tool_key: str
    commands: tuple[str, ...] = field(default_factory=tuple)
    tool: str = "bash"


def shell_call(command: str) -> ToolCall:
    """The call of a shell command (a client's ``tool_command`` hint, a
    fenced block, a native bash tool call), parsed from at most its first
    ``MAX_PARSED_CHARS`` characters."""
    command = command[:MAX_PARSED_CHARS]
    return ToolCall(command, tool_key_for_command(command), tuple(split_commands(command)))


def named_call(name: str, key: str | None = None) -> ToolCall:
    """The call of a tool that is not a shell (by name, e.g. ``finish``)."""
    name = name[:MAX_KEY_CHARS]
    return ToolCall(name, (key or name)[:MAX_KEY_CHARS], (), tool=name)


def strip_thinking(text: str) -> str:
    """Remove reasoning sections so a command quoted while thinking is not
    mistaken for the tool call."""
    text = _THINK_BLOCK.sub("", text)
    lower = text.lower()
    # Opening tag in the prompt (chat templates that pre-open <think>): only
    # the closing tag is in the reply, everything before it was thinking.
    close = lower.rfind("</think>")
    if close != -1:
        text = text[close + len("</think>"):]
        lower = text.lower()
    # Unterminated thinking (generation stopped while reasoning): nothing
    # after the tag is an answer.
    open_ = lower.find("<think>")
    if open_ != -1:
        text = text[:open_]
    return text


def is_finish_action(call: ToolCall, actions: Collection[str]) -> bool:
    """Does ``call`` end its job? A shell call does when one of its simple
    commands is one of ``actions`` (whitespace-normalised, e.g. mini-swe-agent's
    ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``); any other tool when its
    name is (``finish``, ``submit``)."""
    if call.tool != "bash":
        return call.tool in actions or call.tool.lower() in actions
    return any(" ".join(simple.split()) in actions for simple in call.commands)


def split_commands(command: str) -> list[str]:
    """Split a command line on ``&&``, ``||``, ``;``, newlines and pipes.

    Pipes are returned as one item each side, so ``cat a | grep b && ls``
    gives ``["cat a", "grep b", "ls"]``. Comments and blank parts are dropped.
    """
    parts: list[str] = []
    for sequence_item in _SEQUENCE_SPLIT.split(command):
        for piece in _PIPE_SPLIT.split(sequence_item):
            piece = piece.strip()
            if piece and not piece.startswith("#"):
                parts.append(piece)
    return parts


def _tokens(simple_command: str) -> list[str]:
    try:
        return shlex.split(simple_command, comments=True)
    except ValueError:  # unbalanced quotes: fall back to whitespace
        return simple_command.split()


def _key_of_simple_command(simple_command: str) -> str | None:
    """Key of one simple command, or None for empty / setup-only commands."""
    tokens = [t for t in _tokens(simple_command)]
    # Leading VAR=value assignments and wrappers (with their options).
    while tokens and (
        _ENV_ASSIGNMENT.match(tokens[0]) or tokens[0] in _WRAPPERS
    ):
        tokens.pop(0)
        while tokens and tokens[0].startswith("-"):
            tokens.pop(0)
    if tokens and tokens[0] == "timeout":
        tokens = tokens[1:]
        while tokens and (tokens[0].startswith("-") or tokens[0][:1].isdigit()):
            tokens.pop(0)
    if not tokens:
        return None
    program = tokens[0].rsplit("/", 1)[-1]
    if not program or program in _SETUP_COMMANDS:
        return None
    args = tokens[1:]
    if _PYTHON_NAMES.match(program):
        return _python_key(args)
    if program in _SUBCOMMAND_TOOLS:
        positional = [a for a in args if not a.startswith("-")]
        return f"{program} {positional[0]}" if positional else program
    if program.endswith(".py"):
        return "python <script>"
    if program.endswith(".sh"):
        return "sh <script>"
    return program


def _python_key(args: list[str]) -> str:
    """``python -m pytest`` and ``python x.py`` are different tools."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-m" and i + 1 < len(args):
            return f"python -m {args[i + 1]}"
        if arg.startswith("-m") and len(arg) > 2:
            return f"python -m {arg[2:]}"
        if arg == "-c":
            return "python -c"
        if not arg.startswith("-"):
            return "python <script>"
        i += 1
    return "python"


def tool_key_for_command(command: str) -> str:
    """History key of a command line.

    Sequencing (``cd repo && pytest -x``) keys on the last command that does
    real work; a pipeline (``cat f | grep x``) keys on its first command,
    which produces the data. Keys are finer than the first word: the
    subcommand of ``git``/``pip``/``make``/..., the module of ``python -m``.
    """
    key: str | None = None
    for sequence_item in _SEQUENCE_SPLIT.split(command):
        pipeline = [p for p in _PIPE_SPLIT.split(sequence_item) if p.strip()]
        for piece in pipeline:
            piece_key = _key_of_simple_command(piece)
            if piece_key is not None:
                key = piece_key
                break
    return key[:MAX_KEY_CHARS] if key is not None else NO_TOOL_KEY


def extract_tool_call(text: str) -> ToolCall | None:
    """Return the tool call a reply ends with, or None when there is none."""
    if not text:
        return None
    text = text[-MAX_REPLY_CHARS:]
    calls = extract_native_calls(text)
    if calls:
        last = calls[-1]
        command = command_of(last)
        if command is not None:
            return shell_call(command)
        return named_call(last.name, tool_key_of(last))
    answer = strip_thinking(text)
    blocks = [
        m.group(2).strip()
        for m in _FENCE.finditer(answer)
        if m.group(1) is not None and m.group(2).strip()
    ]
    if not blocks:
        return None
    return shell_call(blocks[-1])
