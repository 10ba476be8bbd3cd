"""Shell-level analysis of a tool call: simple-command normalisation and the
numeric feature vector of ContextServe's duration classifier.

Two things live here because both the rules layer and the classifier need
the same view of a command:

* ``parse_simple_command`` turns one simple command (an item of
  ``ToolCall.commands``) into a ``SimpleCommand``: the program name
  normalised (basename, ``python3.11`` -> ``python``, ``pip3`` -> ``pip``),
  its arguments, and what the wrappers in front of it said (``sudo``,
  ``env``, ``time``, ``nice``, ``nohup``, ``timeout N``, ``VAR=value``).
  Results are cached (LRU), since agents repeat the same commands.
* ``extract_features(call)`` returns a float32 vector whose i-th entry is
  ``FEATURE_NAMES[i]`` (see ``FEATURE_DOCS`` for each feature's meaning).

Invariants:

* ``len(extract_features(call)) == len(FEATURE_NAMES)`` for every call, and
  every entry is finite and >= 0 (a missing value is 0, e.g.
  ``timeout_seconds`` is 0 when there is no ``timeout`` wrapper).
* The feature definitions are part of the classifier's model format: a saved
  model records ``FEATURE_NAMES`` and refuses to load against a different
  list. Change a feature -> bump ``FEATURES_VERSION`` and retrain
  (``scripts/build_bootstrap_model.py``). The known-fast / known-slow program
  tables below are therefore fixed here and do not follow the (user
  configurable) rules file.

Pure Python + numpy; never raises on odd input (unbalanced quotes fall back
to whitespace splitting).
"""

from __future__ import annotations

import functools
import math
import re
import shlex
from dataclasses import dataclass

import numpy as np

from .parser import ToolCall

__all__ = [
    "FEATURES_VERSION",
    "FEATURE_DOCS",
    "FEATURE_NAMES",
    "SimpleCommand",
    "extract_features",
    "extract_features_from_command",
    "feature_dict",
    "parse_duration",
    "parse_simple_command",
]

FEATURES_VERSION = 1

# Name -> meaning. The order of this table is the order of the vector.
FEATURE_DOCS: dict[str, str] = {
    "n_commands": "simple commands in the call (items of ToolCall.commands)",
    "n_pipes": "pipe operators '|' (not '||')",
    "n_redirects": "redirections '>', '>>', '<' (heredoc '<<' counted once)",
    "n_sequence_ops": "'&&', '||' and ';' operators",
    "n_loops": "for / while / until loops",
    "n_subshells": "command substitutions '$(' / backticks and '(' subshells",
    "has_sudo": "1 if any command runs under sudo",
    "n_network": "network tools: curl, wget, ssh, scp, rsync, git clone/fetch/pull/push, pip download, ...",
    "n_package_install": "package installs: pip/npm/yarn/pnpm/apt/conda/cargo/brew/gem/poetry/uv install, ...",
    "n_test_runners": "test runners: pytest, tox, nox, unittest, go test, cargo test, npm test, jest, ...",
    "n_build_tools": "build tools: make, cmake, ninja, gradle, mvn, bazel, docker build, cargo build, ...",
    "n_compilers": "compilers: gcc, g++, clang, javac, rustc, tsc, nvcc, ...",
    "n_python_scripts": "python runs of a script file (python x.py, ./x.py)",
    "n_python_inline": "python -c runs",
    "n_globs": "arguments containing a glob (*, ?, **)",
    "n_args": "arguments over all commands (program names excluded)",
    "max_path_depth": "largest number of '/'-separated parts in a path-like argument",
    "command_length": "characters in the whole command",
    "n_recursive_flags": "-r / -R / --recursive flags (any command)",
    "find_without_maxdepth": "find invocations without -maxdepth",
    "sleep_seconds": "total of sleep durations (0 if none)",
    "timeout_seconds": "smallest 'timeout N' limit (0 if none)",
    "has_editor": "in-place editors: sed -i, perl -i, patch, ed, tee",
    "n_git_read": "read-only git subcommands (status, diff, log, show, branch, ...)",
    "n_git_write": "git subcommands that write or use the network (commit, checkout, clone, push, ...)",
    "n_known_fast": "commands whose program is known to be fast (ls, cat, grep, ...)",
    "n_known_slow": "commands matching a known-slow prefix (make, pip install, ...)",
    "pipe_into_head_tail": "1 if a pipeline ends in head/tail (output, and often work, bounded)",
    "has_test_selection": "1 if a test runner selects tests (:: ids, -k, a single test file)",
    "n_background": "commands sent to the background with a trailing '&'",
}
FEATURE_NAMES: tuple[str, ...] = tuple(FEATURE_DOCS)
_INDEX = {name: i for i, name in enumerate(FEATURE_NAMES)}

