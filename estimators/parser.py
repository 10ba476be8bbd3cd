"""Extract the tool call an agent turn ends with, and a key for its history.

The scheduler decodes a finished turn's reply in the EngineCore and asks this
module which tool the agent is about to run. The answer only steers how long
the turn's KV cache is kept, so parsing is best effort and never raises:
replies without a recognisable tool call yield ``None`` and the caller falls
back to the ``NO_TOOL_KEY`` history.

Supported: native tool calls in the raw text models emit for them
(Hermes/Qwen ``<tool_call>``, Qwen3-Coder XML, Llama-3 JSON, Mistral
``[TOOL_CALLS]``, gpt-oss/Harmony ``to=functions.NAME``; see
``native_calls``), smolagents ``CodeAgent`` code actions (``<code>`` blocks,
fenced ``py``/``python`` blocks, its structured-output JSON),
mini-swe-agent's ```` ```mswea_bash_command ```` fences and
fenced ``bash`` / ``sh`` / ``shell`` / ``console`` / ``zsh`` blocks (the last
call wins; an unterminated final block counts, since agents often stop
generation at the closing fence), with ``<think>`` sections removed first
(terminated, unterminated, or only closed because the opening tag lived in
the prompt). A shell tool (``bash``, Claude Code's ``Bash``, Codex's
``shell``/``exec_command``, ...) is keyed by its command; a code action by
the tool functions it calls (``code_call``); any other tool by its name and
sub-action (``str_replace_editor view``, Claude Code's ``Read``).

A reply is attacker-controlled (through the prompt) and is parsed on the
engine thread for every finished turn, so every scan here is linear in what
it reads and what it reads is bounded: the last ``MAX_REPLY_CHARS`` of a
reply, the first ``MAX_PARSED_CHARS`` of a command, the first and last
``MAX_SIMPLE_COMMANDS // 2`` simple commands of it. Delimiters are located
with ``str.find`` or with regexes that have no two quantifiers able to
match the same characters (those backtrack quadratically); the reply's
text is scanned by ``reply_scan`` and ``native_calls``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection
from dataclasses import dataclass, field

from .code_actions import called_functions
from .native_calls import CODE_TOOL, command_of, extract_native_calls, tool_key_of
from .reply_scan import last_shell_block, strip_thinking

__all__ = [
    "CODE_KEY",
    "CODE_TOOL",
    "MAX_PARSED_CHARS",
    "MAX_REPLY_CHARS",
    "MAX_SIMPLE_COMMANDS",
    "NO_TOOL_KEY",
    "ToolCall",
    "code_call",
    "named_call",
    "shell_call",
    "extract_tool_call",
    "is_finish_action",
    "parsed_prefix",
    "split_commands",
    "strip_thinking",
    "tool_key_for_command",
]

# History key for turns whose reply has no parsable tool call. Agents still
# come back quickly after such turns (format error message), so they get a
# history of their own instead of "no pin".
NO_TOOL_KEY = "<no-tool>"
# History key of a code action that calls no tool function (plain Python run
# by the agent's interpreter: print(2 ** 10)); also its ``ToolCall.tool``.
CODE_KEY = CODE_TOOL
# What is parsed of one command, and of one reply. Parsing runs on the
# engine thread and its results are stored per job and per tool, so both
# are bounded whatever a client sends or a model emits: a command is cut to
# its first MAX_PARSED_CHARS characters (the program and its first
# arguments decide its key and class) -- fewer where its characters are
# wider than Latin-1, so that the kept text never takes more than
# MAX_PARSED_CHARS bytes (CPython stores 1, 2 or 4 bytes per character,
# by the widest one) -- and a reply to its last MAX_REPLY_CHARS (the tool
# call sits at the end: a call further back is not found).
MAX_PARSED_CHARS = 2048
MAX_REPLY_CHARS = 16384
# Simple commands kept of one call: its first and last MAX_SIMPLE_COMMANDS
# // 2. The head holds the set-up (cd, source, the heredoc that writes a
# script), the tail what runs (the key comes from the last command that
# does work). Every kept one costs a string header (~80 bytes) per job and
# a tokenisation per parse: `a;b;c;...` at MAX_PARSED_CHARS used to keep
# 683-1,024 of them (43-99 KB per job, 7-10 ms to key).
MAX_SIMPLE_COMMANDS = 16
# Longest history key kept (a program name can be a single huge word).
MAX_KEY_CHARS = 128

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

    Invariant (for calls built by ``shell_call``, ``code_call`` and
    ``named_call``): ``command`` is at most ``MAX_PARSED_CHARS`` characters
    and bytes of text, ``commands`` at most ``MAX_SIMPLE_COMMANDS`` pieces of
    it, ``functions`` at most ``MAX_FUNCTIONS`` names of at most
    ``MAX_FUNCTION_CHARS`` characters (``code_actions``) and ``tool_key`` at
    most ``MAX_KEY_CHARS`` characters: at most 8 KB in all, whatever the
    input (about 6.2 KB in the worst cases ``tests/test_threat_parsing.py``
    builds). ``commands`` is empty unless ``tool == SHELL_TOOL``;
    ``functions`` is empty unless ``tool == CODE_TOOL``.

    Attributes:
        command: the command text of the block that won, cut to what is
            parsed (for a tool that is not a shell: its name).
        tool_key: the history key (see ``tool_key_for_command``).
        commands: the simple commands the block consists of, in order
            (empty for a tool that is not a shell; of a longer chain only
            the first and last ``MAX_SIMPLE_COMMANDS // 2``).
        tool: ``SHELL_TOOL`` for shell commands, ``CODE_TOOL`` for a code
            action, else the tool's name.
        functions: the tool functions a code action calls, in order of
            first call (``code_actions.called_functions``); empty otherwise.
    """

    command: str
    tool_key: str
    commands: tuple[str, ...] = field(default_factory=tuple)
    tool: str = "bash"
    functions: tuple[str, ...] = field(default_factory=tuple)


