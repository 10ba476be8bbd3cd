"""Bookkeeping of pinned KV blocks: which job holds which blocks until when.

A pin owns one reference on each of its blocks (the reference the finished
request held), so the blocks stay out of the free queue and keep their
prefix-cache hashes. The table only records ownership; the scheduler returns
the blocks to the pool when it pops a pin.

Several pins may hold the same physical block: jobs of one agent harness
share its system prompt (often thousands of tokens), so their pins hold the
same prefix blocks, each with a reference of its own. Such a block costs the
pool one block however many pins hold it, so the table counts *distinct*
blocks.

Invariants:
* at most one pin per job (a newer turn's pin replaces the older one);
* ``num_pinned_blocks`` is the number of distinct blocks held by live pins,
  and ``_holders[id(block)]`` the number of live pins holding ``block``;
* a popped pin is never returned again (so no block is freed twice).
Both heaps use lazy deletion: stale entries are skipped on pop and compacted
when they outnumber live pins.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

from .prompt_prefix import PromptPrefix

__all__ = ["Pin", "PinTable", "continues"]


@dataclass(eq=False)
class Pin:
    """Blocks a finished turn left pinned for its job's next turn."""

    job_id: str
    request_id: str
    # One list per KV cache group, each in allocation (prefix) order.
    blocks_by_group: list[list[Any]]
    job_first_arrival: float
    created_at: float  # monotonic seconds
    deadline: float  # monotonic seconds
    ttl_s: float
    tool_key: str
    # ContextServe's class of the tool ("fast" / "uncertain"), else None.
    speed: str | None = None
    # The finished turn's prompt: a request continues this job's context
    # (and may take the pin over or end it) only if it continues that prompt
    # (``PromptPrefix.continued_by``: most of it, a rewritten tail allowed).
    # None: continued by nothing.
    prefix: PromptPrefix | None = None
    # The engine step that may still write these blocks when they were
    # pinned (vLLM's deferred frees), else None.
    fence: int | None = None
    # Declared retention (``retention``): later ``(deadline, blocks)``
    # stages, deadlines ascending, blocks decreasing: at ``deadline`` the
    # pin shrinks to its first ``blocks`` blocks (one KV group only).
    stages: list[tuple[float, int]] = field(default_factory=list)
    # From this monotonic time on the pin is held on the client's word
    # alone (past the policy's own TTL): memory pressure takes it before
    # any pin the policy made, and it never makes another pin give way.
    declared_from: float | None = None
    num_blocks: int = field(init=False)

    def __post_init__(self) -> None:
        self.num_blocks = sum(len(g) for g in self.blocks_by_group)

    def declared_at(self, now: float) -> bool:
        """Is the pin held on the client's word alone at ``now``?"""
        return self.declared_from is not None and now >= self.declared_from


def continues(pin: Pin, block_hashes: Any) -> bool:
    """Does a request with these block hashes continue the context ``pin``
    holds (it shares most of the pinned turn's prompt, see
    :mod:`~.prompt_prefix`)? O(log checkpoints) hash compares."""
    return pin.prefix is not None and pin.prefix.continued_by(block_hashes)


