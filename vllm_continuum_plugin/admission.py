"""Admission: a new job waits while the jobs under way fill the KV pool.

When the contexts of the jobs already under way exceed the pool, admitting
one more only makes every job rebuild its context after each tool call: the
FCFS collapse, where everyone thrashes and nobody finishes. The gate holds a
new job's first turn back while the jobs under way would not fit with it, so
the admitted ones keep their contexts and finish fast.

* A job is *under way* from its first admitted turn until its last turn
  ends, while it has a turn running or waiting, or its last turn finished
  less than ``quiet_after_s`` ago (``max_ttl_s``: no TTL holds a context
  longer, so a job quiet for that long no longer counts on its KV).
* Its *footprint* is its context's blocks as last seen (the prompt of its
  admitted turn, then everything the turn computed).
* A job's first turn is admitted when the footprints of the jobs under way
  plus its prompt fit in the pool. New jobs pass the gate in queue order
  (bounded job-level FCFS): the first that does not fit holds back every
  later one, so a large job is not overtaken forever by small ones.

The bound adapts to what the jobs hold, not to a count of sessions: many
short contexts or a few long ones. Requests without a job id (chat) and a
job's later turns are never held.

Bounds, so that no job starves and the engine never idles for it:

* a first turn that has waited ``max_wait_s`` (``job_priority_window_s``)
  passes whatever the pool holds;
* when nothing is running, the first held turn passes (a gate must not
  idle the GPU).

Invariant: a held request is out of the scheduler's waiting queue only for
the duration of one ``schedule()`` call (:meth:`hold_back` before it,
:meth:`restore` after), so every other path (aborts, stats, the engine's
"has work" checks) sees it waiting.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from vllm.v1.request import Request

__all__ = ["AdmissionGate"]


class AdmissionGate:
    """Holds new jobs' first turns while the pool is spoken for (see module doc)."""

    def __init__(
        self,
        capacity_blocks: int,
        block_size: int,
        quiet_after_s: float,
        max_wait_s: float,
        rank: Callable[[Request], Any],
    ) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self.quiet_after_s = quiet_after_s
        self.max_wait_s = max_wait_s
        self._rank = rank
        # job -> (footprint blocks, last finish or None while a turn is in flight)
        self._jobs: dict[str, tuple[int, float | None]] = {}
        self._new: dict[str, Request] = {}  # request id -> a waiting first turn
        self._held: list[Request] = []
        self.held_total = 0  # first turns held back in a step (a turn held for k steps counts k)
        # The last decision, reused while nothing it depends on changed: the
        # reports above (version), whether anything runs, and the clock
        # before the next job goes quiet or held turn becomes overdue.
        self._version = 0
        self._decided: tuple[int, bool] | None = None
        self._decision: list[Request] = []
        self._valid_until = -math.inf

    # -- what the scheduler reports ------------------------------------------
    def on_first_turn(self, request: Request) -> None:
        """A new job's first turn is waiting."""
        self._new[request.request_id] = request
        self._version += 1

    def on_admitted(self, job_id: str, request: Request) -> None:
        """A turn of ``job_id`` was scheduled: the job is under way, with its
        prompt's blocks (at least)."""
        self._new.pop(request.request_id, None)
        blocks = request.num_prompt_tokens // self.block_size
        old = self._jobs.get(job_id)
        self._jobs[job_id] = (max(blocks, old[0] if old else 0), None)
        self._version += 1

    def on_turn_finished(self, job_id: str, request: Request, now: float) -> None:
        """A non-final turn finished: the job waits on its tool with this context."""
        if job_id in self._jobs:
            self._jobs[job_id] = (request.num_tokens // self.block_size, now)
            self._version += 1

    def on_job_end(self, job_id: str) -> None:
        if self._jobs.pop(job_id, None) is not None:
            self._version += 1

    def forget(self, request: Request) -> None:
        """A waiting first turn left without being admitted (aborted)."""
        if self._new.pop(request.request_id, None) is not None:
            self._version += 1

    # -- the gate --------------------------------------------------------------
    def demand_blocks(self, now: float) -> int:
        """Footprints of the jobs under way; drops jobs quiet for too long."""
        quiet = [j for j, (_, t) in self._jobs.items() if t is not None and now - t >= self.quiet_after_s]
        for job_id in quiet:
            del self._jobs[job_id]
        return sum(blocks for blocks, _ in self._jobs.values())

    def hold_back(self, waiting: Any, running: bool, now: float) -> None:
        """Take the first turns that must wait out of ``waiting`` (a
        ``RequestQueue``) for the coming ``schedule()``. ``running``: whether
        anything runs; ``now``: the clock of requests' arrival times."""
        assert not self._held, "restore() must follow every hold_back()"
        if not self._new:
            return
        if self._decided != (self._version, running) or now >= self._valid_until:
            self._decide(waiting, running, now)
        held = [r for r in self._decision if r in waiting]
        if held:
            waiting.remove_requests(held)
            self._held = held
            self.held_total += len(held)

    def _decide(self, waiting: Any, running: bool, now: float) -> None:
        room = self.capacity_blocks - self.demand_blocks(now)
        candidates = sorted((r for r in self._new.values() if r in waiting), key=self._rank)
        decision: list[Request] = []
        blocked = False
        valid_until = math.inf
        for request in candidates:
            need = request.num_prompt_tokens // self.block_size
            due = request.arrival_time + self.max_wait_s
            if now >= due:
                continue  # overdue: passes whatever the pool holds
            if not blocked and (need <= room or (not running and not decision)):
                room -= need
                continue
            blocked = True
            decision.append(request)
            valid_until = min(valid_until, due)
        if decision:
            # A quiet job leaving the demand may open the gate.
            for _, finished in self._jobs.values():
                if finished is not None:
                    valid_until = min(valid_until, finished + self.quiet_after_s)
        self._decision = decision
        self._decided = (self._version, running)
        self._valid_until = valid_until

    def restore(self, waiting: Any) -> int:
        """Put the held first turns back (after ``schedule()``); returns how
        many were held."""
        held = len(self._held)
        if held:
            for request in self._held:
                waiting.add_request(request)
            self._held.clear()
        return held
