"""Backfill: a turn that fits is not kept waiting behind one that cannot.

vLLM's waiting loop stops at the first request it cannot allocate
(``allocate_slots`` returns None: with ``scheduler_reserve_full_isl``, its
default, the whole prompt must fit), so one long context at the head of the
queue holds every turn behind it until that many blocks are free, however
small they are. Under a host tier the pool is full of running decodes of
long contexts for minutes at a time: on the Claude Code traces (H100 8B,
1 session/min, 256 GiB tier) a 110k-token turn headed the queue for ~110 s
while 22k-token turns whose contexts the tier held waited behind it with
room to spare, and the mean TTFT was 0.91 s against the oracle's 0.21 s.

:class:`Backfill` takes the requests at the head of the waiting queue that
*surely* cannot be allocated in this step out of the queue for the coming
``schedule()``, so vLLM tries the first one that may fit:

* surely: even if every block of its prompt that the GPU prefix cache holds
  were a hit, its remaining blocks exceed the free ones (a lower bound on
  what ``allocate_slots`` asks; the watermark and the blocks a hit takes
  from the free queue only raise it), so the step could not have scheduled
  it: taking it out changes nothing for it in this step;
* bounded: a request is passed over for at most ``max_defer_s`` from the
  first step it was; then it blocks the queue again as in stock vLLM, so the
  blocks that free up go to it and it cannot be starved by a stream of
  smaller turns;
* cheap per step: at most ``limit`` requests from the head are looked at,
  the prefix cache is probed only for a request whose whole prompt exceeds
  the free blocks, and a request's probe resumes where its last one stopped
  (amortised O(1) lookups per step): blocks evicted since only make the
  remembered hits an over-estimate, which passes the request over less
  often, never wrongly.

Only for models with one KV cache group (full attention): with several (a
sliding window, a hybrid model) a block can be a hit in one group and gone
from another, and what a request needs is not bounded by one count.

Invariant: the requests passed over in a step are out of the waiting queue
only for that ``schedule()`` call (:meth:`Backfill.apply` before it,
:meth:`Backfill.restore` after), so every other path (aborts, stats, the
engine's "has work" checks) sees them waiting, in their own order.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from vllm.utils.math_utils import cdiv
from vllm.v1.request import Request, RequestStatus

__all__ = ["Backfill"]

# The statuses of a request vLLM's waiting loop tries to allocate.
_QUEUED = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


class Backfill:
    """Passes over head-of-queue requests that cannot fit (see module doc)."""

    def __init__(self, scheduler: Any, max_defer_s: float, limit: int = 16,
                 on_pass: Callable[[int], None] = lambda n: None) -> None:
        if max_defer_s < 0:
            raise ValueError(f"Backfill: max_defer_s must be >= 0, got {max_defer_s!r}")
        if limit < 1:
            raise ValueError(f"Backfill: limit must be >= 1, got {limit!r}")
        self._scheduler = scheduler
        self.max_defer_s = max_defer_s
        self.limit = limit
        self._on_pass = on_pass
        # request id -> when it was first passed over (kept while it waits).
        self._since: dict[str, float] = {}
        # request id -> leading prompt blocks found in the GPU prefix cache
        # by its last probe (kept while it waits).
        self._hits: dict[str, int] = {}
        self._held: list[Request] = []

    @staticmethod
    def supports(kv_cache_config: Any) -> bool:
        """Does the lower bound on a request's blocks hold for this KV
        layout (one KV cache group)?"""
        return len(kv_cache_config.kv_cache_groups) == 1

    def surely_misses(self, request: Request, free: int) -> bool:
        """Can ``request`` surely not be allocated with ``free`` blocks?"""
        sched = self._scheduler
        block_size = sched.block_size
        # (Its whole sequence: allocate_slots' full-sequence check.)
        total = cdiv(request.num_tokens, block_size)
        if total <= free:
            return False
        # Blocks of its prompt the GPU prefix cache holds (a prefix: the
        # lookup stops at the first miss, as vLLM's own does).
        pool = sched.kv_cache_manager.block_pool
        groups = [0]  # the only group (``supports``)
        hashes = request.block_hashes
        hits = self._hits.get(request.request_id, 0)
        while hits < len(hashes) and total - hits > free:
            if pool.get_cached_block(hashes[hits], groups) is None:
                break
            hits += 1
        self._hits[request.request_id] = hits
        return total - hits > free

    def apply(self, now: float) -> list[Request]:
        """Before ``schedule()``: take the head-of-queue requests that surely
        cannot be allocated (and have not been passed over for
        ``max_defer_s``) out of the waiting queue, when a request that may fit
        follows them; returns them. ``now``: a monotonic clock."""
        assert not self._held, "restore() must follow every apply()"
        sched = self._scheduler
        if not sched.running or len(sched.waiting) < 2:
            self._prune()
            return []
        free = sched.kv_cache_manager.block_pool.get_num_free_blocks()
        passed: list[Request] = []
        fits = False
        for request in itertools.islice(sched.waiting, self.limit):
            if request.status not in _QUEUED:
                break  # its own wait (a load, a grammar): vLLM skips it itself
            if not self.surely_misses(request, free):
                fits = True
                break
            since = self._since.setdefault(request.request_id, now)
            if now - since >= self.max_defer_s:
                break  # passed over long enough: it blocks as in stock vLLM
            passed.append(request)
        self._prune()
        if not fits or not passed:
            return []
        sched.waiting.remove_requests(passed)
        self._held = passed
        self._on_pass(len(passed))
        return passed

    def _prune(self) -> None:
        """Forget requests that no longer wait (bounded by the queue)."""
        requests = self._scheduler.requests
        for memo in (self._since, self._hits):
            for request_id in [r for r in memo if r not in requests or requests[r].status not in _QUEUED]:
                del memo[request_id]

    def restore(self) -> None:
        """After ``schedule()``: the passed-over requests wait again."""
        if self._held:
            for request in self._held:
                self._scheduler.waiting.add_request(request)
            self._held.clear()
