"""Time sources for the scheduler's pin lifecycle and tool-time measurement.

The scheduler never reads the system clock directly: it asks the
:class:`Clock` it was constructed with. A server uses :data:`SYSTEM_CLOCK`;
tests hand in a :class:`ManualClock` and advance it, so a TTL lapses exactly
when the test says and never because the machine happened to be slow.

Two readings, as vLLM itself uses them:
* ``monotonic()`` -- pin deadlines, prefill timing (never jumps);
* ``time()`` -- wall seconds, the scale of vLLM's ``Request.arrival_time``,
  against which a job's previous finish is compared to measure its tool time.
"""

from __future__ import annotations

import time as _time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SYSTEM_CLOCK", "SystemClock"]


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (deadlines)."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch (``Request.arrival_time``'s scale)."""
        ...


class SystemClock:
    """The process's real clocks."""

    def monotonic(self) -> float:
        return _time.monotonic()

    def time(self) -> float:
        return _time.time()


SYSTEM_CLOCK = SystemClock()


class ManualClock:
    """A clock that moves only when told to (tests, simulations).

    Invariant: both readings advance together and never go back.
    """

    def __init__(self, start_monotonic: float = 1000.0, start_time: float = 1.7e9) -> None:
        self._monotonic = float(start_monotonic)
        self._time = float(start_time)

    def monotonic(self) -> float:
        return self._monotonic

    def time(self) -> float:
        return self._time

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back: advance({seconds!r})")
        self._monotonic += seconds
        self._time += seconds
