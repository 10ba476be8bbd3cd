"""Recognise native tool calls in the raw decoded text of a model reply.

The scheduler decodes a finished turn with special tokens kept and asks which
tools the agent is about to run. Formats are those vLLM's parsers read:
``hermes`` (``<tool_call>{json}</tool_call>``, Hermes/Qwen2.5), ``qwen3_xml``
(``<function=NAME><parameter=KEY>..</parameter></function>``, Qwen3-Coder),
``llama3_json`` (``<|python_tag|>{"name", "parameters"}``, ``;``-separated),
``mistral`` (``[TOOL_CALLS][{..}]`` and ``[TOOL_CALLS]NAME[ARGS]{..}``),
``harmony`` (gpt-oss ``to=functions.NAME ... <|message|>{..}<|call|>``) and,
only when none of those is present, code actions (format ``code``: a
smolagents ``CodeAgent``'s ``<code>...</code>`` block, its structured-output
``{"thought": ..., "code": ...}`` object, or a fenced ``py`` / ``python``
block; name ``CODE_TOOL``, argument ``code``) and ``fence`` (````
```mswea_bash_command ```` / ``bash`` / ``sh`` / ``shell`` / ``zsh`` blocks,
mini-swe-agent text mode). Fenced code and shell blocks are read in one pass,
in order (the caller takes the last); a ``<code>`` block wins over fences.

Shell tools (``BASH_TOOL_NAMES``) include Claude Code's ``Bash`` (names are
compared case-insensitively) and Codex's ``shell`` / ``shell_command`` /
``exec_command`` / ``local_shell``; Codex's ``shell`` passes the command as
an argv list (``["bash", "-lc", "pytest -q"]``), which ``command_of`` turns
into the command line the shell runs (``pytest -q``).

Reasoning (``<think>``/``[THINK]`` sections, Harmony's analysis channel) is
dropped first. Work is bounded and linear: only the last ``max_chars``
characters are read, delimiters are located with ``str.find`` and JSON is
decoded at most once per candidate, and at most ``MAX_CALL_CANDIDATES``
candidates are decoded per format (the last ones, where calls are marked
one by one). Nothing here raises on model text.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BASH_TOOL_NAMES",
    "CODE_TOOL",
    "MAX_CALL_CANDIDATES",
    "NativeCall",
    "command_of",
    "extract_native_calls",
    "tool_key_of",
]

# Tools whose call runs a shell command (name compared case-insensitively).
BASH_TOOL_NAMES = frozenset(
    {
        "bash", "shell", "execute_bash", "run_shell_command", "terminal", "run",
        "exec", "cmd", "bash_command", "execute_command",
        # Codex CLI: "shell" (argv list), "shell_command" (string),
        # "exec_command" ({"cmd": ...}, unified exec), the Responses API's
        # built-in "local_shell" and the older "container.exec".
        "shell_command", "exec_command", "local_shell", "container.exec",
    }
)
# Name of the calls a code action makes (format "code", argument "code"):
# not a valid function name, so no tool a client declares is read as one
# (and calls are told apart by their format anyway).
CODE_TOOL = "<code>"
# Call candidates read per format: the last ones of a reply (of Llama-3's
# JSON sequence, which is decoded from its start, the first ones). The
# scheduler uses the last call; no agent emits this many parallel calls. A
# candidate costs a JSON decode and, when that fails, an exception and a
# name search (~5 us): a reply of nothing but 12-character openers
# ("<tool_call>{") is 1,365 candidates in 16k characters, 5-9 ms.
MAX_CALL_CANDIDATES = 64
# End-of-turn tokens stripped from the end of a reply: a raw decode ends
# with one or two. Each strip copies the text, so a reply of thousands of
# them ("</s></s>...") would cost quadratic time.
_MAX_TRAILING_SPECIALS = 4
_COMMAND_ARGS = ("command", "cmd", "script", "code")
_ACTION_ARGS = ("command", "action", "subcommand")
_FENCE_LANGS = frozenset({"mswea_bash_command", "bash", "sh", "shell", "zsh"})
# Fence languages of a code action: smolagents before 1.20 wrote ```py
# blocks (its parser also takes ```python).
_CODE_LANGS = frozenset({"py", "python", "python3"})
# Programs that run their "-c" argument as a script: Codex's shell tool
# sends ["bash", "-lc", "<script>"].
_SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh", "fish"})
# Argv items read of a list-form command (the program, its options, the
# script): whatever the list, joining it costs at most this many items.
_MAX_ARGV_ITEMS = 64
# How far from a <code> tag a newline must be for the tag to open a code
# action (see _opens_code_block).
_CODE_TAG_REACH = 32

_WS = re.compile(r"\s*")
_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:\-]{0,127}")
_ACTION = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,31}")
# Recovers the tool name from a call whose JSON does not decode.
_NAME_FIELD = re.compile(r'"name"\s*:\s*"([^"\\\n]{1,128})"')
_HARMONY_FIELD = re.compile(r"[^\s<]*")
_JSON = json.JSONDecoder()

# End-of-turn tokens a raw decode may end with (never Harmony's own).
_TRAILING_SPECIALS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "</s>")
_THINK_TAGS = (("<think>", "</think>"), ("[THINK]", "[/THINK]"))
_HARMONY_MESSAGE = "<|message|>"
_HARMONY_ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")
_HARMONY_ROLES = frozenset({"assistant", "user", "system", "developer"})


@dataclass(frozen=True)
class NativeCall:
    """One tool call: its name, decoded arguments and the format it came in."""

    name: str
    arguments: dict[str, Any] = field(hash=False)  # {} if unparsable
    format: str  # hermes | qwen3_xml | llama3_json | mistral | harmony | code | fence


class _Finder:
    """``str.find`` memoised for non-decreasing start positions (linear in total)."""

    def __init__(self, text: str, token: str) -> None:
        self.text, self.token, self.at = text, token, -1

    def find(self, start: int) -> int:
        """First occurrence at or after ``start``; ``len(text)`` if none."""
        if self.at < start:
            i = self.text.find(self.token, start)
            self.at = len(self.text) if i < 0 else i
        return self.at


def _from_last(text: str, token: str, count: int) -> int:
    """Where the last ``count`` occurrences of ``token`` in ``text`` begin
    (0 when there are fewer): scanning from there reads at most ``count``
    candidates. Linear: one backward pass over that tail."""
    end = len(text)
    for _ in range(count):
        i = text.rfind(token, 0, end)
        if i < 0:
            return 0
        end = i
    return end


def _skip_ws(text: str, i: int) -> int:
    match = _WS.match(text, i)
    return match.end() if match else i


def _decode(text: str, i: int) -> tuple[Any, int] | None:
    """JSON value starting at ``text[i]`` (after blanks), or None."""
    try:
        return _JSON.raw_decode(text, _skip_ws(text, i))
    except (ValueError, RecursionError):
        return None


def _as_args(value: Any) -> dict[str, Any]:
    if isinstance(value, str):  # arguments sent as a JSON string
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return {}
    return value if isinstance(value, dict) else {}


def _from_object(obj: Any, fmt: str) -> NativeCall | None:
    """``{"name": ..., "arguments"|"parameters": ...}`` (or OpenAI's nesting)."""
    if not isinstance(obj, dict):
        return None
    if "name" not in obj and isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    args = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    return NativeCall(name.strip(), _as_args(args), fmt)


def _from_json_text(text: str, start: int, fmt: str) -> list[NativeCall]:
    """Calls in one JSON object/array at ``start``; name only if it is broken."""
    decoded = _decode(text, start)
    if decoded is None:
        match = _NAME_FIELD.search(text, start)
        return [NativeCall(match.group(1).strip(), {}, fmt)] if match else []
    items = decoded[0] if isinstance(decoded[0], list) else [decoded[0]]
    return [c for c in (_from_object(item, fmt) for item in items) if c is not None]


def _strip_block(text: str, open_tag: str, close_tag: str) -> str:
    first_close, first_open = text.find(close_tag), text.find(open_tag)
    if first_close >= 0 and (first_open < 0 or first_close < first_open):
        # Opened in the prompt: everything up to the last orphan close is reasoning.
        cut = text.rfind(close_tag, 0, first_open if first_open >= 0 else len(text))
        text = text[cut + len(close_tag):]
    if open_tag not in text:
        return text
    parts: list[str] = []
    pos = 0
    while True:
        o = text.find(open_tag, pos)
        if o < 0:
            parts.append(text[pos:])
            break
        parts.append(text[pos:o])
        c = text.find(close_tag, o + len(open_tag))
        if c < 0:  # unterminated: still thinking when generation stopped
            break
        pos = c + len(close_tag)
    return "".join(parts)


def _strip_noise(text: str) -> str:
    for open_tag, close_tag in _THINK_TAGS:
        if close_tag in text or open_tag in text:
            text = _strip_block(text, open_tag, close_tag)
    text = text.rstrip()
    for _ in range(_MAX_TRAILING_SPECIALS):
        special = next((t for t in _TRAILING_SPECIALS if text.endswith(t)), None)
        if special is None:
            break
        text = text[: -len(special)].rstrip()
    return text


def _harmony_field(header: str, key: str) -> str:
    k = header.find(key)
    match = _HARMONY_FIELD.match(header, k + len(key)) if k >= 0 else None
    return match.group() if match else ""


def _harmony(text: str) -> tuple[list[NativeCall], str]:
    """gpt-oss messages: calls to ``functions.*`` (or built-ins), visible text."""
    ends = [(_Finder(text, token), len(token)) for token in _HARMONY_ENDS]
    calls: list[NativeCall] = []
    visible: list[str] = []
    pos = _from_last(text, _HARMONY_MESSAGE, MAX_CALL_CANDIDATES)
    if pos > 0:
        # Earlier messages are not read: the first one read has its header
        # after the last end token before it, as when all are read.
        ends_before = ((text.rfind(token, 0, pos), len(token)) for token in _HARMONY_ENDS)
        pos = max((i + n for i, n in ends_before if i >= 0), default=0)
    while True:
        m = text.find(_HARMONY_MESSAGE, pos)
        if m < 0:
            break
        header, body_start = text[pos:m], m + len(_HARMONY_MESSAGE)
        end, end_len = min((f.find(body_start), n) for f, n in ends)
        body = text[body_start:end]
        pos = min(end + end_len, len(text))
        recipient = _harmony_field(header, "to=")
        channel = _harmony_field(header, "<|channel|>")
        if recipient.startswith("functions."):
            recipient = recipient[len("functions."):]
        elif recipient in _HARMONY_ROLES:
            recipient = ""
        if recipient:
            decoded = _decode(body, 0)
            calls.append(NativeCall(recipient, _as_args(decoded and decoded[0]), "harmony"))
        elif channel != "analysis":
            visible.append(body)
    return calls, "\n".join(visible)


def _mistral(text: str) -> list[NativeCall]:
    calls: list[NativeCall] = []
    for segment in text.split("[TOOL_CALLS]")[1:][-MAX_CALL_CANDIDATES:]:
        i = _skip_ws(segment, 0)
        if i >= len(segment):
            continue
        if segment[i] in "[{":  # pre-v11: a JSON list (or object) of calls
            calls.extend(_from_json_text(segment, i, "mistral"))
            continue
        # v11+: NAME[ARGS]{...}, NAME[CALL_ID]id[ARGS]{...} or NAME{...}
        marks = [segment.find(t, i) for t in ("[ARGS]", "[CALL_ID]", "{")]
        name_end = min([p for p in marks if p >= 0], default=len(segment))
        name = segment[i:name_end].strip()
        if not _TOOL_NAME.fullmatch(name):
            continue
        start = marks[0] + len("[ARGS]") if marks[0] >= 0 else marks[2]
        decoded = _decode(segment, start) if start >= 0 else None
        calls.append(NativeCall(name, _as_args(decoded and decoded[0]), "mistral"))
    return calls


def _xml_items(
    region: str, open_tag: str, close_tag: str, last: int | None = None
) -> list[tuple[str, str]]:
    """``open_tag KEY>VALUE`` pairs; a value ends at ``close_tag``, the next
    ``open_tag`` or the end of ``region`` (truncated generations count).
    With ``last``, only the pairs of the last ``last`` open tags."""
    items: list[tuple[str, str]] = []
    closes = _Finder(region, close_tag)
    pos = _from_last(region, open_tag, last) if last is not None else 0
    while True:
        o = region.find(open_tag, pos)
        if o < 0:
            return items
        key_start = o + len(open_tag)
        gt = region.find(">", key_start, key_start + 256)
        if gt < 0:
            pos = key_start
            continue
        nxt = region.find(open_tag, gt)
        end = min(closes.find(gt), nxt if nxt >= 0 else len(region))
        items.append((region[key_start:gt].strip(), region[gt + 1:end]))
        pos = end


def _trim_newlines(value: str) -> str:
    """Drop the one newline the Qwen3 template puts on each side of a value."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _qwen3_xml(region: str) -> list[NativeCall]:
    calls: list[NativeCall] = []
    for name, body in _xml_items(region, "<function=", "</function>", MAX_CALL_CANDIDATES):
        if name:
            items = _xml_items(body, "<parameter=", "</parameter>")
            params: dict[str, Any] = {k: _trim_newlines(v) for k, v in items if k}
            calls.append(NativeCall(name, params, "qwen3_xml"))
    return calls


def _tagged_blocks(text: str, open_tag: str, close_tag: str) -> Iterator[tuple[int, str]]:
    """``(offset of open_tag, body)`` of the last ``MAX_CALL_CANDIDATES``
    ``open_tag`` blocks, in order: a body runs to its ``close_tag``, the next
    ``open_tag`` or the end of the text (an unterminated block, as a stop
    string leaves it). Linear: each tag is found once."""
    closes = _Finder(text, close_tag)
    pos = _from_last(text, open_tag, MAX_CALL_CANDIDATES)
    while True:
        o = text.find(open_tag, pos)
        if o < 0:
            return
        start = o + len(open_tag)
        nxt = text.find(open_tag, start)
        close = closes.find(start)
        end = min(close, nxt if nxt >= 0 else len(text))
        yield o, text[start:end]
        pos = end + (len(close_tag) if end == close < len(text) else 0)


def _tool_call_tags(text: str) -> list[NativeCall]:
    """``<tool_call>`` blocks holding Hermes JSON or Qwen3 XML."""
    if "<tool_call>" not in text:
        return _qwen3_xml(text) if "<function=" in text else []
    calls: list[NativeCall] = []
    for _, body in _tagged_blocks(text, "<tool_call>", "</tool_call>"):
        if "<function=" in body:
            calls.extend(_qwen3_xml(body))
        else:
            brace = body.find("{")
            if brace >= 0:
                calls.extend(_from_json_text(body, brace, "hermes"))
    return calls


def _llama3_json(text: str) -> list[NativeCall]:
    tag = text.find("<|python_tag|>")
    i = tag + len("<|python_tag|>") if tag >= 0 else _skip_ws(text, 0)
    if not text.startswith("{", _skip_ws(text, i)):
        return []
    calls: list[NativeCall] = []
    while len(calls) < MAX_CALL_CANDIDATES:
        i = _skip_ws(text, i)
        if not text.startswith("{", i):
            break
        decoded = _decode(text, i)
        if decoded is None:
            if not calls and tag >= 0:  # broken JSON after the tag: keep the name
                calls.extend(_from_json_text(text, i, "llama3_json"))
            break
        obj, i = decoded
        if not isinstance(obj, dict) or ("arguments" not in obj and "parameters" not in obj):
            break
        call = _from_object(obj, "llama3_json")
        if call is None:
            break
        calls.append(call)
        i = _skip_ws(text, i)
        if text.startswith(";", i):
            i += 1
    return calls


def _fences(text: str) -> list[NativeCall]:
    """Fenced shell blocks (format ``fence``) and ``py``/``python`` blocks
    (format ``code``), in order; an unterminated last block counts."""
    calls: list[NativeCall] = []
    pos = 0
    while True:
        o = text.find("```", pos)
        if o < 0:
            return calls
        newline = text.find("\n", o + 3)
        if newline < 0:
            return calls
        info = text[o + 3:newline].strip().lower()
        close = text.find("```", newline + 1)
        end = close if close >= 0 else len(text)
        if info in _FENCE_LANGS:
            command = text[newline + 1:end].strip()
            if command:
                calls.append(NativeCall("bash", {"command": command}, "fence"))
        elif info in _CODE_LANGS:
            code = text[newline + 1:end].strip()
            if code:
                calls.append(NativeCall(CODE_TOOL, {"code": code}, "code"))
        if close < 0:
            return calls
        pos = close + 3


def _opens_code_block(text: str, tag_start: int, tag_end: int) -> bool:
    """Does the ``<code>`` tag at ``text[tag_start:tag_end]`` open a code
    action? smolagents puts it on a line of its own; a tag inside a sentence
    ("use <code>foo()</code>") is HTML in prose. Reads at most
    ``_CODE_TAG_REACH`` characters each side."""
    before = text[max(0, tag_start - _CODE_TAG_REACH):tag_start].rstrip(" \t")
    if before.endswith("\n") or (not before and tag_start <= _CODE_TAG_REACH):
        return True
    after = text[tag_end:tag_end + _CODE_TAG_REACH].lstrip(" \t")
    return after.startswith(("\n", "\r")) or not after


def _code_body(body: str) -> str:
    """A ``<code>`` block's code, stripped, without a fence the model put
    inside the tags (``<code>\n```python ... ```\n</code>``)."""
    body = body.strip()
    if body.startswith("```"):
        newline = body.find("\n")
        body = body[newline + 1:] if newline >= 0 else ""
        if body.rstrip().endswith("```"):
            body = body.rstrip()[:-3]
        body = body.strip()
    return body


def _code_tags(text: str) -> list[NativeCall]:
    """smolagents 1.20+ code actions: ``<code>`` to ``</code>``, the next
    ``<code>`` or the end of the text (generation stops at ``</code>``, a
    stop string, so the last block is usually unterminated). Of the last
    ``MAX_CALL_CANDIDATES`` tags, in order."""
    calls: list[NativeCall] = []
    for o, body in _tagged_blocks(text, "<code>", "</code>"):
        if _opens_code_block(text, o, o + len("<code>")):
            code = _code_body(body)
            if code:
                calls.append(NativeCall(CODE_TOOL, {"code": code}, "code"))
    return calls


def _code_json(text: str) -> list[NativeCall]:
    """smolagents' structured-output code action: the reply is one JSON
    object ``{"thought": ..., "code": ...}``."""
    i = _skip_ws(text, 0)
    if not text.startswith("{", i):
        return []
    decoded = _decode(text, i)
    obj = decoded[0] if decoded is not None else None
    if not isinstance(obj, dict) or "thought" not in obj:
        return []
    code = obj.get("code")
    if not isinstance(code, str) or not code.strip():
        return []
    return [NativeCall(CODE_TOOL, {"code": code.strip()}, "code")]


def _extract(text: str, max_chars: int) -> list[NativeCall]:
    if not isinstance(text, str) or not text or max_chars <= 0:
        return []
    text = _strip_noise(text[-max_chars:])
    if _HARMONY_MESSAGE in text:
        calls, text = _harmony(text)
        if calls:
            return calls
    if "[TOOL_CALLS]" in text:
        calls = _mistral(text)
        if calls:
            return calls
    if "<tool_call>" in text or "<function=" in text:
        calls = _tool_call_tags(text)
        if calls:
            return calls
    calls = _llama3_json(text) or _code_json(text)
    if calls:
        return calls
    if "<code>" in text:
        calls = _code_tags(text)
        if calls:
            return calls
    return _fences(text)


def extract_native_calls(text: str, max_chars: int = 65536) -> list[NativeCall]:
    """The tool calls in a raw reply, in order; ``[]`` when there are none.

    Only the last ``max_chars`` characters are read, and of a format that
    marks calls one by one only the last ``MAX_CALL_CANDIDATES`` markers
    (of a Llama-3 JSON sequence its first ``MAX_CALL_CANDIDATES`` calls), so
    the last call of any real reply is found. The first structured format
    found wins (Harmony, Mistral, ``<tool_call>``/``<function=``, Llama-3
    JSON, smolagents' JSON code action), then ``<code>`` blocks; fenced
    shell and code blocks count only when none is present. Time is linear
    in the characters read.
    """
    try:
        return _extract(text, max_chars)
    except Exception:  # best effort: model text must never break the scheduler
        return []


def _is_bash(name: str) -> bool:
    name = name.strip().lower()
    return name.removeprefix("functions.") in BASH_TOOL_NAMES


def _argv_command(argv: list[Any]) -> str | None:
    """The command line of an argv list (Codex's ``shell`` tool).

    ``[SHELL, [options], -c|-lc|..., SCRIPT, ...]`` -> ``SCRIPT`` (what the
    shell runs);
    ``["apply_patch", PATCH]`` -> ``"apply_patch"`` (the patch is data: its
    lines would read as commands); any other list -> its items joined as a
    shell would quote them. None when an item is not a string or the list
    is empty. Reads at most ``_MAX_ARGV_ITEMS`` items.
    """
    items = argv[:_MAX_ARGV_ITEMS]
    if not items or not all(isinstance(item, str) for item in items):
        return None
    program = items[0].rsplit("/", 1)[-1]
    if program in _SHELLS:
        # Options up to the one that carries "c" (-c, -lc, -ec, "-l -c");
        # long ones (--login, --noprofile) never do.
        for i in range(1, len(items) - 1):
            option = items[i]
            if not option.startswith("-"):
                break
            if not option.startswith("--") and "c" in option:
                return items[i + 1]
    if program in ("apply_patch", "applypatch"):
        return program
    return shlex.join(items)


def command_of(call: NativeCall) -> str | None:
    """The shell command of a bash-like call; None for other tools or no
    command. A command given as an argv list (Codex) is turned into the
    command line it runs (``_argv_command``)."""
    if not _is_bash(call.name):
        return None
    for key in _COMMAND_ARGS:
        value = call.arguments.get(key)
        if isinstance(value, list):
            value = _argv_command(value)
        if isinstance(value, str) and value.strip():
            return value
    return None


def tool_key_of(call: NativeCall) -> str:
    """History key of a non-bash call (``"str_replace_editor view"``); "" for bash."""
    if _is_bash(call.name):
        return ""
    name = call.name.strip()
    for key in _ACTION_ARGS:
        value = call.arguments.get(key)
        if isinstance(value, str) and _ACTION.fullmatch(value.strip()):
            return f"{name} {value.strip()}"
    return name
