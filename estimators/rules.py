"""ContextServe's first opinion: curated definitely-fast / definitely-slow
commands.

A tool call is split into simple commands (``ToolCall.commands``); each is
normalised (``features.parse_simple_command``: wrappers such as ``sudo``,
``env``, ``time``, ``timeout N`` and ``VAR=value`` peeled off, program
basename, ``python3.11`` -> ``python``) and classified by the first rule that
matches it. The call is then

* SLOW if any simple command is definitely slow, or the ``sleep``-style
  durations add up to at least ``slow_threshold_s``;
* FAST if every simple command is definitely fast and the durations add up
  to at most ``fast_threshold_s``. TTL: the largest ``ttl_s`` of the rules
  that matched plus ``d * 1.2 + 0.05`` for a known duration ``d`` > 0; the
  predictor adds the job's measured client round trip (rules time the
  command, not the agent around it), capped at ``max_ttl_s``;
* UNCERTAIN if every command is fast or a known duration and the total lies
  between the thresholds (``sleep 5``);
* otherwise the layer abstains (None): one unknown command is enough.

A call of a tool that is not a shell is classified by its name through the
file's ``tools`` table instead (Claude Code's ``Read`` is fast, its ``Task``
sub-agent slow); a code action (smolagents) by the tool functions it calls,
with the same all-fast / any-slow logic (``web_search(...)`` is slow).
Names compare case-insensitively (``Read``, OpenCode's ``read``). A name
without a tool rule abstains, as does a code action that calls no tool.

A command containing ``$(`` or a backtick runs commands this layer cannot
see and is unknown. A ``timeout N`` wrapper bounds the command: with
``N <= fast_threshold_s`` it is FAST whatever it runs; a "slow" command under
``timeout N`` with ``N < slow_threshold_s`` is unknown.

Rules file format (JSON; the shipped defaults are
``estimators/data/default_rules.json``; ``ContextServeConfig.rules_path``
names an override file in the same format)::

    {
      "version": 1,
      "fast_ttl_s": 1.0,          # optional: TTL of a fast rule without its own
      "fast_seconds": 0.1,        # optional: point estimate of a fast rule without its own
      "replace_defaults": false,  # optional, override files only: drop the shipped rules
      "rules": [
        {"match": "ls", "class": "fast", "forbid": ["-R"]},
        {"match": "sed", "class": "fast", "require": ["-n"], "forbid": ["-i"]},
        {"match": "git status", "class": "fast", "ttl_s": 0.5},
        {"match": "python -m pytest", "class": "slow", "forbid": ["-k", "::"]},
        {"match": "sleep", "class": "duration"},
        {"match": "grep", "class": "abstain", "comment": "our repos are huge"}
      ],
      "tools": [
        {"name": "Read", "class": "fast"},
        {"name": "Task", "class": "slow", "comment": "a sub-agent: minutes"}
      ]
    }

Rule keys:

* ``match`` (required): the program, optionally followed by words that must
  come next in order; options in between that are not named are skipped, so
  ``"git status"`` matches ``git --no-pager status -s`` and
  ``"cmake --build"`` matches ``cmake --build build -j8``. A non-option word
  that differs ends the match (``git -C dir status`` does not match).
* ``class`` (required): ``fast`` | ``slow`` | ``duration`` (the sum of the
  program's positional arguments parsed as GNU ``sleep`` durations decides,
  e.g. ``sleep 0.5``; an unparsable argument makes it unknown) | ``abstain``
  (unknown: lets an override switch a shipped rule off).
* ``require`` / ``forbid`` (optional lists): the rule applies only if some /
  no argument matches one of the entries. An entry starting with ``-`` is a
  flag: equal to an argument, a prefix of ``--opt=value``, or, when it is a
  single letter (``-r``), contained in a bundle of short flags (``-rn``).
  Any other entry is a substring of some argument (``"::"``).
* ``ttl_s`` (optional, ``fast`` only, > 0) and ``seconds`` (optional,
  ``fast``/``slow``, >= 0): the rule's TTL and point estimate.
* ``comment`` (optional): ignored.

Tool rule keys (``tools`` entries):

* ``name`` (required): the tool's name as the client declares it, compared
  case-insensitively.
* ``class`` (required): ``fast`` | ``slow`` | ``abstain``.
* ``ttl_s``, ``seconds``, ``comment``: as for command rules.

Precedence: the override file's rules first, in file order, then the shipped
defaults in theirs; the first rule whose ``match``, ``require`` and
``forbid`` all hold decides a simple command (the first tool rule with its
name, a tool). Malformed files raise ``RulesFileError`` naming the file and
the bad entry.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .context_config import ContextServeConfig, data_path
from .features import SimpleCommand, parse_duration, parse_simple_command
from .parser import CODE_TOOL, ToolCall
from .prediction import Prediction, ToolSpeed
from .ttl import hint_ttl

__all__ = [
    "DEFAULT_RULES_FILE",
    "Rule",
    "RuleClass",
    "RuleSet",
    "RulesFileError",
    "RulesLayer",
    "load_rule_set",
]

DEFAULT_RULES_FILE = "default_rules.json"
RULE_CLASSES = ("fast", "slow", "duration", "abstain")
TOOL_RULE_CLASSES = ("fast", "slow", "abstain")
RuleClass = str  # one of RULE_CLASSES
_RULE_KEYS = frozenset({"match", "class", "require", "forbid", "ttl_s", "seconds", "comment"})
_TOOL_RULE_KEYS = frozenset({"name", "class", "ttl_s", "seconds", "comment"})
_FILE_KEYS = frozenset({"version", "fast_ttl_s", "fast_seconds", "replace_defaults", "rules", "tools", "comment"})
_DEFAULT_FAST_TTL_S = 1.0
_DEFAULT_FAST_SECONDS = 0.1


class RulesFileError(ValueError):
    """A rules file is unreadable or malformed; the message names the file
    and the offending entry."""


def _arg_matches(arg: str, entry: str) -> bool:
    if not entry.startswith("-"):
        return entry in arg
    if arg == entry or (entry.startswith("--") and arg.startswith(entry + "=")):
        return True
    if len(entry) == 2 and entry[1].isalpha():
        # single-letter short flag inside a bundle: -r in -rn
        return len(arg) > 2 and arg[0] == "-" and arg[1] != "-" and arg[1:].isalpha() and entry[1] in arg[1:]
    return False


@dataclass(frozen=True)
class Rule:
    """One validated rule (see the module docstring for the semantics).

    Invariants: ``words`` is non-empty; ``ttl_s`` is None or > 0 and only set
    for ``fast``; ``seconds`` is None or >= 0.
    """

    words: tuple[str, ...]
    rule_class: RuleClass
    require: tuple[str, ...] = ()
    forbid: tuple[str, ...] = ()
    ttl_s: float | None = None
    seconds: float | None = None

    @property
    def program(self) -> str:
        return self.words[0]

    def matches(self, cmd: SimpleCommand) -> bool:
        if cmd.program != self.program:
            return False
        args = cmd.args
        i = 0
        for word in self.words[1:]:
            while True:
                if i >= len(args):
                    return False
                arg = args[i]
                i += 1
                if arg == word:
                    break
                if not arg.startswith("-"):
                    return False
        if self.require and not any(_arg_matches(a, e) for a in args for e in self.require):
            return False
        if self.forbid and any(_arg_matches(a, e) for a in args for e in self.forbid):
            return False
        return True


@dataclass(frozen=True)
class _Verdict:
    """Classification of one simple command."""

    kind: str  # "fast" | "slow" | "duration" | "unknown"
    ttl_s: float = 0.0
    seconds: float | None = None


_UNKNOWN = _Verdict("unknown")


class RuleSet:
    """Rules indexed by program, tool rules by lower-cased tool name; first
    match wins (override rules first).

    Invariant: ``tool_rules`` holds one rule per lower-cased name, the first
    one given for it (``words == (name,)``, class ``fast``/``slow``/
    ``abstain``). Cost: one dict lookup plus the candidate rules of that
    program per simple command; one dict lookup per tool name.
    """

    def __init__(self, rules: Sequence[Rule], fast_ttl_s: float = _DEFAULT_FAST_TTL_S,
                 fast_seconds: float = _DEFAULT_FAST_SECONDS,
                 tool_rules: Sequence[Rule] = ()) -> None:
        self.rules = tuple(rules)
        self.fast_ttl_s = fast_ttl_s
        self.fast_seconds = fast_seconds
        self._by_program: dict[str, list[Rule]] = {}
        for rule in self.rules:
            self._by_program.setdefault(rule.program, []).append(rule)
        self.tool_rules: dict[str, Rule] = {}
        for rule in tool_rules:
            self.tool_rules.setdefault(rule.program.lower(), rule)

    def __len__(self) -> int:
        return len(self.rules)

    def rule_for(self, cmd: SimpleCommand) -> Rule | None:
        for rule in self._by_program.get(cmd.program, ()):
            if rule.matches(cmd):
                return rule
        return None

    def tool_verdict(self, name: str) -> _Verdict:
        """Classification of a call of the tool ``name`` (not a shell)."""
        rule = self.tool_rules.get(name.lower())
        if rule is None or rule.rule_class == "abstain":
            return _UNKNOWN
        if rule.rule_class == "slow":
            return _Verdict("slow", 0.0, rule.seconds)
        return _Verdict(
            "fast",
            rule.ttl_s if rule.ttl_s is not None else self.fast_ttl_s,
            rule.seconds if rule.seconds is not None else self.fast_seconds,
        )

    def verdict(self, text: str, fast_threshold_s: float, slow_threshold_s: float) -> _Verdict:
        cmd = parse_simple_command(text)
        if cmd.substitution or cmd.background:
            return _UNKNOWN
        if not cmd.program:  # only VAR=value assignments
            return _Verdict("fast", 0.0, 0.0)
        rule = self.rule_for(cmd)
        verdict = _UNKNOWN
        if rule is not None:
            if rule.rule_class == "fast":
                verdict = _Verdict(
                    "fast",
                    rule.ttl_s if rule.ttl_s is not None else self.fast_ttl_s,
                    rule.seconds if rule.seconds is not None else self.fast_seconds,
                )
            elif rule.rule_class == "slow":
                verdict = _Verdict("slow", 0.0, rule.seconds)
            elif rule.rule_class == "duration":
                total = 0.0
                for arg in cmd.positional():
                    seconds = parse_duration(arg)
                    if seconds is None:
                        total = math.nan
                        break
                    total += seconds
                if not math.isnan(total) and cmd.positional():
                    verdict = _Verdict("duration", 0.0, total)
        limit = cmd.timeout_s
        if limit is not None:
            if verdict.kind == "duration":
                verdict = _Verdict("duration", 0.0, min(verdict.seconds or 0.0, limit))
            elif limit <= fast_threshold_s and verdict.kind != "fast":
                verdict = _Verdict("duration", 0.0, limit)
            elif verdict.kind == "slow" and limit < slow_threshold_s:
                verdict = _UNKNOWN
        return verdict


def _fail(source: str, where: str, entry: Any, problem: str) -> RulesFileError:
    return RulesFileError(f"rules file {source}: {where} {json.dumps(entry)[:200]}: {problem}")


def _string_list(source: str, where: str, entry: Any, key: str) -> tuple[str, ...]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(source, where, entry, f"{key!r} must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def _number(source: str, where: str, entry: Any, key: str, *, positive: bool) -> float | None:
    if key not in entry:
        return None
    value = entry[key]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > 0 if positive else value >= 0)
    if not ok:
        raise _fail(source, where, entry, f"{key!r} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _check_keys(source: str, where: str, entry: Any, allowed: frozenset[str]) -> None:
    """``entry`` is an object with only ``allowed`` keys."""
    if not isinstance(entry, dict):
        raise _fail(source, where, entry, "must be an object")
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise _fail(source, where, entry, f"unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _check_class(
    source: str, where: str, entry: dict[str, Any], classes: tuple[str, ...]
) -> tuple[str, float | None, float | None]:
    """The fields every rule has: ``class`` (one of ``classes``), ``ttl_s``
    (fast rules only), ``seconds`` (fast and slow rules only), ``comment``."""
    rule_class = entry.get("class")
    if rule_class not in classes:
        raise _fail(source, where, entry, f"'class' must be one of {list(classes)}, got {rule_class!r}")
    ttl_s = _number(source, where, entry, "ttl_s", positive=True)
    if ttl_s is not None and rule_class != "fast":
        raise _fail(source, where, entry, f"'ttl_s' is only allowed on 'fast' rules, not {rule_class!r}")
    seconds = _number(source, where, entry, "seconds", positive=False)
    if seconds is not None and rule_class not in ("fast", "slow"):
        raise _fail(source, where, entry, f"'seconds' is only allowed on 'fast'/'slow' rules, not {rule_class!r}")
    if "comment" in entry and not isinstance(entry["comment"], str):
        raise _fail(source, where, entry, "'comment' must be a string")
    return rule_class, ttl_s, seconds


def parse_rule(entry: Any, source: str, index: int) -> Rule:
    """Validate one entry of a file's ``rules`` list."""
    where = f"rules[{index}]"
    _check_keys(source, where, entry, _RULE_KEYS)
    match = entry.get("match")
    if not isinstance(match, str) or not match.split():
        raise _fail(source, where, entry, f"'match' must be a non-empty string, got {match!r}")
    rule_class, ttl_s, seconds = _check_class(source, where, entry, RULE_CLASSES)
    words = match.split()
    program = parse_simple_command(words[0]).program or words[0]
    return Rule(
        words=(program, *words[1:]),
        rule_class=rule_class,
        require=_string_list(source, where, entry, "require"),
        forbid=_string_list(source, where, entry, "forbid"),
        ttl_s=ttl_s,
        seconds=seconds,
    )


