"""Declared ranges of the plugin's numeric settings.

A numeric setting is a dataclass field declared with ``ranged(default,
Range(...))``; ``check_ranges`` validates every such field of an instance
against its range. The ranges live next to the fields (one declaration per
field), so a new setting cannot be added without one, docs/configuration.md's tables state
the same bounds, and tests iterate ``field_ranges`` instead of a hand-kept
list.

Why every bound is finite: a setting is read once at start-up, from
``--additional-config`` (JSON, where Python's parser accepts ``Infinity``
and ``NaN``) or from the environment (where ``float("inf")`` parses). An
unbounded TTL pins a turn's KV cache forever (a leak no client can undo),
an unbounded count lets a table grow until the process runs out of memory,
and ``nan`` compares false with everything, so it slips past any ``x < hi``
check written the other way round. ``Range.contains`` therefore refuses
non-finite values before it compares.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

__all__ = [
    "DAY_S",
    "RANGE_KEY",
    "Range",
    "check_ranges",
    "field_ranges",
    "ranged",
]

# Upper bound of every duration setting: no TTL, window or threshold of the
# plugin is meaningful beyond a day, and a pin held that long is a leak.
DAY_S = 86400.0
# Key of a field's metadata that holds its ``Range``.
RANGE_KEY = "range"


@dataclass(frozen=True)
class Range:
    """An interval of finite bounds that a numeric setting must lie in.

    Invariants: ``lo`` and ``hi`` are finite and ``lo <= hi``; a value is
    accepted only if it is a real number (never a ``bool``), finite, an
    ``int`` when ``integer`` is set, and inside the interval (each end open
    or closed as declared). ``None`` is accepted only when ``allow_none``.
    """

    lo: float
    hi: float
    integer: bool = False
    lo_open: bool = False
    hi_open: bool = False
    allow_none: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi) and self.lo <= self.hi):
            raise ValueError(f"Range bounds must be finite with lo <= hi, got [{self.lo!r}, {self.hi!r}]")

    def contains(self, value: object) -> bool:
        """Whether ``value`` is an acceptable setting (see the invariants)."""
        if value is None:
            return self.allow_none
        # bool is an int subclass: True must not pass as the count 1.
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above_lo = value > self.lo if self.lo_open else value >= self.lo
        below_hi = value < self.hi if self.hi_open else value <= self.hi
        return above_lo and below_hi

    def describe(self) -> str:
        """The range as error messages and docs/configuration.md state it, e.g.
        ``"a finite number in (0, 86400]"`` or ``"an integer in [1, 65536]"``."""
        interval = (
            f"{'(' if self.lo_open else '['}{_number(self.lo)}, "
            f"{_number(self.hi)}{')' if self.hi_open else ']'}"
        )
        kind = "an integer" if self.integer else "a finite number"
        return f"{kind} in {interval}" + (" or None" if self.allow_none else "")


def _number(x: float) -> str:
    # 86400.0 reads as 86400 and 2**20 as 1048576: the spelling docs/configuration.md uses.
    return str(int(x)) if float(x).is_integer() else repr(x)


def ranged(default: Any, value_range: Range) -> Any:
    """A dataclass field with ``default`` whose value must lie in
    ``value_range`` (checked by ``check_ranges``). The default itself must
    lie in the range; ``tests/test_threat_settings.py`` asserts it."""
    return field(default=default, metadata={RANGE_KEY: value_range})


def field_ranges(cls_or_instance: Any) -> dict[str, Range]:
    """``{field name: Range}`` of every ranged field of a dataclass, in
    declaration order."""
    if not is_dataclass(cls_or_instance):
        raise TypeError(f"{cls_or_instance!r} is not a dataclass")
    return {f.name: f.metadata[RANGE_KEY] for f in fields(cls_or_instance) if RANGE_KEY in f.metadata}


def check_ranges(instance: Any, fail: Callable[[str, Any, str], None]) -> None:
    """Call ``fail(name, value, expectation)`` for the first ranged field of
    ``instance`` whose value lies outside its range (``fail`` raises; each
    config keeps its own message prefix)."""
    for name, value_range in field_ranges(instance).items():
        value = getattr(instance, name)
        if not value_range.contains(value):
            fail(name, value, value_range.describe())

