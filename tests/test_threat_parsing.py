"""Threats to other clients through reply parsing (issue "No client can hurt
another", findings 3 and 4).

A model's reply is attacker-controlled through its prompt, and the plugin
parses the reply of every finished turn on the EngineCore thread, which
every other client's requests wait on. A client's ``tool_command`` hint is
parsed there too and its parsed form kept per job. The victims are the
other clients: their outcome is that any reply parses in linear, bounded
time (about a millisecond, under 10 ms on a slow 2-core EPYC) and any hint
costs at most a few KB per job.

Time checks never race a fixed wall-clock budget: every bound is relative
to a baseline measured on the same machine in the same test (a benign reply
of the same length; the same attack at a quarter of the length), with a
small absolute margin for timer noise, and takes the best of a few runs.
The absolute figures are printed (``pytest -s``).
"""

from __future__ import annotations

import random
import re
import sys
import time
import tracemalloc
from collections.abc import Callable

import pytest

from vllm_continuum_plugin.estimators.code_actions import called_functions
from vllm_continuum_plugin.estimators.native_calls import MAX_CALL_CANDIDATES, extract_native_calls
from vllm_continuum_plugin.estimators.parser import (
    MAX_PARSED_CHARS,
    MAX_REPLY_CHARS,
    MAX_SIMPLE_COMMANDS,
    ToolCall,
    extract_tool_call,
    parsed_prefix,
    shell_call,
    split_commands,
    strip_thinking,
)
from vllm_continuum_plugin.estimators.reply_scan import last_shell_block
from vllm_continuum_plugin.metadata import MAX_TOOL_COMMAND_CHARS

SMALL = 16 * 1024
BIG = 64 * 1024
REPEATS = 5
# Linear growth from 16k to 64k characters is 4x, quadratic 16x; 8x leaves
# room for cache effects and noise while still failing any quadratic scan.
MAX_GROWTH = 8.0
# An attack may cost this many times a benign reply of the same length:
# linear scans do up to ~15x more per character on a reply of nothing but
# markers ("\n```" x n: a block every 4 characters) than on markdown. The
# quadratic scans this guards against cost 200-5,000x.
MAX_VS_BENIGN = 40.0
# Absolute slack for timer resolution and scheduling noise on a busy host.
MARGIN_S = 0.002
# Bound on the parsed form of one call, kept per job (``job.last_call``).
MAX_CALL_BYTES = 8 * 1024


# --------------------------------------------------------------------------
# Helpers