def parsed_prefix(command: str) -> str:
    """What is parsed of ``command``: its first ``MAX_PARSED_CHARS``
    characters, cut further so that they take at most ``MAX_PARSED_CHARS``
    bytes (1,024 characters of text beyond Latin-1, 512 beyond the BMP).

    Returns ``command`` itself when it is short enough (no copy), so a cache
    keyed by the prefix shares its text with the parsed call.
    """
    head = command[:MAX_PARSED_CHARS]
    if head.isascii():  # the common case, and a C-speed check
        return head
    widest = ord(max(head))
    width = 1 if widest < 0x100 else 2 if widest < 0x10000 else 4
    return head[: MAX_PARSED_CHARS // width]


def shell_call(command: str) -> ToolCall:
    """The call of a shell command (a client's ``tool_command`` hint, a
    fenced block, a native bash tool call), parsed from ``parsed_prefix``
    of it; at most ``MAX_SIMPLE_COMMANDS`` simple commands are kept."""
    command = parsed_prefix(command)
    pipelines = _kept_pipelines(_pipelines(command))
    commands = tuple(piece for pipeline in pipelines for piece in pipeline)
    return ToolCall(command, _key_of_pipelines(pipelines), commands)


def named_call(name: str, key: str | None = None) -> ToolCall:
    """The call of a tool that is not a shell (by name, e.g. ``finish``)."""
    name = name[:MAX_KEY_CHARS]
    return ToolCall(name, (key or name)[:MAX_KEY_CHARS], (), tool=name)


def code_call(code: str) -> ToolCall:
    """The call of a code action (smolagents ``CodeAgent``): the command is
    the code (``parsed_prefix`` of it), the key the tool functions it calls,
    sorted and joined by ``+`` (``web_search``, ``visit_webpage+web_search``;
    the order of calls within one action hardly changes how long it takes,
    and sorting keeps one history per set), or ``CODE_KEY`` when it calls
    none. The functions are read from the whole code (the caller bounds it
    to ``MAX_REPLY_CHARS``), so a ``final_answer(...)`` at the end of a long
    action is found."""
    functions = called_functions(code)
    key = "+".join(sorted(functions))[:MAX_KEY_CHARS] if functions else CODE_KEY
    return ToolCall(parsed_prefix(code), key, (), tool=CODE_TOOL, functions=functions)


def is_finish_action(call: ToolCall, actions: Collection[str]) -> bool:
    """Does ``call`` end its job? A shell call does when one of its simple
    commands is one of ``actions`` (whitespace-normalised, e.g. mini-swe-agent's
    ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``); a code action when one of
    the functions it calls is (smolagents' ``final_answer(...)``: the run
    ends when the code reaches it); any other tool when its name is
    (``finish``, ``submit``). Names compare as given or lower-cased."""
    if call.tool == CODE_TOOL:
        return any(name in actions or name.lower() in actions for name in call.functions)
    if call.tool != "bash":
        return call.tool in actions or call.tool.lower() in actions
    return any(" ".join(simple.split()) in actions for simple in call.commands)


def _pipelines(command: str) -> list[list[str]]:
    """The simple commands of a command line, grouped by pipeline, in order.

    Pieces are stripped; blank ones and comments are dropped, as are
    pipelines left empty. Linear: two regex splits without quantifiers.
    """
    pipelines: list[list[str]] = []
    for sequence_item in _SEQUENCE_SPLIT.split(command):
        if "|" not in sequence_item:  # the usual case, without a second split
            piece = sequence_item.strip()
            if piece and piece[0] != "#":
                pipelines.append([piece])
            continue
        pipeline = [
            piece
            for piece in map(str.strip, _PIPE_SPLIT.split(sequence_item))
            if piece and piece[0] != "#"
        ]
        if pipeline:
            pipelines.append(pipeline)
    return pipelines


def _kept_pipelines(pipelines: list[list[str]]) -> list[list[str]]:
    """``pipelines`` with only the first and last ``MAX_SIMPLE_COMMANDS // 2``
    simple commands (pipelines cut at the gap keep their kept side)."""
    total = sum(len(pipeline) for pipeline in pipelines)
    if total <= MAX_SIMPLE_COMMANDS:
        return pipelines
    head = MAX_SIMPLE_COMMANDS // 2
    tail_from = total - (MAX_SIMPLE_COMMANDS - head)
    kept: list[list[str]] = []
    index = 0
    for pipeline in pipelines:
        part = [
            piece
            for i, piece in enumerate(pipeline, start=index)
            if i < head or i >= tail_from
        ]
        index += len(pipeline)
        if part:
            kept.append(part)
    return kept


def split_commands(command: str) -> list[str]:
    """Split a command line on ``&&``, ``||``, ``;``, newlines and pipes.

    Pipes are returned as one item each side, so ``cat a | grep b && ls``
    gives ``["cat a", "grep b", "ls"]``. Comments and blank parts are dropped.
    All parts are returned (linear time); ``shell_call`` keeps at most
    ``MAX_SIMPLE_COMMANDS`` of them.
    """
    return [piece for pipeline in _pipelines(command) for piece in pipeline]


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


def _key_of_pipelines(pipelines: list[list[str]]) -> str:
    """Key of the last pipeline that has one: its first keyed command.

    Read from the end, so the usual chain costs one tokenisation; at most
    one per simple command of ``pipelines`` (bounded by the caller)."""
    for pipeline in reversed(pipelines):
        for piece in pipeline:
            key = _key_of_simple_command(piece)
            if key is not None:
                return key[:MAX_KEY_CHARS]
    return NO_TOOL_KEY


def tool_key_for_command(command: str) -> str:
    """History key of a command line (the one ``shell_call`` gives it).

    Sequencing (``cd repo && pytest -x``) keys on the last command that does
    real work; a pipeline (``cat f | grep x``) keys on its first command,
    which produces the data. Keys are finer than the first word: the
    subcommand of ``git``/``pip``/``make``/..., the module of ``python -m``.
    Only what ``shell_call`` keeps is read (``parsed_prefix``, the first and
    last ``MAX_SIMPLE_COMMANDS // 2`` simple commands).
    """
    return _key_of_pipelines(_kept_pipelines(_pipelines(parsed_prefix(command))))


def extract_tool_call(text: str) -> ToolCall | None:
    """Return the tool call a reply ends with, or None when there is none.

    Only the last ``MAX_REPLY_CHARS`` characters are read; any reply costs
    linear time in those (under 10 ms on a slow 2-core EPYC, see
    ``tests/test_threat_parsing.py``) and never raises.
    """
    if not text:
        return None
    text = text[-MAX_REPLY_CHARS:]
    calls = extract_native_calls(text)
    if calls:
        last = calls[-1]
        if last.format == "code":
            return code_call(last.arguments.get("code", ""))
        command = command_of(last)
        if command is not None:
            return shell_call(command)
        return named_call(last.name, tool_key_of(last))
    block = last_shell_block(strip_thinking(text))
    return shell_call(block) if block is not None else None
