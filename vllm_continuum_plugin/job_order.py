"""Where a request ranks: job-level FCFS that no job id can game.

Continuum serves an agent's next turn as if it had arrived with the job's
first turn, so jobs that are mid-task finish before newer ones start. Left
unbounded, that lets a job id jump the queue forever: a long chat session,
or a client that reuses one id on purpose, keeps its first arrival for hours
and its concurrent requests all share it. The rule (docs/scheduling.md, "Job order"):

* a job's turns rank by the arrival of its activity period's first turn
  (``JobState.first_arrival``; a turn arriving more than ``job_idle_reset_s``
  after the job's last finish starts a new period), but never by more than
  ``window_s`` (``job_priority_window_s``) before their own arrival;
* only a turn that arrives while nothing else of its job is in flight (the
  next turn of a sequential agent loop) gets that credit; further concurrent
  requests of the job rank by their own arrival;
* the pinned-job tier (a waiting turn whose KV is pinned goes first) is part
  of the credit: a job older than the window, or a request without credit,
  does not get it.

Waiting queue key (smallest first): ``(tier, ranked arrival, own arrival)``
with tiers preempted < pinned job < rest. Preemption order: vLLM preempts
``running[-1]``, which ``running_key`` makes the latest-ranked request, a
job's last step going after the others only when it has the credit and its
job has finished turns before (a flag alone protects nothing: any client can
set it on every request).

Invariant: a request's ranked arrival is fixed when it arrives (``credit``)
and lies in ``[own arrival - window_s, own arrival]``; only its tier changes
while it waits (its job gains or loses a pin), and the queue is told to
re-key it then.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm.v1.request import Request, RequestStatus

from .estimators.history import JobState
from .job_queue import PriorityKey
from .request_record import peek_record, request_record

__all__ = ["JobOrder"]

TIER_PREEMPTED, TIER_PINNED_JOB, TIER_REST = 0, 1, 2


class JobOrder:
    """Ranks requests by job (see module doc); ``has_pin(request)`` tells
    whether the request's job holds a pin the request continues."""

    def __init__(self, window_s: float, has_pin: Callable[[Request], bool]) -> None:
        self.window_s = window_s
        self._has_pin = has_pin

    def credit(self, request: Request, job: JobState) -> None:
        """Fix the arrival ``request`` ranks by; ``job`` already counts it
        as in flight."""
        arrival = request.arrival_time
        record = request_record(request)
        if job.in_flight == 1:
            record.ranked_arrival = max(job.first_arrival, arrival - self.window_s)
            record.credit = arrival - job.first_arrival <= self.window_s
            record.veteran = job.turns_finished > 0
        else:
            record.ranked_arrival = arrival

    @staticmethod
    def has_credit(request: Request) -> bool:
        """May the request use its job's pinned-job tier?"""
        record = peek_record(request)
        return record is not None and record.credit

    @staticmethod
    def ranked_arrival(request: Request) -> float:
        """The arrival the request ranks by (its own when it has no job)."""
        record = peek_record(request)
        ranked = record.ranked_arrival if record is not None else None
        return request.arrival_time if ranked is None else ranked

    def queue_key(self, request: Request) -> PriorityKey:
        if request.status == RequestStatus.PREEMPTED:
            tier = TIER_PREEMPTED
        elif self.has_credit(request) and self._has_pin(request):
            tier = TIER_PINNED_JOB
        else:
            tier = TIER_REST
        return (tier, self.ranked_arrival(request), request.arrival_time)

    def sort_running(self, running: list[Request]) -> None:
        """vLLM preempts ``running[-1]``: put the latest-ranked request not
        on a protected last step there. Timsort makes the usual
        already-sorted case O(n)."""
        if len(running) > 1:
            running.sort(key=self.running_key)

    def running_key(self, request: Request) -> tuple[bool, float, float]:
        record = request_record(request)
        key = record.run_key
        if key is None:  # computed once per request: its ranked arrival is fixed
            protected = bool(record.meta.is_last_step) and record.veteran
            key = (not protected, self.ranked_arrival(request), request.arrival_time)
            record.run_key = key
        return key
