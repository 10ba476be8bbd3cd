"""The pin lifecycle: create, hand over, expire and release pins of KV blocks.

One home for everything that takes blocks out of vLLM's free queue for a job
and gives them back. The scheduler decides *whether* a finished turn is
pinned and for how long; this class does the block work and the timing, on
the :class:`~.clock.Clock` it is given (tests advance a manual clock instead
of sleeping).

Invariants:
* each pinned block carries exactly one reference, owned by its pin, and is
  returned to the block pool exactly once, when its pin is released;
* ``num_pinned_blocks`` (distinct blocks: a prefix that several pins hold
  counts once) ``<= max_pinned_blocks`` after every call;
* a pin whose deadline has passed is released at the next
  :meth:`release_expired`, unless its job has a turn waiting (that turn takes
  the blocks over at admission instead);
* blocks leaving a pin by TTL, memory pressure or the cap are handed to the
  offload connector (when there is one) before they are freed; a released
  pin frees only the blocks no other pin (or request) still references, so
  a shared prefix stays while any pin holds it.

Release reasons: ``pressure`` only when an allocation fell short
(:meth:`release_for`), ``cap`` when a newer pin made room under
``max_pinned_blocks`` for an older job's pin.

Declared retention (``retention``): a pin may shrink in stages (its tail
leaves at one deadline, a shorter prefix stays to a later one), and once it
is held on the client's word alone (past the policy's own TTL, or a pin the
policy would not have made) it yields first: memory pressure takes such
pins before any other, and such a pin never makes another give way under
the cap (it is trimmed to fit instead). What a client declares can cost
other clients nothing that the plugin's own pins would not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .clock import Clock
from .metrics import EngineMetrics
from .offload_backend import OffloadBackend
from .prompt_prefix import PromptPrefix
from .pin_table import Pin, PinTable, continues

logger = logging.getLogger("vllm.continuum_plugin")

__all__ = ["PinManager"]


class PinManager:
    """Pins of finished turns over vLLM's KV cache manager (see module doc)."""

    def __init__(
        self,
        kv_cache_manager: Any,
        max_pinned_blocks: int,
        metrics: EngineMetrics,
        clock: Clock,
        offload: OffloadBackend | None = None,
        on_pins_changed: Callable[[str], None] = lambda job_id: None,
        has_waiting_turn: Callable[[str], bool] = lambda job_id: False,
        block_size: int = 16,
        free_blocks: Callable[[list[Any], int | None], None] | None = None,
    ) -> None:
        self._kv_cache_manager = kv_cache_manager
        # Returns blocks (allocation order) to the pool; the second argument
        # is the step that may still write them (vLLM's deferred frees), or
        # None.
        self._free_blocks = free_blocks or (
            lambda blocks, fence: kv_cache_manager.block_pool.free_blocks(reversed(blocks))
        )
        # Tokens per block of the requests' block hashes (pins' prompts).
        self._block_size = block_size
        self.max_pinned_blocks = max_pinned_blocks
        self._metrics = metrics
        self.clock = clock
        # The plugin's offload backend (``save_blocks``), or None.
        self._offload = offload
        # Called when a job gains or loses its pin (its waiting turns change tier).
        self._on_pins_changed = on_pins_changed
        self._has_waiting_turn = has_waiting_turn
        self.table = PinTable()

    # -- read-only views ------------------------------------------------
    def __len__(self) -> int:
        return len(self.table)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.table

    def __bool__(self) -> bool:
        return len(self.table) > 0

    def get(self, job_id: str) -> Pin | None:
        return self.table.get(job_id)

    @property
    def num_pinned_blocks(self) -> int:
        return self.table.num_pinned_blocks

    def held_for(self, job_id: str | None, block_hashes: Any) -> Pin | None:
        """``job_id``'s pin, if a request with these block hashes continues
        the context it holds (see :func:`~.pin_table.continues`), else None.
        A job id belongs to nobody: only such a request may take the pin
        over, supersede or end it."""
        pin = self.table.get(job_id) if job_id is not None else None
        return pin if pin is not None and continues(pin, block_hashes) else None

    def continued_by(self, job_id: str, block_hashes: Any) -> bool | None:
        """None when ``job_id`` holds no pin, else whether a request with
        these block hashes continues it (:meth:`held_for`)."""
        if job_id not in self.table:
            return None
        return self.held_for(job_id, block_hashes) is not None

    def next_deadline(self) -> float | None:
        """Earliest deadline of a live pin (monotonic seconds), or None."""
        return self.table.next_deadline()

    def is_due(self) -> bool:
        """A pin's deadline has passed and :meth:`release_expired` would
        release it (the engine should run a step). A lapsed pin kept for its
        job's waiting turn does not count: with scheduling paused that turn
        waits, and reporting work for it would spin the engine."""
        now = self.clock.monotonic()
        deadline = self.table.next_deadline()
        if deadline is None or deadline > now:
            return False
        return any(not self._has_waiting_turn(pin.job_id) for pin in self.table.expired(now))

    # -- creating pins ----------------------------------------------------
    def pin(
        self,
        request: Any,
        job_id: str,
        job_first_arrival: float,
        ttl_s: float,
        tool_key: str,
        speed: str | None = None,
        fence: int | None = None,
        stages: tuple[tuple[float, int], ...] = (),
        declared_after_s: float | None = None,
    ) -> Pin | None:
        """Take the finished ``request``'s blocks out of its KV managers and
        pin the hashed ones for ``ttl_s``; the rest is freed at once. Returns
        None when nothing could be pinned (no full block, or no room).

        ``stages`` (a declared retention's ``RetentionPlan.stages``: holds
        ascending, blocks decreasing) replaces ``ttl_s``: the first
        ``stages[0][1]`` blocks are pinned for ``stages[0][0]`` seconds,
        then the pin shrinks stage by stage (one KV group; with several,
        the first stage is the whole pin). ``declared_after_s``: from then
        on the pin is held on the client's word alone (module doc).

        ``fence``: the step that may still write these blocks (vLLM defers
        frees with async scheduling and a KV-consumer connector). Holding
        them in a pin is safe; whatever leaves the pin before that step is
        processed goes through vLLM's deferred frees."""
        keep_by_group: list[list[Any]] = []
        managers = self._kv_cache_manager.coordinator.single_type_managers
        for manager in managers:
            blocks = manager.pop_blocks_for_free(request.request_id)
            # Only blocks with a hash can be found by the next turn's prefix
            # lookup; the partial tail block is of no use to it.
            keep = [b for b in blocks if b.block_hash is not None and not b.is_null]
            if stages and len(managers) == 1:
                keep = keep[:stages[0][1]]
            keep_ids = {id(b) for b in keep}
            drop = [b for b in blocks if id(b) not in keep_ids]
            if drop:
                self._free_blocks(drop, fence)
            keep_by_group.append(keep)
        declared_only = declared_after_s is not None and declared_after_s <= 0
        keep_by_group = self._fit_under_cap(keep_by_group, job_id, job_first_arrival, fence,
                                            displace=not declared_only)
        if not any(keep_by_group):
            self._metrics.on_ttl_decision(0.0)
            return None
        now = self.clock.monotonic()
        later: list[tuple[float, int]] = []
        if stages:
            ttl_s = stages[0][0]
            if len(keep_by_group) == 1:
                # The cap may have trimmed the pin into a later stage: its
                # blocks then hold as long as that stage does.
                kept = len(keep_by_group[0])
                first = max(i for i, (_, blocks) in enumerate(stages) if blocks >= kept or i == 0)
                ttl_s = stages[first][0]
                later = [(now + hold, blocks) for hold, blocks in stages[first + 1:]]
        pin = Pin(
            job_id=job_id,
            request_id=request.request_id,
            blocks_by_group=keep_by_group,
            job_first_arrival=job_first_arrival,
            created_at=now,
            deadline=now + ttl_s,
            ttl_s=ttl_s,
            tool_key=tool_key,
            speed=speed,
            prefix=PromptPrefix.of_request(request, self._block_size),
            fence=fence,
            stages=later,
            declared_from=None if declared_after_s is None else now + declared_after_s,
        )
        self.table.add(pin)
        self._on_pins_changed(job_id)
        self._metrics.on_pin(ttl_s, pin.num_blocks, self.table.num_pinned_blocks, len(self.table))
        logger.debug(
            "continuum: pinned %d blocks of job %s for %.3fs (tool %r)",
            pin.num_blocks, job_id, ttl_s, tool_key,
        )
        return pin

    def _fit_under_cap(
        self, keep_by_group: list[list[Any]], job_id: str, job_first_arrival: float, fence: int | None = None,
        displace: bool = True,
    ) -> list[list[Any]]:
        """Make room under the pin cap, or shrink the pin to fit.

        The cap counts distinct blocks: the part of this pin that other pins
        already hold (a shared system prompt) costs nothing. Pins of jobs
        that arrived later than this one give way first (job-level FCFS;
        release reason ``cap``); what still does not fit is trimmed from the
        tail, so a shared prefix is kept (single KV group), or not pinned at
        all (several groups, which must stay consistent). A pin held on a
        client's word alone (``displace`` False) makes nobody give way; any
        other makes such pins give way first, whoever arrived first.
        """
        table = self.table
        needed = table.new_blocks(keep_by_group)
        now = self.clock.monotonic()
        while displace and table.num_pinned_blocks + needed > self.max_pinned_blocks:
            declared = table.latest_declared_pin(now, exclude_job=job_id)
            if declared is None:
                break
            self.release(declared.job_id, "cap")
            needed = table.new_blocks(keep_by_group)
        while displace and table.num_pinned_blocks + needed > self.max_pinned_blocks:
            victim = table.latest_job_pin(exclude_job=job_id)
            if victim is None or victim.job_first_arrival <= job_first_arrival:
                break
            self.release(victim.job_id, "cap")
            # Blocks the victim shared with this pin are new again.
            needed = table.new_blocks(keep_by_group)
        room = self.max_pinned_blocks - table.num_pinned_blocks
        if needed <= room:
            return keep_by_group
        if len(keep_by_group) == 1:
            kept = self._prefix_within(keep_by_group[0], room)
            dropped = keep_by_group[0][len(kept):]
            self._offload_blocks(dropped, job_id)
            self._free_blocks(dropped, fence)
            self._metrics.on_blocks_trimmed(len(dropped))
            return [kept]
        self._offload_blocks(keep_by_group[0], job_id)
        for group in keep_by_group:
            if group:
                self._free_blocks(group, fence)
        self._metrics.on_blocks_trimmed(sum(len(g) for g in keep_by_group))
        return [[] for _ in keep_by_group]

    def _prefix_within(self, blocks: list[Any], room: int) -> list[Any]:
        """The longest prefix of ``blocks`` that adds at most ``room`` blocks
        no pin holds yet (blocks other pins hold are free to keep)."""
        held = self.table.is_held
        new = 0
        for i, block in enumerate(blocks):
            if not held(block):
                new += 1
                if new > room:
                    return blocks[:i]
        return blocks

    def _offload_blocks(self, blocks: list[Any], job_id: str) -> None:
        # The copy runs before the next forward pass, so freeing right after
        # is safe (the connector orders it before any reuse of the blocks).
        # The job expects its next turn: the store holds the blocks for it.
        if self._offload is not None and blocks:
            self._offload.save_blocks(blocks, hold_job=job_id)

    # -- ending pins ------------------------------------------------------
    def hand_over(self, job_id: str, block_hashes: Any, cached_tokens: int) -> bool:
        """A request with these block hashes was admitted with a prefix hit
        of ``cached_tokens``: if it continues ``job_id``'s pin, the pinned
        blocks are its own now and the pin goes ("handoff"). Returns whether
        it did."""
        pin = self.held_for(job_id, block_hashes)
        if pin is None:
            return False
        # The pin holds the job's previous prefix, so a hit covers the
        # pinned blocks first (group 0: the full-attention prefix).
        pinned_tokens = len(pin.blocks_by_group[0]) * self._block_size if pin.blocks_by_group else 0
        self.release(job_id, "handoff", hit_tokens=min(cached_tokens, pinned_tokens))
        return True

    def release(self, job_id: str, reason: str, hit_tokens: int = 0) -> bool:
        """End ``job_id``'s pin (if any) and return its blocks to the pool."""
        pin = self.table.pop(job_id)
        if pin is None:
            return False
        if reason in ("ttl", "pressure", "cap") and pin.blocks_by_group:
            self._offload_blocks(pin.blocks_by_group[0], job_id)
        for group in pin.blocks_by_group:
            if group:
                self._free_blocks(group, pin.fence)
        if pin.declared_from is not None:
            # Honoured: it lasted its declared hold or its job came back for
            # it; overridden: memory (pressure, the cap) took it first.
            self._metrics.on_declared_release(reason in ("handoff", "ttl"))
        if reason != "handoff":
            # After a hand-off the job's prefix is held by its running turn,
            # so its other waiting turns (overlapping requests) keep the
            # pinned-job tier: re-keying them would cost a heap push each on
            # the admission path and only move them behind colder jobs.
            self._on_pins_changed(job_id)
        self._metrics.on_release(reason, hit_tokens, self.table.num_pinned_blocks, len(self.table), pin.speed)
        logger.debug(
            "continuum: released pin of job %s (%d blocks, reason %s, %d tokens hit)",
            job_id, pin.num_blocks, reason, hit_tokens,
        )
        return True

    def release_expired(self) -> int:
        """Release pins past their deadline whose job has no turn waiting
        (a waiting turn takes the blocks over at admission instead); a pin
        with a later stage shrinks to it instead (its tail goes as a TTL
        release does: offloaded when there is a store, then freed)."""
        released = 0
        for pin in self.table.expired(self.clock.monotonic()):
            if self._has_waiting_turn(pin.job_id):
                continue
            if pin.stages:
                dropped = self.table.shrink(pin)
                self._offload_blocks(dropped, pin.job_id)
                self._free_blocks(dropped, pin.fence)
                logger.debug("continuum: pin of job %s shrank to %d blocks until its declared stage ends",
                             pin.job_id, pin.num_blocks)
                continue
            released += self.release(pin.job_id, "ttl")
        return released

    def release_all(self, reason: str) -> int:
        released = 0
        for pin in self.table.pins():
            released += self.release(pin.job_id, reason)
        return released

    def release_for(
        self,
        own_job: str | None,
        own_arrival: float,
        any_pin: bool,
        retry: Callable[[], Any],
    ) -> Any:
        """Soft pins: release pins, latest-arriving job first, until
        ``retry()`` (an allocation) succeeds; returns its last result.

        ``any_pin`` lets every other job's pin go; otherwise only pins of
        jobs that arrived after ``own_arrival`` (job-level FCFS applied to
        memory). ``own_job``'s pin is never released here. Pins held on a
        client's word alone go first, whoever's turn asks.
        """
        result = None
        while result is None:
            victim = self.table.latest_declared_pin(self.clock.monotonic(), exclude_job=own_job)
            if victim is not None:
                self.release(victim.job_id, "pressure")
                result = retry()
                continue
            victim = self.table.latest_job_pin(exclude_job=own_job)
            if victim is None or (not any_pin and victim.job_first_arrival <= own_arrival):
                break
            self.release(victim.job_id, "pressure")
            result = retry()
        return result
