"""Wake an idle EngineCore when a pin's TTL runs out (or a prefetch is due).

vLLM's EngineCore blocks on its input queue while the scheduler reports no
work, so a pin created by the last request before a lull would never expire
(its blocks would show as used on ``/metrics`` and ``reset_prefix_cache``
would fail). ``ExpiryWaker`` is a daemon thread that sleeps until the earliest
pin deadline and then puts vLLM's own no-op ``WAKEUP`` message into the input
queue; the scheduler's ``has_requests()`` reports work while a pin is due, so
the engine runs one empty step in which the scheduler releases it. All block
operations stay on the engine thread: the waker never touches scheduler state.

The input queue is found once by walking the caller frames of the first
``schedule()`` call (the EngineCore calls it as ``self.scheduler.schedule()``).
In-process engines without a queue (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, unit
tests) have nothing to wake: their pins expire at the next ``schedule()``.
"""

from __future__ import annotations

import queue
import sys
import threading

from .clock import SYSTEM_CLOCK, Clock

__all__ = ["EngineWaker", "ExpiryWaker", "find_engine_input_queue"]


def find_engine_input_queue(max_depth: int = 12) -> "queue.Queue | None":
    frame = sys._getframe(1)
    depth = 0
    while frame is not None and depth < max_depth:
        owner = frame.f_locals.get("self")
        candidate = getattr(owner, "input_queue", None)
        if isinstance(candidate, queue.Queue):
            return candidate
        frame = frame.f_back
        depth += 1
    return None


class ExpiryWaker:
    def __init__(self, input_queue: "queue.Queue", wake_message: object, clock: Clock = SYSTEM_CLOCK) -> None:
        self._queue = input_queue
        self._clock = clock
        self._message = wake_message
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="continuum-pin-expiry", daemon=True)
        self._thread.start()

    def set_deadline(self, deadline: float | None) -> None:
        """Wake the engine at ``deadline`` (monotonic seconds); None = never."""
        with self._cond:
            if deadline != self._deadline:
                self._deadline = deadline
                self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                delay = self._deadline - self._clock.monotonic()
                if delay > 0:
                    self._cond.wait(timeout=delay)
                    continue
                self._deadline = None
                self._queue.put_nowait(self._message)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()


class EngineWaker:
    """The scheduler's handle on its engine's waker: the input queue is
    looked up once, from the first ``schedule()`` (:meth:`attach`); without
    one (in-process engines, tests) every call is a no-op."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._waker: ExpiryWaker | None = None
        self.attached = False

    def attach(self) -> None:
        """Find the engine's input queue (call from ``schedule()``: the
        EngineCore is among the caller frames)."""
        self.attached = True
        input_queue = find_engine_input_queue()
        if input_queue is None:
            return
        from vllm.v1.engine import EngineCoreRequestType

        self._waker = ExpiryWaker(input_queue, (EngineCoreRequestType.WAKEUP, None), self._clock)

    def set_deadline(self, deadline: float | None) -> None:
        if self._waker is not None:
            self._waker.set_deadline(deadline)

    def close(self) -> None:
        if self._waker is not None:
            self._waker.close()