def parse_tool_rule(entry: Any, source: str, index: int) -> Rule:
    """Validate one entry of a file's ``tools`` list (a rule on a tool's
    name: ``words == (name,)``)."""
    where = f"tools[{index}]"
    _check_keys(source, where, entry, _TOOL_RULE_KEYS)
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip() or len(name.split()) != 1:
        raise _fail(source, where, entry, f"'name' must be one non-empty word, got {name!r}")
    rule_class, ttl_s, seconds = _check_class(source, where, entry, TOOL_RULE_CLASSES)
    return Rule(words=(name.strip(),), rule_class=rule_class, ttl_s=ttl_s, seconds=seconds)


@dataclass(frozen=True)
class _RulesDocument:
    rules: tuple[Rule, ...]
    fast_ttl_s: float | None
    fast_seconds: float | None
    replace_defaults: bool
    tool_rules: tuple[Rule, ...] = ()


def parse_rules_document(document: Any, source: str) -> _RulesDocument:
    """Validate a decoded rules file (``source`` names it in errors)."""
    if not isinstance(document, dict):
        raise RulesFileError(f"rules file {source}: top level must be an object, got {type(document).__name__}")
    unknown = sorted(set(document) - _FILE_KEYS)
    if unknown:
        raise RulesFileError(f"rules file {source}: unknown top-level key(s) {unknown}; allowed: {sorted(_FILE_KEYS)}")
    version = document.get("version", 1)
    if version != 1:
        raise RulesFileError(f"rules file {source}: unsupported version {version!r}; expected 1")
    entries = document.get("rules", [])
    if not isinstance(entries, list):
        raise RulesFileError(f"rules file {source}: 'rules' must be a list, got {type(entries).__name__}")
    tool_entries = document.get("tools", [])
    if not isinstance(tool_entries, list):
        raise RulesFileError(f"rules file {source}: 'tools' must be a list, got {type(tool_entries).__name__}")
    replace = document.get("replace_defaults", False)
    if not isinstance(replace, bool):
        raise RulesFileError(f"rules file {source}: 'replace_defaults' must be true or false, got {replace!r}")
    scalars = {key: value for key, value in document.items() if key not in ("rules", "tools")}
    return _RulesDocument(
        rules=tuple(parse_rule(entry, source, i) for i, entry in enumerate(entries)),
        fast_ttl_s=_number(source, "top level", scalars, "fast_ttl_s", positive=True),
        fast_seconds=_number(source, "top level", scalars, "fast_seconds", positive=False),
        replace_defaults=replace,
        tool_rules=tuple(parse_tool_rule(entry, source, i) for i, entry in enumerate(tool_entries)),
    )


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RulesFileError(f"rules file {path}: cannot be read: {exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RulesFileError(f"rules file {path}: invalid JSON: {exc}") from exc


def load_rule_set(override_path: str | Path | None = None,
                  extra_documents: Iterable[tuple[Mapping[str, Any], str]] = ()) -> RuleSet:
    """The shipped defaults plus an optional override file (rules first).

    ``extra_documents`` are decoded documents with a name for errors (tests,
    programmatic overrides); they rank above the override file.
    """
    defaults = parse_rules_document(_read(data_path(DEFAULT_RULES_FILE)), str(data_path(DEFAULT_RULES_FILE)))
    layers = [parse_rules_document(doc, name) for doc, name in extra_documents]
    if override_path is not None:
        layers.append(parse_rules_document(_read(Path(override_path)), str(override_path)))
    rules: list[Rule] = []
    tool_rules: list[Rule] = []
    fast_ttl_s = defaults.fast_ttl_s or _DEFAULT_FAST_TTL_S
    fast_seconds = defaults.fast_seconds if defaults.fast_seconds is not None else _DEFAULT_FAST_SECONDS
    replace = False
    for doc in reversed(layers):  # lowest precedence first so higher ones overwrite the scalars
        if doc.fast_ttl_s is not None:
            fast_ttl_s = doc.fast_ttl_s
        if doc.fast_seconds is not None:
            fast_seconds = doc.fast_seconds
    for doc in layers:
        rules.extend(doc.rules)
        tool_rules.extend(doc.tool_rules)
        replace = replace or doc.replace_defaults
    if not replace:
        rules.extend(defaults.rules)
        tool_rules.extend(defaults.tool_rules)
    return RuleSet(rules, fast_ttl_s=fast_ttl_s, fast_seconds=fast_seconds, tool_rules=tool_rules)


class RulesLayer:
    """Layer "rules": see the module docstring. Stateless (``observe`` is a
    no-op); cost O(simple commands) with parsed commands cached."""

    name = "rules"

    def __init__(self, config: ContextServeConfig, rule_set: RuleSet | None = None) -> None:
        self.config = config
        self.rule_set = rule_set if rule_set is not None else load_rule_set(config.rules_path)

    def predict(self, call: ToolCall) -> Prediction | None:
        if call.tool != "bash":
            return self._predict_tools(call.functions if call.tool == CODE_TOOL else (call.tool,))
        cfg = self.config
        if not call.commands:
            return None
        fast_ttl = 0.0
        estimate = 0.0
        duration = 0.0
        has_duration = False
        unknown = False
        for text in call.commands:
            verdict = self.rule_set.verdict(text, cfg.fast_threshold_s, cfg.slow_threshold_s)
            if verdict.kind == "slow":
                return Prediction(ToolSpeed.SLOW, 0.0, self.name, verdict.seconds)
            if verdict.kind == "unknown":
                unknown = True  # keep looking: a later slow command still decides
            elif verdict.kind == "duration":
                has_duration = True
                duration += verdict.seconds or 0.0
            else:
                fast_ttl = max(fast_ttl, verdict.ttl_s)
                estimate += verdict.seconds or 0.0
        if duration >= cfg.slow_threshold_s:
            return Prediction(ToolSpeed.SLOW, 0.0, self.name, duration + estimate)
        if unknown:
            return None
        total = duration + estimate
        if duration <= cfg.fast_threshold_s:
            ttl = fast_ttl + (hint_ttl(duration, math.inf) if has_duration else 0.0)
            if ttl <= 0.0:  # only VAR=value assignments
                ttl = self.rule_set.fast_ttl_s
            return Prediction(ToolSpeed.FAST, min(ttl, cfg.max_ttl_s), self.name, total)
        return Prediction(ToolSpeed.UNCERTAIN, 0.0, self.name, total)

    def _predict_tools(self, names: Sequence[str]) -> Prediction | None:
        """A call of the tools ``names`` (one named tool, or the functions a
        code action calls): SLOW if any is slow, FAST if all are fast (the
        largest of their TTLs, their estimates summed), else abstain."""
        if not names:
            return None
        ttl = 0.0
        estimate = 0.0
        unknown = False
        for name in names:
            verdict = self.rule_set.tool_verdict(name)
            if verdict.kind == "slow":
                return Prediction(ToolSpeed.SLOW, 0.0, self.name, verdict.seconds)
            if verdict.kind == "unknown":
                unknown = True  # keep looking: a later slow tool still decides
                continue
            ttl = max(ttl, verdict.ttl_s)
            estimate += verdict.seconds or 0.0
        if unknown:
            return None
        return Prediction(ToolSpeed.FAST, min(ttl, self.config.max_ttl_s), self.name, estimate)

    def observe(self, call: ToolCall, seconds: float) -> None:
        """Rules do not learn."""
