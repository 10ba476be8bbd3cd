"""Retention directives: which tokens of a prompt a client will need again, and for how long.

The field's two spellings of one idea (docs/clients.md has the exact shapes):

* vLLM PR #38514 ("Context-Aware KV-Cache Retention API", RFC #37003):
  ``retention_directives: [{"start", "end", "priority", "duration"}]``
  (token offsets, ``end`` exclusive, priority 0-100, duration in seconds)
  and ``retention_scope`` (a session id);
* TensorRT-LLM's ``KvCacheRetentionConfig``, as
  ``kv_cache_retention_config: {"token_range_retention_configs": [{"token_start",
  "token_end", "priority", "duration_ms"}], "decode_retention_priority",
  "decode_duration_ms"}`` (a ``token_end`` of null: to the end of the prompt).

Both parse (:func:`parse_retention`, strict: a :class:`~.metadata.MetadataError`
naming the field, which the API server turns into an HTTP 400) to one
:class:`Retention`.

Semantics are TensorRT-LLM's: every token has a priority, ``DEFAULT_PRIORITY``
(35, TensorRT-LLM's default) where no range covers it; a higher priority asks
to keep its blocks, a lower one to let them go first; when a range's duration
ends its priority falls back to the default. The plugin maps that onto what it
has (:meth:`Retention.plan`):

* a block's priority is the highest among the ranges that overlap it; a
  range with no duration holds as long as the plugin allows
  (``retention_max_s``, which also bounds every duration);
* the prefix cache serves a block only if every block before it is cached,
  so a block is worth what its least valued predecessor is worth: the plan
  keeps the *leading* blocks whose priority (and every predecessor's) is
  above the default, each for the shortest duration along its prefix;
  blocks no range covers are the policy's to decide (its TTL, ``policy_ttl_s``);
* the first block whose priority is below the default, and every block
  after it, go to the front of the free queue when freed (evicted first).

Invariants of a :class:`RetentionPlan`: ``stages`` are ordered by hold
(ascending) with the blocks kept strictly decreasing; every hold is in
``(0, max_hold_s]``; ``evict_from`` (when set) is not below the blocks kept.
Computing one costs O(R log R) for R ranges, never O(blocks).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_PRIORITY",
    "KV_CACHE_RETENTION_CONFIG",
    "MAX_RETENTION_RANGES",
    "RETENTION_DIRECTIVES",
    "RETENTION_FIELDS",
    "RETENTION_SCOPE",
    "Retention",
    "RetentionPlan",
    "RetentionRange",
    "parse_retention",
]

RETENTION_DIRECTIVES = "retention_directives"
RETENTION_SCOPE = "retention_scope"
KV_CACHE_RETENTION_CONFIG = "kv_cache_retention_config"
RETENTION_FIELDS = (RETENTION_DIRECTIVES, RETENTION_SCOPE, KV_CACHE_RETENTION_CONFIG)

# TensorRT-LLM's default retention priority: neither kept nor let go first.
DEFAULT_PRIORITY = 35
MAX_PRIORITY = 100
# Ranges one request may declare (a directive is parsed on the engine
# thread and kept with the request): more is an HTTP 400, not a truncation.
MAX_RETENTION_RANGES = 64
# Token offsets beyond this are no prompt any model serves.
MAX_TOKEN_OFFSET = 2**31 - 1
# A week: longer is no duration the plugin could honour (it clamps to
# retention_max_s anyway); this only keeps the numbers finite and sane.
MAX_DURATION_S = 7 * 24 * 3600.0
# vllm_xargs carries only scalars: there the structures come as JSON text.
MAX_JSON_CHARS = 65536


class _Invalid(ValueError):
    """Raised inside the parser; :func:`parse_retention` re-raises it as the
    caller's ``MetadataError`` (kept apart to avoid an import cycle)."""

    def __init__(self, field: str, value: Any, expectation: str) -> None:
        super().__init__(field)
        self.field, self.value, self.expectation = field, value, expectation


@dataclass(frozen=True)
class RetentionRange:
    """Tokens ``[start, end)`` (``end`` None: to the end of the prompt) at
    ``priority`` for ``duration_s`` (None: as long as allowed)."""

    start: int
    end: int | None
    priority: int
    duration_s: float | None