def _best_seconds(parse: Callable[[str], object], *texts: str, repeats: int = REPEATS) -> list[float]:
    """Best of ``repeats`` runs of ``parse(text)`` for each of ``texts``
    (perf_counter seconds). Runs are interleaved, so that a burst of load
    from other processes slows all texts alike rather than one."""
    best = [float("inf")] * len(texts)
    for _ in range(repeats):
        for i, text in enumerate(texts):
            start = time.perf_counter()
            parse(text)
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def _repeat(unit: str, n: int) -> str:
    """``unit`` repeated to at most ``n`` characters (whole units only, so
    the end of the text is not a cut marker)."""
    return unit * (n // len(unit))


def _benign_reply(n: int) -> str:
    """A realistic, markdown-heavy reply of ``n`` characters: reasoning with
    short code blocks and <think> asides, then the shell block the agent
    wants run. (Where the parsed tail of a longer one begins inside a code
    block, its fences pair up the other way round: the baseline's answer is
    checked at ``SMALL``, which is parsed whole.)"""
    tail = "THOUGHT: now run the tests.\n\n```bash\npython -m pytest -q tests/\n```"
    unit = (
        "<think>first(xs) fails on [].</think>The helper returns None on an "
        "empty list:\n```python\nreturn xs[0] if xs else None\n```\n"
    )
    filler = _repeat(unit, n - len(tail))
    return filler + " " * (n - len(tail) - len(filler)) + tail


def _in_tail(attack: Callable[[int], str], n: int) -> str:
    """``attack`` sized to the part of a reply that is parsed (its last
    ``MAX_REPLY_CHARS``), after benign filler up to ``n`` characters: a
    non-periodic attack ("```" then blanks) must begin inside that part."""
    text = attack(MAX_REPLY_CHARS)
    return " " * (n - len(text)) + text  # blanks: a Llama-3 call may follow


def _key(call: ToolCall | None) -> str | None:
    return call.tool_key if call is not None else None


# The scanners a reply goes through, without the tail bound of
# extract_tool_call, so that their own growth is measured.
SCANNERS: dict[str, Callable[[str], object]] = {
    "strip_thinking": strip_thinking,
    "last_shell_block": last_shell_block,
    "extract_native_calls": lambda text: extract_native_calls(text, max_chars=len(text)),
    # Reads a code action's code (a whole reply here, not just code).
    "called_functions": called_functions,
}


def _check_attack(name: str, attack: Callable[[int], str], expected_key: str | None) -> None:
    """The victim's outcome for a reply built by ``attack(n)``: parse time
    linear in the reply and within a constant factor of a benign reply's;
    and the right answer (``expected_key``) where the whole attack is in the
    parsed tail (of ``attack(BIG)`` only its last ``MAX_REPLY_CHARS`` are
    read: whatever they hold, nothing raises)."""
    assert SMALL == MAX_REPLY_CHARS
    assert _key(extract_tool_call(attack(SMALL))) == expected_key
    assert _key(extract_tool_call(_in_tail(attack, BIG))) == expected_key
    assert isinstance(extract_tool_call(attack(BIG)), (ToolCall, type(None)))

    def extract_is_linear(repeats: int) -> list[str]:
        benign, *attacked = _best_seconds(
            extract_tool_call, _benign_reply(BIG), attack(BIG), _in_tail(attack, BIG), repeats=repeats
        )
        failures = []
        for label, seconds in zip(("64k", "64k, attack in the parsed tail"), attacked):
            print(f"\n{name}: extract_tool_call {label}: {seconds * 1e3:.3f} ms (benign {benign * 1e3:.3f} ms)")
            if seconds > MAX_VS_BENIGN * benign + MARGIN_S:
                failures.append(f"{label}: {seconds:.6f} s vs benign {benign:.6f} s")
        return failures

    def scanner_is_linear(scanner_name: str, scan: Callable[[str], object], repeats: int) -> list[str]:
        small, big, benign = _best_seconds(scan, attack(SMALL), attack(BIG), _benign_reply(BIG), repeats=repeats)
        print(
            f"{name}: {scanner_name}: 16k {small * 1e3:.3f} ms, 64k {big * 1e3:.3f} ms "
            f"(x{big / max(small, 1e-9):.1f}; benign 64k {benign * 1e3:.3f} ms)"
        )
        failures = []
        if big > MAX_GROWTH * small + MARGIN_S:
            failures.append(f"{scanner_name}: 64k {big:.6f} s vs 16k {small:.6f} s")
        if big > MAX_VS_BENIGN * benign + MARGIN_S:
            failures.append(f"{scanner_name}: 64k {big:.6f} s vs benign {benign:.6f} s")
        return failures

    _linear_or_fail(name, extract_is_linear)
    for scanner_name, scan in SCANNERS.items():
        _linear_or_fail(name, lambda repeats, n=scanner_name, f=scan: scanner_is_linear(n, f, repeats))


def _linear_or_fail(name: str, measure: Callable[[int], list[str]]) -> None:
    """Pass when one measurement meets the bounds. A burst of load from
    other processes can spoil a best-of-5 on a busy 2-core host; measuring
    again, with more repeats, only sharpens the minimum and never loosens a
    bound, so a quadratic scan (200-5,000x over the bound) still fails."""
    failures: list[str] = []
    for repeats in (REPEATS, 4 * REPEATS, 16 * REPEATS):
        failures = measure(repeats)
        if not failures:
            return
    raise AssertionError(f"{name}: not linear: {failures}")


# --------------------------------------------------------------------------
# Finding 3: parse time on the engine thread


def test_a_benign_reply_is_parsed_as_before() -> None:
    # The baseline of every time check below parses to the command it ends with.
    call = extract_tool_call(_benign_reply(SMALL))
    assert call is not None and call.command == "python -m pytest -q tests/"
    assert call.tool_key == "python -m pytest"


def test_an_unclosed_fence_of_64k_spaces_parses_in_linear_time() -> None:
    # "```[ \t]*(LANG)?[ \t]*\n" backtracked quadratically: 0.3 s at 16k, 5 s at 64k.
    _check_attack("``` + spaces", lambda n: "```" + " " * (n - 3), None)


def test_an_unclosed_fence_of_64k_tabs_parses_in_linear_time() -> None:
    _check_attack("``` + tabs", lambda n: "```" + "\t" * (n - 3), None)


def test_a_tagged_fence_then_64k_blanks_without_a_newline_parses_in_linear_time() -> None:
    _check_attack("```bash + blanks", lambda n: "```bash" + " \t" * ((n - 7) // 2), None)


def test_an_unclosed_think_tag_before_64k_characters_parses_in_linear_time() -> None:
    _check_attack("<think> + 64k chars", lambda n: "<think>" + "a" * (n - 7), None)


def test_a_reply_of_64k_repeated_think_tags_parses_in_linear_time() -> None:
    # "<think>.*?</think>" rescanned to the end from every open tag: 3 s at 64k.
    _check_attack("<think> x n", lambda n: _repeat("<think>", n), None)
    _check_attack("<THINK>x x n", lambda n: _repeat("<THINK>x", n), None)


def test_a_reply_of_64k_alternating_think_tags_parses_in_linear_time() -> None:
    _check_attack("</think><think> x n", lambda n: _repeat("</think><think>", n), None)
    _check_attack("[THINK] x n", lambda n: _repeat("[THINK]", n), None)


def test_a_reply_of_64k_tabs_parses_in_linear_time() -> None:
    _check_attack("tabs", lambda n: "\t" * n, None)
    _check_attack("tabs then x", lambda n: "\t" * (n - 1) + "x", None)


@pytest.mark.parametrize(
    "unit",
    ["```", "```\n", "```bash\n", "```bash\n```", "``` x", "\n```", "````bash\n", "```x\n", "```sh \t\n \t"],
)
def test_a_reply_of_repeated_fence_openers_parses_in_linear_time(unit: str) -> None:
    _check_attack(f"{unit!r} x n", lambda n: _repeat(unit, n), None)


def test_a_reply_of_repeated_tool_call_tags_parses_in_linear_time() -> None:
    _check_attack("<tool_call> x n", lambda n: _repeat("<tool_call>", n), None)
    _check_attack("<tool_call>{ x n", lambda n: _repeat("<tool_call>{", n), None)
    _check_attack("<tool_call>{\"name\" + blanks", lambda n: '<tool_call>{"name"' + " " * (n - 18), None)


def test_a_reply_of_repeated_function_tags_parses_in_linear_time() -> None:
    # Qwen3-Coder XML: every tag is a call of tool "a"; the last one wins.
    _check_attack("<function=a> x n", lambda n: _repeat("<function=a>", n), "a")
    _check_attack("<parameter= x n", lambda n: "<function=a>" + _repeat("<parameter=b>", n - 12), "a")


def test_a_reply_of_repeated_mistral_markers_parses_in_linear_time() -> None:
    _check_attack("[TOOL_CALLS] x n", lambda n: _repeat("[TOOL_CALLS]", n), None)
    _check_attack("[TOOL_CALLS]a{ x n", lambda n: _repeat("[TOOL_CALLS]a{", n), "a")
    _check_attack("[TOOL_CALLS]a[ARGS] x n", lambda n: _repeat("[TOOL_CALLS]a[ARGS]", n), "a")


def test_a_reply_of_repeated_harmony_messages_parses_in_linear_time() -> None:
    _check_attack("<|message|> x n", lambda n: _repeat("<|message|>", n), None)
    _check_attack(
        "to=functions.a<|message|><|call|> x n",
        lambda n: _repeat("to=functions.a<|message|><|call|>", n),
        "a",
    )


def test_a_reply_of_repeated_json_openers_parses_in_linear_time() -> None:
    _check_attack("{ x n", lambda n: "{" * n, None)
    _check_attack('{"a": x n', lambda n: _repeat('{"a":', n), None)
    _check_attack("<|python_tag|>[ x n", lambda n: "<|python_tag|>" + "[" * (n - 14), None)


def test_a_reply_of_repeated_llama3_calls_parses_in_linear_time() -> None:
    _check_attack("llama3 calls x n", lambda n: _repeat('{"name": "a", "parameters": {}}; ', n), "a")


def test_a_reply_of_repeated_end_of_turn_tokens_parses_in_linear_time() -> None:
    # Each stripped token used to copy the reply: quadratic in their number.
    _check_attack("</s> x n", lambda n: _repeat("</s>", n), None)
    _check_attack("<|im_end|> x n", lambda n: _repeat("<|im_end|> ", n), None)


def test_a_reply_of_repeated_code_tags_parses_in_linear_time() -> None:
    # A <code> tag opens a code action only on a line of its own (or before
    # one): these are prose, and still linear.
    _check_attack("<code> x n", lambda n: _repeat("<code>", n), None)
    _check_attack("<code>``` x n", lambda n: _repeat("<code>```", n), None)
    # On lines of their own: empty blocks, then blocks of one call each
    # (only the last MAX_CALL_CANDIDATES tags are read).
    _check_attack("\\n<code> x n", lambda n: _repeat("\n<code>", n), None)
    _check_attack("\\n<code>\\nx( x n", lambda n: _repeat("\n<code>\nx(", n), "x")
    _check_attack("```py\\n x n", lambda n: _repeat("```py\n", n), None)


@pytest.mark.parametrize(
    "name, attack, key",
    [
        # One call, repeated: one name kept.
        ("a( x n", lambda n: "<code>\n" + _repeat("a(", n - 7), "a"),
        # One identifier of the whole reply, without and with a call.
        ("a x n", lambda n: "<code>\n" + "a" * (n - 7), "<code>"),
        ("a x n (", lambda n: "<code>\n" + "a" * (n - 8) + "(", "a" * 64),
        # Identifiers each followed by a run of blanks and no "(".
        ("a + blanks x n", lambda n: "<code>\n" + _repeat("a" + " \t" * 50, n - 7), "<code>"),
        # Thousands of distinct tools: 16 kept, the key cut to 128 characters.
        ("f0(); f1(); ...", lambda n: "<code>\n" + "".join(f"f{i}();" for i in range(n // 7))[: n - 7],
         None),
        # Unterminated strings, escapes and quotes: nothing is a call.
        ('""" + ""x x n', lambda n: '<code>\n"""' + _repeat('""x', n - 10), "<code>"),
        ("'\\ x n", lambda n: "<code>\n'" + _repeat("\\", n - 8), "<code>"),
        ('" x n', lambda n: "<code>\n" + _repeat('"', n - 7), "<code>"),
        ("# x n", lambda n: "<code>\n" + _repeat("#a(", n - 7), "<code>"),
        ("def x n", lambda n: "<code>\n" + _repeat("def ", n - 7), "<code>"),
        ("@a( x n", lambda n: "<code>\n" + _repeat("@a(", n - 7), "<code>"),
        # The same through the legacy fence and the structured-output JSON.
        ("```py a( x n", lambda n: "```py\n" + _repeat("a(", n - 6), "a"),
        ('{"thought", "code": a( x n}', lambda n: '{"thought": "", "code": "' + _repeat("a(", n - 27) + '"}', "a"),
    ],
)
def test_a_code_action_built_to_be_slow_parses_in_linear_time(
    name: str, attack: Callable[[int], str], key: str | None
) -> None:
    if key is None:  # many distinct tools: whatever the key, it is bounded
        call = extract_tool_call(attack(SMALL))
        assert call is not None and len(call.functions) <= 16 and len(call.tool_key) <= 128
        key = call.tool_key
    _check_attack(name, attack, key)


@pytest.mark.parametrize(
    "unit, key",
    [
        # Every format's opening marker at once; Mistral's "[TOOL_CALLS]a{" wins.
        ("<think></think>```\n<tool_call>{[TOOL_CALLS]a{<|message|><function=a>"
         '<parameter=b>{"a":</s>\n```bash\n<code>\t ', "a"),
        ("```\n</think><think>\n```bash\n```sh \t\n```x\n", None),
        ('<tool_call>{"name"  <|message|><|end|>[THINK]```\n[/THINK]\n```', None),
    ],
)
def test_a_reply_mixing_the_markers_of_every_format_parses_in_linear_time(unit: str, key: str | None) -> None:
    _check_attack(f"mixed {unit[:24]!r}", lambda n: _repeat(unit, n), key)


def test_a_fenced_command_of_thousands_of_simple_commands_parses_in_linear_time() -> None:
    # The command is parsed from its first MAX_PARSED_CHARS characters and
    # keyed from at most MAX_SIMPLE_COMMANDS simple commands.
    _check_attack("```bash a;a;... ", lambda n: "```bash\n" + _repeat("a;", n - 8), "a")
    _check_attack("```bash cd a;...", lambda n: "```bash\n" + _repeat("cd a;", n - 8), "<no-tool>")
    call = extract_tool_call("```bash\n" + _repeat("a;", SMALL - 8))
    assert call is not None and len(call.commands) == MAX_SIMPLE_COMMANDS


def test_split_commands_of_a_64k_command_line_is_linear() -> None:
    def linear(unit: str, repeats: int) -> list[str]:
        small, big = _best_seconds(split_commands, _repeat(unit, SMALL), _repeat(unit, BIG), repeats=repeats)
        print(f"\nsplit_commands {unit!r} x n: 16k {small * 1e3:.3f} ms, 64k {big * 1e3:.3f} ms")
        return [f"{unit!r}: 64k {big:.6f} s vs 16k {small:.6f} s"] if big > MAX_GROWTH * small + MARGIN_S else []

    for unit in ("a;", "a|", "a\n", " " * 64 + "&&", "||" + " " * 64):
        _linear_or_fail("split_commands", lambda repeats, u=unit: linear(u, repeats))


def _hermes(i: int) -> str:
    return f'<tool_call>\n{{"name": "bash", "arguments": {{"command": "echo {i}"}}}}\n</tool_call>'


def _qwen3(i: int) -> str:
    return (
        f"<tool_call>\n<function=bash>\n<parameter=command>\necho {i}\n"
        "</parameter>\n</function>\n</tool_call>"
    )


def _mistral(i: int) -> str:
    return f'[TOOL_CALLS]bash[ARGS]{{"command": "echo {i}"}}'


def _harmony(i: int) -> str:
    return (
        f"<|start|>assistant<|channel|>analysis<|message|>step {i}<|end|>"
        "<|start|>assistant to=functions.bash<|channel|>commentary json"
        f'<|message|>{{"command": "echo {i}"}}<|call|>'
    )


def _llama3(i: int) -> str:
    return f'{{"name": "bash", "parameters": {{"command": "echo {i}"}}}}; '


@pytest.mark.parametrize(
    "call, last",
    [(_hermes, 999), (_qwen3, 999), (_mistral, 999), (_harmony, 999),
     # A Llama-3 reply is one JSON sequence, decoded from its start.
     (_llama3, MAX_CALL_CANDIDATES - 1)],
)
def test_a_reply_of_a_thousand_parallel_tool_calls_yields_the_last_one_read(
    call: Callable[[int], str], last: int
) -> None:
    # Only the last MAX_CALL_CANDIDATES markers of a format are read (of
    # Harmony's, half are analysis messages here): the last call, the one
    # the scheduler uses, is among them.
    reply = "".join(call(i) for i in range(1000))
    found = extract_native_calls(reply, max_chars=len(reply))
    assert 0 < len(found) <= MAX_CALL_CANDIDATES
    assert found[-1].arguments == {"command": f"echo {last}"}
    (seconds,) = _best_seconds(lambda text: extract_native_calls(text, max_chars=len(text)), reply)
    print(f"\n1,000 calls of {call.__name__}, {len(reply)} characters: {seconds * 1e3:.3f} ms")
    if call is not _llama3:  # (cut to its tail, a Llama-3 sequence is no call)
        assert extract_tool_call(reply).command == f"echo {last}"


def test_a_call_before_the_parsed_tail_is_not_found_and_nothing_raises() -> None:
    # MAX_REPLY_CHARS: a call further from the end of the reply than that is
    # not found (the turn is treated as having no tool call).
    call = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    assert extract_tool_call(call + "x" * (MAX_REPLY_CHARS - len(call))).tool_key == "ls"
    assert extract_tool_call(call + "x" * MAX_REPLY_CHARS) is None
    assert extract_tool_call("```bash\nls\n```" + "x" * MAX_REPLY_CHARS) is None


# --------------------------------------------------------------------------
# The linear scanners find what the regexes they replace found


_OLD_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_OLD_FENCE = re.compile(
    r"```[ \t]*(bash|sh|shell|console|zsh|terminal)?[ \t]*\n(.*?)(?:\n?```|\Z)",
    re.DOTALL | re.IGNORECASE,
)


def _old_strip_thinking(text: str) -> str:
    text = _OLD_THINK_BLOCK.sub("", text)
    lower = text.lower()
    close = lower.rfind("</think>")
    if close != -1:
        text = text[close + len("</think>"):]
        lower = text.lower()
    open_ = lower.find("<think>")
    return text[:open_] if open_ != -1 else text


def _old_last_shell_block(text: str) -> str | None:
    blocks = [m.group(2).strip() for m in _OLD_FENCE.finditer(text) if m.group(1) is not None]
    blocks = [block for block in blocks if block]
    return blocks[-1] if blocks else None


def test_linear_scanners_agree_with_the_regexes_they_replace() -> None:
    atoms = [
        "```", "`", "bash", "BASH", "sh", "shell", "console", "terminal", "python", " ", "\t",
        "\n", "\n```", "<think>", "</think>", "<THINK>", "</Think>", "<thi", "nk>", "ls", "x", "é", "😀",
    ]
    rng = random.Random(3)
    for _ in range(5000):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(0, 24)))
        assert strip_thinking(text) == _old_strip_thinking(text), text
        assert last_shell_block(text) == _old_last_shell_block(text), text
    # Except where the old code cut at positions taken from text.lower(),
    # which is longer than the text when it holds "İ".
    assert _old_strip_thinking("İ<think>x") == "İ<"
    assert strip_thinking("İ<think>x") == "İ"


# --------------------------------------------------------------------------
# Finding 4: memory per job


def _deep_size(obj: object, seen: set[int] | None = None, skip: type | tuple[type, ...] = ()) -> int:
    """Bytes of ``obj`` and everything it references (each object once),
    not counting objects of the ``skip`` types (nor what they reference)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or (skip and isinstance(obj, skip)):
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, (tuple, list)):
        size += sum(_deep_size(item, seen, skip) for item in obj)
    elif isinstance(obj, dict):
        size += sum(_deep_size(k, seen, skip) + _deep_size(v, seen, skip) for k, v in obj.items())
    elif hasattr(obj, "__dict__"):
        size += _deep_size(vars(obj), seen, skip)
    return size


def _adversarial_hints() -> dict[str, str]:
    """``tool_command`` hints of the longest accepted length, built to make
    the parsed call large: many short simple commands, leading blanks (a
    stripped piece is a copy), wide characters, long program names."""
    hints: dict[str, str] = {}
    for char in ("a", "é", "中", "😀"):
        for unit in (f"{char};", f"{char}{char};", f"{char}{char}|", f"{char}{char}\n", f" {char} {char};"):
            hints[repr(unit)] = _repeat(unit, MAX_TOOL_COMMAND_CHARS)
        hints[f"{char} x n"] = char * MAX_TOOL_COMMAND_CHARS
        hints[f"' {char}' x n"] = _repeat(" " + char, MAX_TOOL_COMMAND_CHARS)
        for pieces in (MAX_SIMPLE_COMMANDS, MAX_SIMPLE_COMMANDS + 1):
            width = len(parsed_prefix(char * MAX_PARSED_CHARS)) // pieces - 1
            hints[f"{pieces} pieces of {char}"] = ";".join([char * width] * pieces) + "x" * 4000
    return hints


def test_a_2048_character_hint_of_many_simple_commands_keeps_at_most_8_kb() -> None:
    # Before: "ab;ab;..." kept 683 simple commands (43 KB per job), "😀;😀;..."
    # 1,024 (99 KB). Now at most MAX_SIMPLE_COMMANDS pieces of at most
    # MAX_PARSED_CHARS bytes of text.
    sizes: dict[str, int] = {}
    for name, hint in _adversarial_hints().items():
        call = shell_call(parsed_prefix(hint))  # as ReplyReader parses a hint
        assert len(call.commands) <= MAX_SIMPLE_COMMANDS
        assert len(call.command) <= MAX_PARSED_CHARS and len(call.tool_key) <= 128
        sizes[name] = _deep_size(call)
    worst = max(sizes, key=sizes.__getitem__)
    print(f"\nparsed call, worst case: {sizes[worst]} bytes ({worst}); typical 'a;' x n: {sizes[repr('a;')]}")
    assert sizes[worst] <= MAX_CALL_BYTES, sizes


def test_the_memory_parsed_hints_retain_is_at_most_8_kb_per_job() -> None:
    # tracemalloc's view of the same bound: what parsing freshly received
    # hints leaves allocated while the calls are kept, one per job (the
    # hints themselves are freed). Many jobs, so that what the interpreter
    # keeps in its free lists (a few KB in all) does not count as a call's.
    jobs = 200
    worst = 0.0
    for unit in ("ab;", "😀😀;", " 中 中;"):
        hints = (f"{i}{_repeat(unit, MAX_TOOL_COMMAND_CHARS)}" for i in range(jobs))
        shell_call(parsed_prefix(next(hints)))  # first-use allocations
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            kept = [shell_call(parsed_prefix(hint)) for hint in hints]
            per_job = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
        finally:
            tracemalloc.stop()
        worst = max(worst, per_job)
    print(f"\nparsed hints, tracemalloc: {worst:.0f} bytes retained per job")
    assert worst <= MAX_CALL_BYTES


def test_a_long_chain_keeps_its_head_and_tail_and_keys_on_its_last_command() -> None:
    chain = "cd /repo && " + "echo step; " * 150 + "python -m pytest -q"
    assert len(chain) <= MAX_PARSED_CHARS
    call = shell_call(chain)
    assert call.tool_key == "python -m pytest"
    assert call.commands[0] == "cd /repo" and call.commands[-1] == "python -m pytest -q"
    assert len(call.commands) == MAX_SIMPLE_COMMANDS
    # Up to MAX_SIMPLE_COMMANDS simple commands, nothing is dropped.
    short = " && ".join(f"step{i}" for i in range(MAX_SIMPLE_COMMANDS))
    assert shell_call(short).commands == tuple(split_commands(short))


def test_wide_characters_are_parsed_to_at_most_max_parsed_chars_bytes() -> None:
    assert parsed_prefix("a" * 5000) == "a" * MAX_PARSED_CHARS
    assert parsed_prefix("é" * 5000) == "é" * MAX_PARSED_CHARS  # Latin-1: 1 byte each
    assert len(parsed_prefix("中" * 5000)) == MAX_PARSED_CHARS // 2
    assert len(parsed_prefix("😀" * 5000)) == MAX_PARSED_CHARS // 4
    short = "git status"
    assert parsed_prefix(short) is short  # no copy: a cache key shares it
