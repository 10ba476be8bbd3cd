"""The tool functions a code action calls (smolagents ``CodeAgent``).

A ``CodeAgent`` does not emit a tool call: it writes Python, and the tools
are functions that Python calls (``web_search("...")``,
``final_answer(x)``). smolagents 1.26 puts the code between ``<code>`` and
``</code>`` (and stops generation at ``</code>``, so the server sees the
block unterminated), older versions in a fenced ````` ```py ````` block;
``native_calls`` finds the block, this module reads which functions it
calls, and ``parser.code_call`` keys the call by them.

Only bare calls count: ``name(`` not preceded by a ``.`` (methods and module
functions such as ``re.findall`` are not tools), ``@`` (decorators) or a word
character; Python's keywords and builtins (``print``, ``len``, ``range``)
are not tools; neither are functions and classes the code defines itself
(``def helper(`` / ``class Row(``). Calls inside string literals and
comments are skipped, so ``final_answer("use foo() here")`` calls
``final_answer`` only.

The code is model output, attacker-controlled through the prompt, and is
read on the engine thread: one ``finditer`` of a regex whose quantifiers
never compete for the same characters (no backtracking beyond one token;
identifiers are matched atomically with the ``(?=(X))\\1`` idiom), so the
scan is linear in the code, which the caller bounds (``MAX_REPLY_CHARS``).
What is kept is bounded too: at most ``MAX_FUNCTIONS`` names (the first and
last halves, in order of first call) of at most ``MAX_FUNCTION_CHARS``
characters each.
"""

from __future__ import annotations

import builtins
import keyword
import re

__all__ = ["MAX_FUNCTIONS", "MAX_FUNCTION_CHARS", "called_functions"]

# Names kept per code action (the first and last halves, in order of first
# call: the set-up calls and the final_answer the run ends with) and the
# longest name kept: a ToolCall holds them per job.
MAX_FUNCTIONS = 16
MAX_FUNCTION_CHARS = 64

# Calls that run no tool: the language's own functions and statements.
_NOT_TOOLS = frozenset(dir(builtins)) | frozenset(keyword.kwlist) | frozenset(keyword.softkwlist)

# One token of interest per match. A match starts only at a character that
# can begin one (the first lookahead: blanks, digits and punctuation are
# skipped at the cost of one test each), then the alternatives are tried in
# this order:
#   1 ``def NAME`` / ``class NAME``: a definition (group "defined");
#   2 ``NAME`` followed by blanks and ``(``: a call (group "called").
#     Both sit behind a lookbehind that fails inside a word, after a dot or
#     an "@", so each identifier is tried once, from its start;
#   3 a comment (to the end of the line);
#   4-5 a triple-quoted string (to its close, or the end of the code when
#     generation stopped inside it). Unrolled: a quote inside is consumed
#     only when the next two characters do not close the string, so the two
#     runs never share a character and the match never fails once started;
#   6-7 a one-line string, same unrolling; a backslash takes the next
#     character (line continuations included); unterminated: ends at the
#     newline.
# String prefixes (f, r, b) are words not followed by "(", so the string
# itself is found at the quote. Cost: one match object per call, string
# and comment (~0.25 us each: 16k characters of "a(" take ~3 ms on a slow
# 2-core EPYC, prose and ordinary code ~0.4 ms).
_PY_TOKENS = re.compile(
    r"(?=[#\"'A-Za-z_])(?:"
    r"(?<![\w.@])(?:"
    r"(?:def|class)[ \t]+(?=(?P<defined>[A-Za-z_]\w*))(?P=defined)"
    r"|(?=(?P<called>[A-Za-z_]\w*))(?P=called)(?=[ \t]*\())"
    r"|#[^\n]*"
    r'|"""[^"]*(?:"(?!"")[^"]*)*(?:"""|\Z)'
    r"|'''[^']*(?:'(?!'')[^']*)*(?:'''|\Z)"
    r'|"[^"\\\n]*(?:\\[\s\S][^"\\\n]*)*"?'
    r"|'[^'\\\n]*(?:\\[\s\S][^'\\\n]*)*'?)"
)


def called_functions(code: str) -> tuple[str, ...]:
    """The tool functions ``code`` calls, in order of first call, each once.

    Invariants: no builtin, keyword or name the code defines; at most
    ``MAX_FUNCTIONS`` names (of more, the first and last
    ``MAX_FUNCTIONS // 2``), each at most ``MAX_FUNCTION_CHARS`` characters
    (longer ones cut). Linear in ``len(code)``; never raises on a ``str``.
    """
    called: dict[str, None] = {}  # insertion-ordered set
    defined: set[str] = set()
    for match in _PY_TOKENS.finditer(code):
        name = match.group("called")
        if name is not None:
            if name not in _NOT_TOOLS:
                called[name] = None
            continue
        name = match.group("defined")
        if name is not None:
            defined.add(name)
    names = [name[:MAX_FUNCTION_CHARS] for name in called if name not in defined]
    if len(names) > MAX_FUNCTIONS:
        half = MAX_FUNCTIONS // 2
        names = names[:half] + names[-(MAX_FUNCTIONS - half):]
    # Cutting long names can make two equal: keep each once.
    return tuple(dict.fromkeys(names))
