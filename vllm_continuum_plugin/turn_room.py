"""Room for a returning turn: a decode steps aside when a host tier holds it.

Under a KV connector with a host tier (vLLM's native offloading, LMCache), a
job's next turn whose context the tier holds needs little compute but its
whole context's room on the GPU. When the pool is full of running decodes,
vLLM's waiting loop stops at that turn and it waits until some request
finishes: at 0.56 sessions/min on the 70B traces with a 256 GiB tier, turns
that found their whole 46k-92k-token context in the tier waited 3-20 s for
room with six long decodes running (docs/capacity.md), and their sessions
missed a 2 s p90 TTFT bound that a pool that never fills keeps. vLLM's own
preemption only ever makes room for *running* requests.

:class:`TurnRoom` makes room for such a turn before the step: when it heads
the waiting queue, has waited ``after_s`` (natural room comes back as
decodes finish; a turn that fits is scheduled at once and never waits that
long) and the tier's measured reload beats a prefill, the decodes of jobs
ranked after it (Continuum's job order: the latest-ranked first) are
preempted, through vLLM's own ``_preempt_request``, until their blocks and
the free ones cover the turn's context. A preempted decode has had its
first token; its context, stored write-through, comes back from the tier
when it resumes (a load at the link's rate, not a prefill), so the swap
trades a stall in a younger job's decode for an older job's first token.

Bounds: only decodes (a prefill still owes its own first token), only of
jobs ranked after the turn (two turns never preempt each other back and
forth), only requests whose blocks can be freed now, at most ``max_victims``
per step, and nothing when even every candidate would not make room.

Invariant: the decodes preempted in a step are out of the waiting queue for
that ``schedule()`` call only (:meth:`TurnRoom.make_room` before it,
:meth:`TurnRoom.restore` after), so the step cannot resume what it just
preempted, and vLLM reports them preempted in that step's output.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

from vllm.utils.math_utils import cdiv
from vllm.v1.request import Request, RequestStatus

__all__ = ["TurnRoom"]


class TurnRoom:
    """Preempts younger decodes for a returning turn (see module doc)."""

    def __init__(
        self,
        scheduler: Any,
        rank: Callable[[Request], float],
        context_held: Callable[[Request], int | None],
        tier_is_cheap: Callable[[], bool],
        after_s: float,
        max_victims: int = 8,
        on_preempt: Callable[[int], None] = lambda n: None,
    ) -> None:
        if after_s < 0:
            raise ValueError(f"TurnRoom: after_s must be >= 0, got {after_s!r}")
        self._scheduler = scheduler
        self._rank = rank
        # For a later turn of a job under way whose context is held (a pin,
        # the tier): the tokens it must compute; else None (``NextTurnNeeds``).
        self._context_held = context_held
        self._tier_is_cheap = tier_is_cheap
        self.after_s = after_s
        self.max_victims = max_victims
        self._on_preempt = on_preempt
        self._held: list[Request] = []

    def _candidate(self, waiting: Iterable[Request], limit: int = 16) -> tuple[Request, list[Request]] | None:
        """The first request of ``waiting`` (in queue order) that is a new
        turn, and the preempted requests ahead of it; None when something
        else is ahead of it: a preempted request ranked before it, or more
        than ``limit`` requests."""
        ahead: list[Request] = []
        for request in itertools.islice(waiting, limit):
            if request.status == RequestStatus.WAITING:
                rank = self._rank(request)
                if all(self._rank(r) > rank for r in ahead):
                    return request, ahead
                return None
            if request.status != RequestStatus.PREEMPTED:
                return None
            ahead.append(request)
        return None

    def make_room(self, now: float) -> list[Request]:
        """Before ``schedule()``: when the first new turn in the waiting
        queue is a returning turn that has waited ``after_s`` (only decodes
        of jobs ranked after it, preempted earlier, ahead of it), preempt the
        decodes that make room for it; returns them. They, and the preempted
        requests ahead of it, are held out of the waiting queue until
        :meth:`restore`. ``now``: the clock of requests' arrival times."""
        assert not self._held, "restore() must follow every make_room()"
        sched = self._scheduler
        if not sched.running or not sched.waiting or not self._tier_is_cheap():
            return []
        found = self._candidate(sched.waiting)
        if found is None:
            return []
        turn, ahead = found
        # (None from context_held: not a later turn of a job whose context is held.)
        if now - turn.arrival_time < self.after_s or self._context_held(turn) is None:
            return []
        block_size = sched.block_size
        need = cdiv(turn.num_tokens + 1, block_size)
        free = sched.kv_cache_manager.block_pool.get_num_free_blocks()
        victims: list[Request] = []
        if need > free:
            turn_rank = self._rank(turn)
            candidates = sorted(
                (r for r in sched.running
                 if r.num_computed_tokens >= r.num_prompt_tokens  # a decode: its first token is out
                 and self._rank(r) > turn_rank and sched._request_blocks_can_be_freed(r)),
                key=self._rank, reverse=True)
            room = free
            for r in candidates[: self.max_victims]:
                victims.append(r)
                room += cdiv(r.num_computed_tokens, block_size)
                if room >= need:
                    break
            if room < need:
                return []  # not even every candidate would make room: preempt nobody
        elif not ahead:
            return []  # it fits and heads the queue: vLLM schedules it
        timestamp = time.monotonic()
        for r in victims:
            sched.running.remove(r)
            sched._preempt_request(r, timestamp, drop_stale_output=getattr(sched, "requires_kv_delivery", False))
        held = [*ahead, *victims]
        sched.waiting.remove_requests(held)
        self._held = held
        if victims:
            self._on_preempt(len(victims))
        return victims

    def restore(self) -> None:
        """After ``schedule()``: the requests held for the step wait again."""
        if self._held:
            for request in self._held:
                self._scheduler.waiting.add_request(request)
            self._held.clear()