class PinTable:
    def __init__(self) -> None:
        self._by_job: dict[str, Pin] = {}
        self._by_deadline: list[tuple[float, int, Pin]] = []
        # Latest-arriving job first: key is -job_first_arrival.
        self._by_lateness: list[tuple[float, int, Pin]] = []
        self._seq = itertools.count()
        # id(block) -> live pins holding it. Block objects live as long as
        # the block pool, so their ids are stable keys (they are unhashable
        # dataclasses).
        self._holders: dict[int, int] = {}

    @property
    def num_pinned_blocks(self) -> int:
        """Distinct blocks held by live pins (what the pins cost the pool)."""
        return len(self._holders)

    def new_blocks(self, blocks_by_group: list[list[Any]]) -> int:
        """How many of these blocks no live pin holds yet (the cost of pinning
        them)."""
        holders = self._holders
        return sum(1 for group in blocks_by_group for b in group if id(b) not in holders)

    def is_held(self, block: Any) -> bool:
        return id(block) in self._holders

    def exclusive_blocks(self, pin: Pin) -> int:
        """Blocks only ``pin`` holds: what releasing it returns to the pool."""
        holders = self._holders
        return sum(1 for group in pin.blocks_by_group for b in group if holders.get(id(b)) == 1)

    def __len__(self) -> int:
        return len(self._by_job)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._by_job

    def get(self, job_id: str) -> Pin | None:
        return self._by_job.get(job_id)

    def pins(self) -> list[Pin]:
        return list(self._by_job.values())

    def add(self, pin: Pin) -> None:
        if pin.job_id in self._by_job:
            raise KeyError(f"job {pin.job_id!r} already holds a pin; pop it first")
        self._by_job[pin.job_id] = pin
        holders = self._holders
        for group in pin.blocks_by_group:
            for block in group:
                key = id(block)
                holders[key] = holders.get(key, 0) + 1
        seq = next(self._seq)
        heapq.heappush(self._by_deadline, (pin.deadline, seq, pin))
        heapq.heappush(self._by_lateness, (-pin.job_first_arrival, seq, pin))

    def pop(self, job_id: str) -> Pin | None:
        pin = self._by_job.pop(job_id, None)
        if pin is not None:
            for group in pin.blocks_by_group:
                self._let_go(group)
            self._maybe_compact()
        return pin

    def _let_go(self, blocks: list[Any]) -> None:
        """One live pin no longer holds ``blocks``."""
        holders = self._holders
        for block in blocks:
            key = id(block)
            left = holders[key] - 1
            if left:
                holders[key] = left
            else:
                del holders[key]

    def shrink(self, pin: Pin) -> list[Any]:
        """Move a live ``pin`` to its next stage: keep its first blocks
        (group 0), take the next deadline; returns the blocks it let go
        (the caller frees them; blocks another pin holds stay held)."""
        deadline, blocks = pin.stages.pop(0)
        group = pin.blocks_by_group[0]
        dropped = group[blocks:]
        del group[blocks:]
        self._let_go(dropped)
        pin.num_blocks = sum(len(g) for g in pin.blocks_by_group)
        pin.deadline = deadline
        heapq.heappush(self._by_deadline, (deadline, next(self._seq), pin))
        return dropped

    def latest_declared_pin(self, now: float, exclude_job: str | None = None) -> Pin | None:
        """The latest-arriving job's pin among those held on the client's
        word alone at ``now`` (O(pins): only on a failed allocation)."""
        declared = [p for p in self._by_job.values() if p.job_id != exclude_job and p.declared_at(now)]
        return max(declared, key=lambda p: p.job_first_arrival, default=None)

    def _is_live(self, pin: Pin) -> bool:
        return self._by_job.get(pin.job_id) is pin

    def _is_current(self, entry: tuple[float, int, Pin]) -> bool:
        """A deadline entry of a live pin that still has that deadline (a
        pin that moved to its next stage left an entry behind)."""
        return self._is_live(entry[2]) and entry[0] == entry[2].deadline

    def next_deadline(self) -> float | None:
        heap = self._by_deadline
        while heap and not self._is_current(heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def expired(self, now: float) -> list[Pin]:
        """Live pins whose deadline is <= now, earliest first (not popped)."""
        result: list[Pin] = []
        heap = self._by_deadline
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if self._is_current(entry) and entry[2] not in result:
                result.append(entry[2])
        # Re-insert: the caller decides which of them to pop (a pin whose job
        # has a turn waiting is kept until the hand-off).
        for pin in result:
            heapq.heappush(self._by_deadline, (pin.deadline, next(self._seq), pin))
        return result

    def latest_job_pin(self, exclude_job: str | None = None) -> Pin | None:
        """The pin of the latest-arriving job, skipping ``exclude_job``."""
        heap = self._by_lateness
        skipped: list[tuple[float, int, Pin]] = []
        found: Pin | None = None
        while heap:
            entry = heap[0]
            pin = entry[2]
            if not self._is_live(pin):
                heapq.heappop(heap)
                continue
            if pin.job_id == exclude_job:
                skipped.append(heapq.heappop(heap))
                continue
            found = pin
            break
        for entry in skipped:
            heapq.heappush(heap, entry)
        return found

    def _maybe_compact(self) -> None:
        live = len(self._by_job)
        for name in ("_by_deadline", "_by_lateness"):
            heap = getattr(self, name)
            if len(heap) > 2 * live + 64:
                kept = [e for e in heap if self._is_live(e[2])]
                heapq.heapify(kept)
                setattr(self, name, kept)
