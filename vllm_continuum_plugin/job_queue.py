"""Job-aware waiting queue for the Continuum policies.

Order (smallest key first):

1. preempted requests (they already paid for their prefill once);
2. requests of jobs that hold a live pin (their KV is waiting for them);
3. job-level FCFS: the arrival a request ranks by, its job's (bounded, see
   ``job_order.JobOrder``);
4. request arrival, then insertion order.

The queue itself only orders by the key its ``key_fn`` gives.

It implements vLLM's ``RequestQueue`` interface on a binary heap, so
``add``/``pop`` cost O(log n) (the released fork scanned the whole queue on
every pop). A request's key can change while it waits (its job gains or loses
a pin): ``reprioritize`` pushes a fresh entry and marks the old one stale;
stale entries are skipped on pop and compacted when they pile up.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Collection, Iterable, Iterator

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request

__all__ = ["ContinuumRequestQueue", "PriorityKey", "WaitingTurns"]

# (tier, ranked arrival of the job, request arrival)
PriorityKey = tuple[int, float, float]


# Heap entry: (*key, seq, request). ``seq`` is unique, so tuple comparison
# (done in C) never reaches the request. An entry is live iff the request's
# current seq in ``_live`` equals its own.
_Entry = tuple


class ContinuumRequestQueue(RequestQueue):
    """Heap-ordered waiting queue; ``key_fn`` gives a request's current key."""

    def __init__(self, key_fn: Callable[[Request], PriorityKey]) -> None:
        self._key_fn = key_fn
        self._heap: list[_Entry] = []
        self._live: dict[Request, int] = {}
        self._seq = itertools.count()
        # Heap entries that are no longer live (lets peek/pop skip the
        # staleness check in the common case of none).
        self._num_stale = 0

    # -- RequestQueue interface -------------------------------------------
    def add_request(self, request: Request) -> None:
        # Re-adding a queued request refreshes its key (the old entry goes stale).
        seq = next(self._seq)
        if self._live.get(request) is not None:
            self._num_stale += 1
        self._live[request] = seq
        heapq.heappush(self._heap, (*self._key_fn(request), seq, request))
        if self._num_stale > len(self._live) + 64:
            self._compact()

    def pop_request(self) -> Request:
        self._drop_stale_top()
        if not self._heap:
            raise IndexError("pop from an empty ContinuumRequestQueue")
        request = heapq.heappop(self._heap)[-1]
        del self._live[request]
        return request

    def peek_request(self) -> Request:
        self._drop_stale_top()
        if not self._heap:
            raise IndexError("peek from an empty ContinuumRequestQueue")
        return self._heap[0][-1]

    def prepend_request(self, request: Request) -> None:
        # "Front of the queue" is where the key puts it: preempted requests
        # sort first by their tier; requests skipped during a scheduling pass
        # go back to the position they were peeked from.
        self.add_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.add_request(request)

    def remove_request(self, request: Request) -> None:
        if self._live.pop(request, None) is None:
            raise ValueError(f"request {request.request_id} is not in the queue")
        self._num_stale += 1

    def remove_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            if self._live.pop(request, None) is not None:
                self._num_stale += 1

    def __bool__(self) -> bool:
        return bool(self._live)

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Request]:
        live = self._live
        return (e[-1] for e in sorted(e for e in self._heap if live.get(e[-1]) == e[-2]))

    # -- Continuum extensions ---------------------------------------------
    def __contains__(self, request: object) -> bool:
        return request in self._live

    def reprioritize(self, requests: Iterable[Request]) -> None:
        """Recompute the keys of queued requests (others are ignored)."""
        for request in requests:
            if request in self._live:
                self.add_request(request)

    def _drop_stale_top(self) -> None:
        if not self._num_stale:
            return
        heap, live = self._heap, self._live
        while heap and live.get(heap[0][-1]) != heap[0][-2]:
            heapq.heappop(heap)
            self._num_stale -= 1

    def _compact(self) -> None:
        live = self._live
        self._heap = [e for e in self._heap if live.get(e[-1]) == e[-2]]
        heapq.heapify(self._heap)
        self._num_stale = 0


class WaitingTurns:
    """Each job's requests that arrived and were neither admitted nor
    finished yet: the turns a lapsed pin is kept for, and those whose tier
    changes when their job gains or loses a pin. A job with none has no
    entry."""

    def __init__(self) -> None:
        self._by_job: dict[str, set[Request]] = {}

    def add(self, job_id: str, request: Request) -> None:
        self._by_job.setdefault(job_id, set()).add(request)

    def discard(self, job_id: str, request: Request) -> None:
        waiting = self._by_job.get(job_id)
        if waiting is not None:
            waiting.discard(request)
            if not waiting:
                del self._by_job[job_id]

    def of(self, job_id: str) -> Collection[Request]:
        return self._by_job.get(job_id, ())

    def by_job(self) -> Iterable[set[Request]]:
        """Each job's waiting requests (jobs with none are left out)."""
        return self._by_job.values()