# Wrappers whose first non-option argument is the real command, with the
# options of each that take a separate value.
_WRAPPERS: dict[str, frozenset[str]] = {
    "sudo": frozenset({"-u", "-g", "-C", "-h", "-p", "-U", "-r", "-t"}),
    "env": frozenset({"-u", "-C", "-S", "--unset", "--chdir"}),
    "nice": frozenset({"-n", "--adjustment"}),
    "ionice": frozenset({"-c", "-n", "-p"}),
    "stdbuf": frozenset({"-i", "-o", "-e"}),
    "time": frozenset({"-f", "-o"}),
    "exec": frozenset({"-a"}),
    "nohup": frozenset(),
    "command": frozenset(),
}
# Shell keywords in front of a command once a compound command is split on
# ';' / newlines ("do sleep 1", "then make"): the command follows them.
# "done" is deliberately not here: a loop's end keeps the loop unknown.
_PREFIX_KEYWORDS = frozenset({"do", "then", "else", "elif", "if", "while", "until", "!", "{"})
_NOOP_KEYWORDS = frozenset({"fi", "esac", "}"})
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_PIP = re.compile(r"^pip(\d+(\.\d+)?)?$")
_DURATION = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)([smhd]?)$")
_DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float | None:
    """GNU ``sleep``/``timeout`` duration (``1.5``, ``10s``, ``2m``,
    ``infinity``) in seconds, or None when ``text`` is not a duration."""
    if text in ("inf", "infinity"):
        return math.inf
    match = _DURATION.match(text)
    if match is None:
        return None
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


@dataclass(frozen=True)
class SimpleCommand:
    """One simple command with its wrappers peeled off.

    Attributes:
        program: normalised program name ('' when the command is only
            assignments / wrappers or a closing ``fi``/``esac``); basename,
            ``python*`` -> ``python``, ``pip*`` -> ``pip``. Leading shell
            keywords of a split compound command (``do``, ``then``, ``if``,
            ``while``, ...) are skipped; ``done`` stays the program.
        args: the program's arguments, unchanged.
        sudo: a ``sudo`` wrapper was present.
        timeout_s: the ``timeout N`` limit in front of the program, if any.
        background: the command ends in a lone ``&``.
        substitution: the text contains ``$(`` or a backtick, i.e. it runs
            commands this analysis cannot see.
        raw: the simple command as given.
    """

    program: str
    args: tuple[str, ...]
    sudo: bool
    timeout_s: float | None
    background: bool
    substitution: bool
    raw: str

    def positional(self) -> list[str]:
        """Arguments that do not start with '-'."""
        return [a for a in self.args if not a.startswith("-")]