@dataclass(frozen=True)
class RetentionPlan:
    """What to do with a finished request's blocks (module doc).

    ``stages``: ``(hold_s, blocks)`` pairs, hold ascending, blocks strictly
    decreasing: the first ``blocks`` blocks are kept until ``hold_s``
    seconds from now. ``declared_after_s``: from then on what is kept is
    kept on the client's word alone (past the policy's own TTL).
    ``evict_from``: the first block to go first out of the prefix cache.
    """

    stages: tuple[tuple[float, int], ...]
    declared_after_s: float
    evict_from: int | None

    @property
    def keep_blocks(self) -> int:
        return self.stages[0][1] if self.stages else 0


@dataclass(frozen=True)
class Retention:
    """A request's declared retention (module doc)."""

    ranges: tuple[RetentionRange, ...]
    # Tokens generated after the prompt (TensorRT-LLM's decode retention).
    decode_priority: int | None = None
    decode_duration_s: float | None = None

    def plan(self, num_prompt_tokens: int, num_tokens: int, block_size: int, max_hold_s: float,
             policy_ttl_s: float = 0.0) -> RetentionPlan:
        """The plan for a finished request of ``num_tokens`` tokens (its
        first ``num_prompt_tokens`` the prompt) in ``block_size``-token
        blocks. Blocks no range covers hold for ``policy_ttl_s`` (what the
        policy decided for the turn; 0: not held)."""
        num_blocks = num_tokens // block_size
        if num_blocks <= 0:
            return RetentionPlan((), 0.0, None)
        cap = max(0.0, max_hold_s)
        ranges = list(self.ranges)
        if self.decode_priority is not None and num_tokens > num_prompt_tokens:
            ranges.append(RetentionRange(num_prompt_tokens, num_tokens, self.decode_priority,
                                         self.decode_duration_s))
        # Block-level segments: the boundaries of every range's blocks.
        spans: list[tuple[int, int, RetentionRange]] = []
        for r in ranges:
            end = num_prompt_tokens if r.end is None else min(r.end, num_tokens)
            first, last = r.start // block_size, min(num_blocks, -(-end // block_size))
            if first < last:
                spans.append((first, last, r))
        bounds = sorted({0, num_blocks, *(b for s in spans for b in s[:2])})
        stages: dict[float, int] = {}
        evict_from: int | None = None
        keeping, hold = True, math.inf
        for lo, hi in zip(bounds, bounds[1:]):
            covering = [r for first, last, r in spans if first <= lo and hi <= last]
            if covering:
                top = max(covering, key=lambda r: (r.priority, math.inf if r.duration_s is None else r.duration_s))
                priority = top.priority
                seconds = cap if top.duration_s is None else min(cap, top.duration_s)
                if priority < DEFAULT_PRIORITY and evict_from is None:
                    evict_from = lo
                kept = priority > DEFAULT_PRIORITY
            else:  # the policy's to decide
                seconds, kept = min(cap, policy_ttl_s), policy_ttl_s > 0
            if keeping and kept and seconds > 0:
                hold = min(hold, seconds)
                stages[hold] = hi
            else:
                keeping = False
        ordered = tuple(sorted(stages.items()))
        return RetentionPlan(ordered, min(cap, max(0.0, policy_ttl_s)), evict_from)


def parse_retention(args: Mapping[str, Any], error: type[ValueError]) -> Retention | None:
    """The retention a request declares in ``args`` (its merged
    ``extra_args``), or None. Raises ``error(field, value, expectation)``
    (the caller's ``MetadataError``) naming the field of a malformed value.
    Both spellings at once are refused (which would win is not obvious).
    (``retention_scope`` is a job id: ``metadata`` validates it as one.)"""
    try:
        pr, trt = args.get(RETENTION_DIRECTIVES), args.get(KV_CACHE_RETENTION_CONFIG)
        if pr is not None and trt is not None:
            raise _Invalid(KV_CACHE_RETENTION_CONFIG, "<given>",
                           f"one spelling per request: {RETENTION_DIRECTIVES} or {KV_CACHE_RETENTION_CONFIG}")
        if pr is not None:
            return _parse_pr(pr)
        if trt is not None:
            return _parse_trt(trt)
        return None
    except _Invalid as e:
        raise error(e.field, e.value, e.expectation) from None


