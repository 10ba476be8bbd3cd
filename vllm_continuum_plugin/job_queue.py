"""Job-aware waiting queue for the Continuum policies.

Order (smallest key first):

1. preempted requests (they already paid for their prefill once);
2. requests of jobs that hold a live pin (their KV is waiting for them);
3. job-level FCFS: a job's first arrival orders all of its turns;
4. request arrival, then insertion order.

It implements vLLM's ``RequestQueue`` interface on a binary heap, so
``add``/``pop`` cost O(log n) (the released fork scanned the whole queue on
every pop). A request's key can change while it waits (its job gains or loses
a pin): ``reprioritize`` pushes a fresh entry and marks the old one stale;
stale entries are skipped on pop and compacted when they pile up.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request

__all__ = ["ContinuumRequestQueue", "PriorityKey"]

# (tier, job first arrival, request arrival)
PriorityKey = tuple[int, float, float]


class _Entry:
    __slots__ = ("key", "seq", "request", "alive")

    def __init__(self, key: PriorityKey, seq: int, request: Request) -> None:
        self.key = key
        self.seq = seq
        self.request = request
        self.alive = True

    def __lt__(self, other: "_Entry") -> bool:
        if self.key != other.key:
            return self.key < other.key
        return self.seq < other.seq


class ContinuumRequestQueue(RequestQueue):
    """Heap-ordered waiting queue; ``key_fn`` gives a request's current key."""

    def __init__(self, key_fn: Callable[[Request], PriorityKey]) -> None:
        self._key_fn = key_fn
        self._heap: list[_Entry] = []
        self._entries: dict[Request, _Entry] = {}
        self._seq = itertools.count()

    # -- RequestQueue interface -------------------------------------------
    def add_request(self, request: Request) -> None:
        old = self._entries.get(request)
        if old is not None:  # re-adding a queued request only refreshes its key
            old.alive = False
        entry = _Entry(self._key_fn(request), next(self._seq), request)
        self._entries[request] = entry
        heapq.heappush(self._heap, entry)
        self._maybe_compact()

    def pop_request(self) -> Request:
        self._drop_stale_top()
        if not self._heap:
            raise IndexError("pop from an empty ContinuumRequestQueue")
        entry = heapq.heappop(self._heap)
        del self._entries[entry.request]
        return entry.request

    def peek_request(self) -> Request:
        self._drop_stale_top()
        if not self._heap:
            raise IndexError("peek from an empty ContinuumRequestQueue")
        return self._heap[0].request

    def prepend_request(self, request: Request) -> None:
        # "Front of the queue" is where the key puts it: preempted requests
        # sort first by their tier; requests skipped during a scheduling pass
        # go back to the position they were peeked from.
        self.add_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.add_request(request)

    def remove_request(self, request: Request) -> None:
        entry = self._entries.pop(request, None)
        if entry is None:
            raise ValueError(f"request {request.request_id} is not in the queue")
        entry.alive = False
        self._maybe_compact()

    def remove_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            entry = self._entries.pop(request, None)
            if entry is not None:
                entry.alive = False
        self._maybe_compact()

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Request]:
        return (e.request for e in sorted(self._entries.values()))

    # -- Continuum extensions ---------------------------------------------
    def __contains__(self, request: object) -> bool:
        return request in self._entries

    def reprioritize(self, requests: Iterable[Request]) -> None:
        """Recompute the keys of queued requests (others are ignored)."""
        for request in requests:
            if request in self._entries:
                self.add_request(request)

    def _drop_stale_top(self) -> None:
        heap = self._heap
        while heap and not heap[0].alive:
            heapq.heappop(heap)

    def _maybe_compact(self) -> None:
        if len(self._heap) > 2 * len(self._entries) + 64:
            self._heap = [e for e in self._heap if e.alive]
            heapq.heapify(self._heap)