def _split_tokens(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # unbalanced quotes
        return text.split()


def _normalise_program(token: str) -> str:
    name = token.rsplit("/", 1)[-1]
    if _PYTHON.match(name):
        return "python"
    if _PIP.match(name):
        return "pip"
    if name == "py.test":
        return "pytest"
    return name


@functools.lru_cache(maxsize=8192)
def parse_simple_command(text: str) -> SimpleCommand:
    """Normalise one simple command (see ``SimpleCommand``). Cached."""
    raw = text
    stripped = text.rstrip()
    background = stripped.endswith("&") and not stripped.endswith("&&")
    if background:
        stripped = stripped[:-1]
    tokens = _split_tokens(stripped)
    sudo = False
    timeout_s: float | None = None
    if tokens and tokens[0] in _NOOP_KEYWORDS and len(tokens) == 1:
        tokens = []
    while tokens:
        head = tokens[0]
        if head in _PREFIX_KEYWORDS and len(tokens) > 1:
            tokens.pop(0)
            continue
        if _ENV_ASSIGNMENT.match(head):
            tokens.pop(0)
            continue
        name = head.rsplit("/", 1)[-1]
        if name in _WRAPPERS and len(tokens) > 1:
            sudo = sudo or name == "sudo"
            tokens.pop(0)
            takes_value = _WRAPPERS[name]
            while tokens and tokens[0].startswith("-"):
                option = tokens.pop(0)
                if option in takes_value and tokens:
                    tokens.pop(0)
            continue
        if name == "timeout" and len(tokens) > 1:
            tokens.pop(0)
            while tokens and tokens[0].startswith("-"):
                option = tokens.pop(0)
                if option in ("-k", "-s", "--kill-after", "--signal") and tokens:
                    tokens.pop(0)
            if tokens:
                limit = parse_duration(tokens[0])
                if limit is not None:
                    tokens.pop(0)
                    timeout_s = limit if timeout_s is None else min(timeout_s, limit)
            continue
        break
    program = _normalise_program(tokens[0]) if tokens else ""
    return SimpleCommand(
        program=program,
        args=tuple(tokens[1:]),
        sudo=sudo,
        timeout_s=timeout_s,
        background=background,
        substitution="$(" in text or "`" in text,
        raw=raw,
    )


# --- fixed knowledge tables (part of the model format; see module docstring)
_FAST_PROGRAMS = frozenset(
    {
        "ls", "cat", "pwd", "head", "tail", "echo", "printf", "wc", "grep", "egrep", "fgrep",
        "which", "type", "env", "printenv", "whoami", "date", "uname", "hostname", "id",
        "true", "false", "cd", "export", "set", "unset", "pushd", "popd", "alias", "source", ".",
        "basename", "dirname", "realpath", "readlink", "stat", "file", "sort", "uniq", "cut",
        "tr", "nl", "diff", "cmp", "mkdir", "touch", "mv", "ln", "sed", "awk", "test", "[",
        "jq", "column", "tree",
    }
)
_NETWORK_PROGRAMS = frozenset({"curl", "wget", "ssh", "scp", "rsync", "nc", "ping", "ftp", "sftp", "aria2c"})
_NETWORK_SUBCOMMANDS = frozenset(
    {("git", "clone"), ("git", "fetch"), ("git", "pull"), ("git", "push"), ("pip", "download"),
     ("docker", "pull"), ("docker", "push"), ("gh", "repo"), ("huggingface-cli", "download")}
)
_INSTALL_TOOLS = frozenset(
    {"pip", "npm", "yarn", "pnpm", "apt", "apt-get", "conda", "mamba", "cargo", "brew", "gem",
     "poetry", "pipenv", "uv", "yum", "dnf", "apk", "go"}
)
_INSTALL_WORDS = frozenset({"install", "ci", "add", "sync", "get", "create", "update", "upgrade"})
_TEST_PROGRAMS = frozenset({"pytest", "tox", "nox", "jest", "mocha", "ctest", "vitest", "phpunit", "rspec"})
_TEST_SUBCOMMANDS = frozenset(
    {("go", "test"), ("cargo", "test"), ("npm", "test"), ("yarn", "test"), ("pnpm", "test"),
     ("make", "test"), ("make", "check"), ("dotnet", "test"), ("mvn", "test"), ("gradle", "test"),
     ("bazel", "test")}
)
_BUILD_PROGRAMS = frozenset({"make", "cmake", "ninja", "gradle", "gradlew", "mvn", "mvnw", "bazel", "scons", "meson", "msbuild"})
_BUILD_SUBCOMMANDS = frozenset(
    {("docker", "build"), ("cargo", "build"), ("go", "build"), ("npm", "run"), ("yarn", "build"),
     ("dotnet", "build"), ("docker", "compose"), ("python", "setup.py")}
)
_COMPILERS = frozenset({"gcc", "g++", "cc", "c++", "clang", "clang++", "javac", "rustc", "tsc", "nvcc", "gfortran", "ghc"})
_GIT_READ = frozenset(
    {"status", "diff", "log", "show", "branch", "rev-parse", "ls-files", "blame", "remote", "describe",
     "shortlog", "grep", "config", "tag", "reflog", "cat-file", "ls-tree"}
)
_GIT_WRITE = frozenset(
    {"commit", "checkout", "switch", "clone", "fetch", "pull", "push", "merge", "rebase", "add", "rm",
     "mv", "reset", "stash", "restore", "cherry-pick", "apply", "am", "init", "gc", "submodule", "clean", "revert"}
)
_SLOW_PREFIXES: tuple[tuple[str, ...], ...] = (
    ("make",), ("cmake", "--build"), ("ninja",), ("pip", "install"), ("npm", "install"), ("npm", "ci"),
    ("yarn", "install"), ("pnpm", "install"), ("cargo", "build"), ("cargo", "test"), ("docker", "build"),
    ("apt-get", "install"), ("apt", "install"), ("apt-get", "update"), ("conda", "install"), ("conda", "create"),
    ("pytest",), ("python", "-m", "pytest"), ("tox",), ("nox",), ("mvn",), ("gradle",), ("gradlew",),
    ("go", "test"), ("go", "build"), ("bazel",), ("brew", "install"), ("poetry", "install"), ("uv", "sync"),
)
_EDITORS = frozenset({"patch", "ed", "tee"})
_REDIRECT = re.compile(r"<<-?|>>|(?<![0-9&>])>(?!&)|(?<![<])<(?![<(])")
_LOOP = re.compile(r"(?:^|[;&|\s(])(for|while|until)\s")
_PIPE = re.compile(r"(?<!\|)\|(?![|&])")
_SEQUENCE = re.compile(r"&&|\|\||;")
_SUBSHELL = re.compile(r"\$\(|`|(?:^|[;&|]\s*)\(")


def _words(cmd: SimpleCommand) -> list[str]:
    """Program followed by its positional arguments, with python's ``-m X``
    kept (so ``python -m pytest`` -> ['python', '-m', 'pytest'])."""
    words = [cmd.program]
    args = cmd.args
    i = 0
    while i < len(args):
        arg = args[i]
        if cmd.program == "python" and arg == "-m" and i + 1 < len(args):
            words.extend(("-m", args[i + 1]))
            i += 2
            continue
        if cmd.program == "cmake" and arg == "--build":
            words.append(arg)
        elif not arg.startswith("-"):
            words.append(arg)
        i += 1
    return words


def _starts_with(words: list[str], prefix: tuple[str, ...]) -> bool:
    return len(words) >= len(prefix) and tuple(words[: len(prefix)]) == prefix


def _short_flag(arg: str, letter: str) -> bool:
    return len(arg) > 1 and arg[0] == "-" and arg[1] != "-" and arg[1:].isalpha() and letter in arg[1:]


def _path_depth(arg: str) -> int:
    if "/" not in arg or "://" in arg:
        return 0
    return len([p for p in arg.split("/") if p and p != "."])


def extract_features_from_command(command: str, commands: tuple[str, ...] | None = None) -> np.ndarray:
    """Feature vector of a command line (see ``FEATURE_DOCS``).

    ``commands`` are its simple commands (``split_commands(command)``), given
    when the caller already has them (``ToolCall.commands``).
    """
    if commands is None:
        from .parser import split_commands

        commands = tuple(split_commands(command))
    return np.asarray(_features_cached(command, commands), dtype=np.float32)


def extract_features(call: ToolCall) -> np.ndarray:
    """Feature vector of a parsed tool call (float32, ``len(FEATURE_NAMES)``)."""
    return extract_features_from_command(call.command, call.commands)


def feature_dict(call: ToolCall) -> dict[str, float]:
    """``{feature name: value}`` of a call (for logs and tests)."""
    return dict(zip(FEATURE_NAMES, (float(v) for v in extract_features(call))))


@functools.lru_cache(maxsize=4096)
def _features_cached(command: str, commands: tuple[str, ...]) -> tuple[float, ...]:
    f = [0.0] * len(FEATURE_NAMES)

    def add(name: str, value: float = 1.0) -> None:
        f[_INDEX[name]] += value

    f[_INDEX["n_commands"]] = float(len(commands))
    f[_INDEX["n_pipes"]] = float(len(_PIPE.findall(command)))
    f[_INDEX["n_redirects"]] = float(len(_REDIRECT.findall(command)))
    f[_INDEX["n_sequence_ops"]] = float(len(_SEQUENCE.findall(command)))
    f[_INDEX["n_loops"]] = float(len(_LOOP.findall(command)))
    f[_INDEX["n_subshells"]] = float(len(_SUBSHELL.findall(command)))
    f[_INDEX["command_length"]] = float(len(command))

    min_timeout: float | None = None
    max_depth = 0
    for text in commands:
        cmd = parse_simple_command(text)
        program, args = cmd.program, cmd.args
        words = _words(cmd)
        sub = words[1] if len(words) > 1 else ""
        pair = (program, sub)
        if cmd.sudo:
            f[_INDEX["has_sudo"]] = 1.0
        if cmd.background:
            add("n_background")
        if cmd.timeout_s is not None:
            min_timeout = cmd.timeout_s if min_timeout is None else min(min_timeout, cmd.timeout_s)
        add("n_args", float(len(args)))
        for arg in args:
            if "*" in arg or "?" in arg:
                add("n_globs")
            if arg in ("--recursive", "-R", "-r") or _short_flag(arg, "r") or _short_flag(arg, "R"):
                add("n_recursive_flags")
            max_depth = max(max_depth, _path_depth(arg))
        if program in _NETWORK_PROGRAMS or pair in _NETWORK_SUBCOMMANDS:
            add("n_network")
        if program in _INSTALL_TOOLS and sub in _INSTALL_WORDS:
            add("n_package_install")
        elif program == "python" and words[1:4] == ["-m", "pip", "install"]:
            add("n_package_install")
        is_test = (
            program in _TEST_PROGRAMS
            or pair in _TEST_SUBCOMMANDS
            or (program == "python" and words[1:3] in (["-m", "pytest"], ["-m", "unittest"], ["-m", "tox"]))
        )
        if is_test:
            add("n_test_runners")
            if any("::" in a for a in args) or "-k" in args or any(
                a.endswith(".py") or "/test_" in a for a in args
            ):
                f[_INDEX["has_test_selection"]] = 1.0
        if program in _BUILD_PROGRAMS or pair in _BUILD_SUBCOMMANDS:
            add("n_build_tools")
        if program in _COMPILERS:
            add("n_compilers")
        if program == "python":
            if "-c" in args:
                add("n_python_inline")
            elif sub.endswith(".py"):
                add("n_python_scripts")
        elif program.endswith(".py"):
            add("n_python_scripts")
        if program == "find" and "-maxdepth" not in args:
            add("find_without_maxdepth")
        if program == "sleep":
            for arg in words[1:]:
                seconds = parse_duration(arg)
                if seconds is not None:
                    add("sleep_seconds", min(seconds, 86400.0))
        if (program == "sed" and any(a == "-i" or a.startswith("-i") or a == "--in-place" for a in args)) or (
            program == "perl" and any(a.startswith("-i") or (a.startswith("-p") and "i" in a) for a in args)
        ) or program in _EDITORS:
            f[_INDEX["has_editor"]] = 1.0
        if program == "git":
            if sub in _GIT_READ:
                add("n_git_read")
            elif sub in _GIT_WRITE:
                add("n_git_write")
        if program in _FAST_PROGRAMS:
            add("n_known_fast")
        if any(_starts_with(words, prefix) for prefix in _SLOW_PREFIXES):
            add("n_known_slow")
    if min_timeout is not None:
        f[_INDEX["timeout_seconds"]] = min(min_timeout, 86400.0)
    f[_INDEX["max_path_depth"]] = float(max_depth)
    if "|" in command and commands:
        last = parse_simple_command(commands[-1]).program
        if last in ("head", "tail") and _PIPE.search(command):
            f[_INDEX["pipe_into_head_tail"]] = 1.0
    return tuple(f)
