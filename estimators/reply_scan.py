"""Scan a reply's text for reasoning and fenced shell blocks, in linear time.

The parser (``parser.extract_tool_call``) falls back to these scans when a
reply holds no native tool call. A reply is attacker-controlled through
the prompt and is scanned on the engine thread for every finished turn, so
each scan here reads every character a bounded number of times, whatever
the text: tags are found by searches that start where the last one ended,
and the fence regex has no two quantifiers that can match the same
characters (see ``_SHELL_BLOCK``). Both functions find exactly what the
regexes they replace found (``tests/test_threat_parsing.py`` checks it).
"""

from __future__ import annotations

import re

__all__ = ["last_shell_block", "strip_thinking"]

_THINK_OPEN = re.compile(re.escape("<think>"), re.IGNORECASE)
_THINK_CLOSE = re.compile(re.escape("</think>"), re.IGNORECASE)
# A fenced block: "```", blanks, an optional language, blanks, newline (an
# untagged fence opens a block too: code, not a command), then the body up
# to the next fence or the end of the text. Written so that no character is
# tried more than a bounded number of times:
# * each run of blanks is matched whole and never given back ("(?=(X*))\1"
#   is an atomic X* in Python's re: a lookahead is not re-entered); no
#   header goes on with a blank where a run stops. "[ \t]*(LANG)?[ \t]*\n"
#   has two adjacent runs that can share the blanks and backtracked
#   quadratically on a fence, blanks and no newline (0.3 s for 16k spaces);
# * "(?!`)" makes the fences inside a run of backticks fail at once (no
#   header starts with one): 1 ms instead of 10 for 64k backticks;
# * the body is "(.*?)(?:\n?```|\Z)" unrolled into greedy runs that stop
#   exactly where that lazy form does, keeping only the newline before the
#   fence (bodies are stripped). It never backtracks and always ends, so a
#   character is read by at most one body.
_SHELL_BLOCK = re.compile(
    r"```(?!`)(?=([ \t]*))\1(?:(bash|shell|sh|console|zsh|terminal)(?=([ \t]*))\3)?\n"
    r"([^`]*(?:`(?!``)[^`]*)*)(?:```|\Z)",
    re.IGNORECASE,
)


def strip_thinking(text: str) -> str:
    """Remove reasoning sections so a command quoted while thinking is not
    mistaken for the tool call.

    Removes every ``<think>...</think>`` block (each open tag to the first
    close tag after it, case-insensitively), then everything up to the last
    remaining close tag (the open tag was in the prompt), then everything
    from the first remaining open tag (generation stopped while thinking).
    Linear: each search starts where the previous one ended. (A lazy
    ``<think>.*?</think>`` regex rescans to the end of the text from every
    unclosed open tag: 3 s for a reply of 64k characters of ``<think>``.)
    Positions come from the text itself, not from ``text.lower()``, whose
    length can differ (``"İ".lower()`` is two characters).
    """
    parts: list[str] = []
    pos = 0
    while True:
        open_ = _THINK_OPEN.search(text, pos)
        close = _THINK_CLOSE.search(text, open_.end()) if open_ is not None else None
        if open_ is None or close is None:
            # No later open tag can have a close tag after it either.
            break
        parts.append(text[pos:open_.start()])
        pos = close.end()
    if parts:
        parts.append(text[pos:])
        text = "".join(parts)  # (joining may form a new tag: searched below)
    # Opening tag in the prompt (chat templates that pre-open <think>): only
    # the closing tag is in the reply, everything before it was thinking.
    last_close: re.Match[str] | None = None
    for last_close in _THINK_CLOSE.finditer(text):  # (one pass; keeps the last)
        pass
    if last_close is not None:
        text = text[last_close.end():]
    # Unterminated thinking (generation stopped while reasoning): nothing
    # after the tag is an answer.
    open_ = _THINK_OPEN.search(text)
    return text[:open_.start()] if open_ is not None else text


def last_shell_block(text: str) -> str | None:
    r"""Stripped body of the last fenced shell block whose body is not blank.

    Finds the blocks that ``finditer`` of this regex (DOTALL, IGNORECASE)
    finds, left to right, in linear time where that regex is quadratic (see
    ``_SHELL_BLOCK``)::

        ```[ \t]*(LANG)?[ \t]*\n(.*?)(?:\n?```|\Z)

    A fence whose line is not such a header opens nothing (a later fence
    may); untagged blocks pair fences up without being commands.
    """
    last: str | None = None
    for block in _SHELL_BLOCK.finditer(text):
        if block.group(2) is not None:
            body = block.group(4).strip()  # (also drops the newline before the fence)
            if body:
                last = body
    return last