def _json(value: Any, field: str) -> Any:
    """``vllm_xargs`` carries only scalars and lists of scalars: there a
    structure arrives as JSON text."""
    if isinstance(value, str):
        if len(value) > MAX_JSON_CHARS:
            raise _Invalid(field, f"<{len(value)} characters>", f"JSON of at most {MAX_JSON_CHARS} characters")
        try:
            return json.loads(value)
        except ValueError:
            raise _Invalid(field, _shown(value), "a JSON list or object") from None
    return value


def _parse_pr(value: Any) -> Retention:
    items = _list(_json(value, RETENTION_DIRECTIVES), RETENTION_DIRECTIVES)
    ranges = []
    for i, item in enumerate(items):
        where = f"{RETENTION_DIRECTIVES}[{i}]"
        item = _object(item, where, ("start", "end", "priority", "duration"))
        seconds = _duration(item.get("duration"), f"{where}.duration", scale=1.0)
        ranges.append(_range(item.get("start"), item.get("end"), item.get("priority"), seconds, where,
                             ("start", "end", "priority"), end_required=True))
    return Retention(tuple(ranges))


def _parse_trt(value: Any) -> Retention:
    field = KV_CACHE_RETENTION_CONFIG
    config = _object(_json(value, field), field,
                     ("token_range_retention_configs", "decode_retention_priority", "decode_duration_ms"))
    items = config.get("token_range_retention_configs")
    items = [] if items is None else _list(items, f"{field}.token_range_retention_configs")
    ranges = []
    for i, item in enumerate(items):
        where = f"{field}.token_range_retention_configs[{i}]"
        item = _object(item, where, ("token_start", "token_end", "priority", "duration_ms"))
        seconds = _duration(item.get("duration_ms"), f"{where}.duration_ms", scale=1e-3)
        ranges.append(_range(item.get("token_start"), item.get("token_end"), item.get("priority"), seconds, where,
                             ("token_start", "token_end", "priority"), end_required=False))
    decode = config.get("decode_retention_priority")
    decode_priority = None if decode is None else _priority(decode, f"{field}.decode_retention_priority")
    decode_s = _duration(config.get("decode_duration_ms"), f"{field}.decode_duration_ms", scale=1e-3)
    return Retention(tuple(ranges), decode_priority, decode_s)


def _list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list):
        raise _Invalid(field, _shown(value), "a list of ranges")
    if len(value) > MAX_RETENTION_RANGES:
        raise _Invalid(field, f"<{len(value)} ranges>", f"at most {MAX_RETENTION_RANGES} ranges")
    return value


def _object(value: Any, field: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _Invalid(field, _shown(value), f"an object with {', '.join(keys)}")
    unknown = sorted(str(k) for k in value if k not in keys)
    if unknown:
        raise _Invalid(f"{field}.{unknown[0]}", "<given>", f"only {', '.join(keys)}")
    return value


def _range(start: Any, end: Any, priority: Any, seconds: float | None, where: str, names: tuple[str, str, str],
           end_required: bool) -> RetentionRange:
    start_name, end_name, priority_name = names
    first = _offset(start, f"{where}.{start_name}")
    if end is None and end_required:
        raise _Invalid(f"{where}.{end_name}", None, "a token offset above start")
    last = None if end is None else _offset(end, f"{where}.{end_name}")
    if last is not None and last <= first:
        raise _Invalid(f"{where}.{end_name}", last, f"a token offset above {start_name} ({first})")
    return RetentionRange(first, last, _priority(priority, f"{where}.{priority_name}"), seconds)


def _offset(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKEN_OFFSET:
        raise _Invalid(field, _shown(value), f"an integer token offset in [0, {MAX_TOKEN_OFFSET}]")
    return value


def _priority(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PRIORITY:
        raise _Invalid(field, _shown(value), f"an integer priority in [0, {MAX_PRIORITY}]")
    return value


def _duration(value: Any, field: str, scale: float) -> float | None:
    """Seconds (``value * scale``), or None for no duration."""
    if value is None:
        return None
    limit = MAX_DURATION_S / scale
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Invalid(field, _shown(value), f"a number in [0, {limit:.0f}] or null")
    seconds = float(value)
    if not math.isfinite(seconds) or not 0 <= seconds <= limit:
        raise _Invalid(field, _shown(value), f"a number in [0, {limit:.0f}] or null")
    return seconds * scale


def _shown(value: Any, limit: int = 64) -> Any:
    text = repr(value)
    return value if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
