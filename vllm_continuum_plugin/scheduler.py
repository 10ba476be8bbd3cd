"""Continuum scheduler hooks over vLLM's own ``Scheduler`` / ``AsyncScheduler``.

The mixin overrides a handful of methods and leaves vLLM's scheduling loop,
block manager and kernels untouched:

* ``add_request`` -- parses job metadata (``request_record``). A job id
  names a session of up to several conversations (sub-agents, side
  requests): a request acts on the one whose context it continues (its pin
  or a recent turn's prompt), or starts a new one
  (:class:`~.conversations.Conversations`); never on another's. An
  untagged request whose prompt continues a finished untagged turn of its
  client scope -- an agent's tool call, or an answer: a chat -- is that
  implicit job's next turn (``implicit_jobs``).
  Measures tool time and queues the request in the job-aware
  ``ContinuumRequestQueue``.
* ``_free_request_blocks`` -- what a finished turn becomes, in
  :mod:`~.finished_turns`. **Pin**: a non-final agent turn (or a chat's
  answer) that finished normally keeps its hashed blocks for the TTL the
  decider chooses; TTL 0 offloads (with the plugin's connector) and frees.
  **End the job**: its last step (the client's flag, a finish action, a
  final answer) or an abort; a known last turn puts the job's own blocks
  first in line for eviction. Preemption, one-shot untagged traffic and
  disabled prefix caching free as usual.
* ``schedule`` -- releases expired pins (TTL) before the step, orders
  ``running`` so that vLLM's "preempt running[-1]" picks the latest-arriving
  job not on its last step, takes the new jobs' first turns that the
  :class:`~.admission.AdmissionGate` holds out of the waiting queue for the
  step (and puts them back after it), cuts long prefills for the step
  while a job's next turn heads the waiting queue
  (:class:`~.prefill_chunks.PrefillChunks`), and hands pins over to next
  turns that were admitted in the step (their blocks are now referenced by
  the new request).
* ``kv_cache_manager.allocate_slots`` (wrapped on the instance by
  :class:`~.soft_pins.SoftPins`, only in steps where an allocation could
  fail) -- **soft pins**: when an allocation would fail, pins are released
  (latest-arriving job first) and the allocation retried, before vLLM
  preempts a running request; a waiting request (or a whole idle engine)
  likewise, except that a waiting request of a newer job does not evict an
  older job's pin.
* ``update_from_output`` / ``has_requests`` -- time prefills, and keep an
  idle engine waking for the next pin deadline (:mod:`~.wakeup`).
* ``_update_waiting_for_remote_kv`` -- with a KV connector the plugin does
  not drive (vLLM's native offloading, LMCache), times the loads of later
  turns from that connector's tier (:class:`~.foreign_tier.ForeignTier`), so a
  dropped context is priced as the reload it costs, not a prefill.
* ``reset_prefix_cache`` / ``shutdown`` -- release every pin first.

The pin lifecycle (taking blocks, the cap, expiry, release, hand-over,
soft-pin victims) lives in :class:`~.pin_manager.PinManager`, where a
request ranks (bounded job-level FCFS) in :class:`~.job_order.JobOrder`,
the TTL's inputs (holding against rebuilding a context, the client's round
trip) in :class:`~.context_costs.ContextCosts`; every time the scheduler
reads comes from the :class:`~.clock.Clock` it was constructed with
(``clock=``, default the system clock), so tests advance time instead of
sleeping.

Invariants: each pinned block carries exactly one reference owned by its pin;
``PinTable.pop`` returns a pin at most once and its blocks are returned to the
pool exactly then; the pinned share of the pool (distinct blocks) never
exceeds ``max_pinned_fraction``; a first turn the admission gate holds is
out of the waiting queue only inside ``schedule()`` and never longer than
``admission_max_wait_s`` in all; untagged requests that continue no earlier
untagged turn and whose reply calls no tool are never pinned (the gate may
hold them as newcomers: ``admission_untagged``), and every untagged request
when ``implicit_jobs`` is off behaves exactly as FCFS; client metadata always
wins over an implicit match; a request that does not continue the context
of the job it names never changes that job's state (its end, tool time,
order or pin); ending a job never changes which blocks are free, only the
order in which free cached blocks are evicted.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from .admission import AdmissionGate
from .clock import SYSTEM_CLOCK, Clock
from .config import ContinuumConfig, load_config, tier_mode_on
from .estimators.history import JobTracker, SlidingMean, TurnCountCorrelation
from .decisions import Decider, make_decider
from .declared_holds import DeclaredHolds
from .estimators.parser import NO_TOOL_KEY
from .estimators.prefill import PrefillCostModel, PrefillTimer
from .estimators.round_trip import RoundTripOverhead
from .estimators.ttl import ScopedToolHistory, TTLPolicy, make_ttl_policy
from .implicit_jobs import ImplicitJobIndex, has_token_prompt, is_implicit_chat, untagged_turn_key
from .conversations import Conversations
from .job_queue import ContinuumRequestQueue, WaitingTurns
from .job_order import JobOrder
from .metadata import JobMetadata
from .request_record import parse_request_metadata, request_meta, set_request_meta
from .metrics import EngineMetrics
from .context_costs import ContextCosts
from .foreign_tier import ForeignTier
from .host_tier_order import FinishedFirstLRUCachePolicy, install_finished_first
from .gate_feed import GateFeed
from .finished_turns import FinishedTurnsMixin
from .offload_backend import OffloadBackend, find_offload_backend
from .pin_manager import PinManager
from .prefetch import Prefetcher
from .soft_pins import SoftPins
from .backfill import Backfill
from .turn_room import TurnRoom
from .policies import PLUGIN_POLICIES
from .prefill_chunks import NextTurnNeeds, PrefillChunks
from .reply_reader import ReplyReader
from .tier_capacity import TierCapacity, tier_capacity
from .turn_facts import TurnReader
from .turn_outcome import TurnRules
from .wakeup import EngineWaker

logger = logging.getLogger("vllm.continuum_plugin")

__all__ = [
    "ContinuumAsyncScheduler",
    "ContinuumScheduler",
    "ContinuumSchedulerMixin",
    "PLUGIN_POLICIES",
]


class ContinuumSchedulerMixin(FinishedTurnsMixin):
    """Continuum behaviour for any vLLM ``Scheduler`` subclass (see module
    doc; the block-freeing path is :class:`~.finished_turns.FinishedTurnsMixin`)."""

    # Attributes the mixin relies on from vLLM's Scheduler (for type checkers).
    kv_cache_manager: Any
    cache_config: Any
    scheduler_config: Any
    running: list[Request]
    requests: dict[str, Request]
    waiting: Any
    kv_holding_waiting: Any
    structured_output_manager: Any
    vllm_config: Any
    block_size: int
    max_num_scheduled_tokens: int

    def __init__(self, vllm_config: Any, *args: Any, clock: Clock = SYSTEM_CLOCK, **kwargs: Any) -> None:
        self.clock = clock
        scheduler_config = vllm_config.scheduler_config
        requested_policy = str(scheduler_config.policy)
        # vLLM's Scheduler only knows its own policies; give it FCFS for the
        # duration of its constructor (our queue replaces its queues below).
        scheduler_config.policy = "fcfs"
        try:
            super().__init__(vllm_config, *args, **kwargs)  # type: ignore[call-arg]
        finally:
            scheduler_config.policy = requested_policy
        # With an explicit --scheduler-cls and a stock policy, the class
        # itself selects Continuum.
        self.continuum_policy = requested_policy if requested_policy in PLUGIN_POLICIES else "continuum"
        self.continuum_config: ContinuumConfig = load_config(vllm_config.additional_config)
        cfg = self.continuum_config

        self.jobs = JobTracker(cfg.max_jobs, cfg.job_idle_reset_s)
        # A job id names a session's conversations: a request acts on the
        # one whose context it continues.
        self.conversations = Conversations(
            self.block_size, cfg.max_jobs,
            on_mismatch=lambda: self.continuum_metrics.on_context_mismatch(),
            on_new_conversation=lambda: self.continuum_metrics.on_new_conversation(),
            on_evict=self.jobs.forget_if_idle,  # a key used again starts afresh
        )
        # Learned per client scope (estimators.scopes): one client's traffic
        # never retunes another's TTLs.
        self.round_trip = RoundTripOverhead(cfg.round_trip_default_s, max_scopes=cfg.max_scopes)
        self.tool_history = ScopedToolHistory(cfg.history_max_samples, cfg.history_max_tools, cfg.max_scopes)
        self.prefill_cost = PrefillCostModel(cfg.prefill_seconds_per_token)
        self.evicted_queueing_delay = SlidingMean(256)
        self.turn_correlation = TurnCountCorrelation()
        self.ttl_policy: TTLPolicy = make_ttl_policy(
            cfg.ttl_policy, self.tool_history, self.prefill_cost, default_ttl_s=cfg.default_ttl_s,
            max_ttl_s=cfg.max_ttl_s, fixed_ttl_s=cfg.fixed_ttl_s, cold_start_samples=cfg.cold_start_samples,
        )
        self.decider: Decider = make_decider(self.continuum_policy, cfg, self.ttl_policy, self.prefill_cost)
        # The plugin's offload connector, when configured: blocks leaving a
        # pin (TTL, pressure) or a SLOW turn are stored before they are freed.
        self.offload: OffloadBackend | None = find_offload_backend(self.connector)
        if self.offload is not None:
            self.offload.set_clock(clock)  # store holds lapse on the pins' clock
        # Any other KV connector (vLLM's native offloading, LMCache) may keep
        # a second tier the plugin does not drive: learn what reloading from
        # it costs, so a dropped context is priced as a reload, not a prefill.
        self.tier: ForeignTier | None = (
            ForeignTier(self.block_size, self.prefill_cost.seconds)
            if self.connector is not None and self.offload is None
            else None
        )
        # vLLM's native host tier (LRU): an ended job's blocks go first, not
        # last (host_tier_order).
        self.tier_order: FinishedFirstLRUCachePolicy | None = (
            install_finished_first(self.connector) if self.tier is not None and cfg.tier_finished_first else None
        )
        self.pinning_enabled = bool(self.cache_config.enable_prefix_caching)
        # Untagged agents: finished turns that called a tool, found again by
        # the prefix of their next turn (needs block hashes: prefix caching).
        self.implicit_jobs: ImplicitJobIndex | None = (
            ImplicitJobIndex(self.block_size, cfg.implicit_max_jobs, cfg.implicit_max_blocks)
            if cfg.implicit_jobs and self.pinning_enabled
            else None
        )
        block_pool = self.kv_cache_manager.block_pool
        usable_blocks = max(0, block_pool.num_gpu_blocks - 1)  # minus the null block

        self.order = JobOrder(cfg.job_priority_window_s, has_pin=self._continues_pin)
        self.waiting = ContinuumRequestQueue(self.order.queue_key)
        self.kv_holding_waiting = ContinuumRequestQueue(self.order.queue_key)
        self._waiting_turns = WaitingTurns()
        self._running_order_dirty = True
        self._prefills = PrefillTimer(self.prefill_cost)
        self.replies = ReplyReader(self._load_tokenizer, cfg.pin_on_stop_string)
        self.costs = ContextCosts(
            block_pool, self.block_size, self.prefill_cost, self.offload, self.tier,
            self.round_trip, self.evicted_queueing_delay, self.turn_correlation,
        )
        self._waker = EngineWaker(clock)

        parallel = vllm_config.parallel_config
        self.continuum_metrics = EngineMetrics(
            self.continuum_policy, getattr(parallel, "data_parallel_index", 0) or 0
        )
        if self.tier_order is not None:
            self.tier_order.on_demoted = self.continuum_metrics.on_tier_evicted_first
        self.pins = PinManager(
            self.kv_cache_manager,
            max_pinned_blocks=int(cfg.max_pinned_fraction * usable_blocks),
            metrics=self.continuum_metrics,
            clock=clock,
            offload=self.offload,
            on_pins_changed=self._reprioritize_job,
            has_waiting_turn=self._has_waiting_turn,
            block_size=self.block_size,
            free_blocks=self._free_after_fence,
        )
        self.turns = TurnReader(
            self.replies, self.jobs, self.pins, frozenset(cfg.finish_action_list),
            TurnRules(implicit_jobs=self.implicit_jobs is not None, pinning=self.pinning_enabled),
            beside_an_agent=lambda key: self.conversations.beside_an_agent(key, self.jobs.get),
            answers_return=self.implicit_jobs.answers_return if self.implicit_jobs is not None else lambda s: False,
        )
        # A finished request's declared retention (retention directives).
        self.declared = DeclaredHolds(
            self.kv_cache_manager, self.pins, self.continuum_metrics, self.block_size, cfg.retention_max_s,
            rank=self.order.ranked_arrival, free=self._stock_free,
        )
        self.soft_pins = SoftPins(
            self, self.pins, self.order,
            pins_are_cheap=self.tier.pins_are_cheap if self.tier is not None else lambda: False,
        )
        # With a host tier of known size the gate bounds what the pool and
        # the tier keep together; with another connector it stays off.
        self.gate_tier: TierCapacity | None = tier_capacity(vllm_config, self.kv_cache_config)
        self.gate_feed: GateFeed | None = GateFeed.create(
            cfg, usable_blocks, self.block_size, self.order.queue_key, self.tool_history, self.pins,
            self.gate_tier, self.connector, has_waiting_turn=lambda job_id: bool(self._waiting_turns.of(job_id)),
        ) if self.pinning_enabled else None
        self.admission: AdmissionGate | None = self.gate_feed.gate if self.gate_feed is not None else None
        # A job's next turn does not wait behind another's long prefill
        # (by default only under a KV connector: see cut_long_prefills).
        has_tier = self.connector is not None
        cut = tier_mode_on(cfg.cut_long_prefills, has_tier)
        # What a waiting next turn must compute over its held context: one
        # estimate for the prefill cut and turn_room (a foreign tier implies
        # a connector, so has_tier holds for both).
        next_turn_needs = NextTurnNeeds(self.jobs, self.pins, self.block_size, has_tier)
        self.prefill_chunks: PrefillChunks | None = PrefillChunks(
            self.scheduler_config, self.max_num_scheduled_tokens, self.block_size,
            next_turn_needs,
            on_cut=self.continuum_metrics.on_prefill_cut,
        ) if cut else None
        # A job's next turn whose context a foreign host tier holds is not
        # kept waiting for GPU room by younger jobs' decodes (turn_room).
        self.turn_room: TurnRoom | None = TurnRoom(
            self, self.order.ranked_arrival, next_turn_needs,
            self.tier.pins_are_cheap, cfg.preempt_for_turns_after_s,
            on_preempt=self.continuum_metrics.on_turn_room_preemptions,
        ) if self.tier is not None and cfg.preempt_for_turns and self.pinning_enabled else None
        # A turn that fits is not kept waiting behind one at the head of the
        # queue that cannot (by default only under a KV connector: backfill).
        self.backfill: Backfill | None = Backfill(
            self, cfg.backfill_max_defer_s, on_pass=self.continuum_metrics.on_backfill,
        ) if tier_mode_on(cfg.backfill, has_tier) and Backfill.supports(self.kv_cache_config) else None
        # A job's context goes back to the GPU from the foreign host tier
        # before its tool is predicted back (prefetch).
        self.prefetch: Prefetcher | None = Prefetcher(
            self, self.pins, self.tool_history, self._tier_reload_seconds, clock,
            cfg.prefetch_quantile, cfg.prefetch_max_bytes, cfg.prefetch_reserve,
            on_event=self.continuum_metrics.on_prefetch,
        ) if self.tier is not None and cfg.prefetch and self.pinning_enabled else None
        logger.info(
            "vllm-continuum-plugin active: policy=%s ttl_policy=%s scheduler=%s prefix_caching=%s "
            "max_pinned_blocks=%d implicit_jobs=%s admission=%s prefill_cuts=%s turn_room=%s backfill=%s "
            "tier_finished_first=%s prefetch=%s decider=%s",
            self.continuum_policy,
            cfg.ttl_policy, type(self).__name__, self.pinning_enabled, self.max_pinned_blocks,
            self.implicit_jobs is not None,
            "off" if self.admission is None else f"{self.admission.capacity_blocks} blocks"
            + (f" (pool and {self.gate_tier.connector}'s host tier)" if self.gate_tier else ""),
            self.prefill_chunks is not None, self.turn_room is not None, self.backfill is not None,
            self.tier_order is not None, self.prefetch is not None, type(self.decider).__name__,
        )
        if not self.pinning_enabled:
            logger.warning(
                "vllm-continuum-plugin: prefix caching is disabled, so finished "
                "turns cannot be reused; no KV will be pinned (job ordering still applies)"
            )

    @property
    def max_pinned_blocks(self) -> int:
        return self.pins.max_pinned_blocks

    def _tier_reload_seconds(self, tokens: int) -> float:
        """What reloading ``tokens`` of context from the foreign tier takes
        (measured; a prefill while nothing is measured)."""
        assert self.tier is not None
        seconds = self.tier.rebuild_seconds(tokens)
        return seconds if seconds is not None else self.prefill_cost.seconds(tokens, 0)

    # ------------------------------------------------------------------
    # Queue ordering (the rule lives in JobOrder)
    # ------------------------------------------------------------------
    def _continues_pin(self, request: Request) -> bool:
        """Does ``request`` continue the context its job's pin holds? (Only
        then may it take the pin over, end it or jump the queue on it.)"""
        return self.pins.held_for(request_meta(request).job_id, request.block_hashes) is not None

    def _has_waiting_turn(self, job_id: str) -> bool:
        """A waiting request continues the job's pin (keep it past its deadline)."""
        return any(self._continues_pin(r) for r in self._waiting_turns.of(job_id))

    def _reprioritize_job(self, job_id: str) -> None:
        # Only a request with its job's credit can change tier.
        credited = [r for r in self._waiting_turns.of(job_id) if self.order.has_credit(r)]
        if credited:
            self.waiting.reprioritize(credited)
            self.kv_holding_waiting.reprioritize(credited)

    # ------------------------------------------------------------------
    # Request arrival
    # ------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if self.prefetch is not None and self.prefetch.owns(request.request_id):
            super().add_request(request)  # type: ignore[misc]
            return
        if request.request_id not in self.requests:
            meta = parse_request_metadata(request)
            if meta.job_id is not None:  # the session's conversation it continues
                meta = self.conversations.resolve(
                    request, meta, self.jobs.get, lambda key: self.pins.continued_by(key, request.block_hashes)
                )
            elif self.implicit_jobs is not None and has_token_prompt(request):
                meta = self._match_implicit_job(request, meta)
                if meta.job_id is None and self._counts_untagged(request):
                    # Continues nothing: a new chat or agent that sends no
                    # session id, held like a new job's first turn.
                    self.admission.on_first_turn(request)
            set_request_meta(request, meta)
            if meta.job_id is not None:
                if meta.tools_offered and self.jobs.get(meta.job_id) is None:  # an agent's new conversation
                    # A title sent before the agent's first turn: its one turn was its last.
                    for key in self.conversations.side_requests(meta.job_id, self.jobs.get, meta.scope):
                        self._forget_job(key, "final_answer", "last_step")
                self._on_job_arrival(request, meta)
        super().add_request(request)  # type: ignore[misc]

    def _match_implicit_job(self, request: Request, meta: JobMetadata) -> JobMetadata:
        """An untagged request whose prompt continues a finished implicit-job
        turn is that job's next turn (O(log n) lookups, see implicit_jobs)."""
        assert self.implicit_jobs is not None
        job_id = self.implicit_jobs.match(
            request.block_hashes, request.prompt_token_ids, self.replies.decode, meta.scope
        )
        if job_id is None:
            return meta
        if is_implicit_chat(job_id) and self.jobs.get(job_id) is None:
            # A prompt continued an untagged answer: a chat is a job from now on.
            self.continuum_metrics.on_implicit_turn("started")
        self.continuum_metrics.on_implicit_turn("continued")
        logger.debug("continuum: request %s continues implicit job %r", request.request_id, job_id)
        return dataclasses.replace(meta, job_id=job_id)

    def _on_job_arrival(self, request: Request, meta: JobMetadata) -> None:
        assert meta.job_id is not None
        if self.prefetch is not None:
            self.prefetch.on_arrival(meta.job_id)
        job, measured, tool_key = self.jobs.on_arrival(meta.job_id, request.arrival_time, meta.scope)
        if meta.tools_offered is not None:  # known from the first turn on (an agent beside a title)
            job.tools_offered = meta.tools_offered
        self.order.credit(request, job)
        if measured is not None and meta.scope != job.scope:
            # Another client's request under this job id: its gap is no tool
            # time of the job's client, and it teaches no scope.
            logger.debug("continuum: request %s of another scope names job %s; no tool time learned",
                         request.request_id, meta.job_id)
            measured = None
        if measured is not None:
            if job.last_tool_s is not None:
                self.round_trip.observe(job, measured, job.last_tool_s)
            self.tool_history.record(tool_key or NO_TOOL_KEY, measured, job.scope)
            self.decider.observe(job.last_call, measured, job.scope)
            self.continuum_metrics.on_tool_time(measured, job.last_predicted_s)
        self._waiting_turns.add(meta.job_id, request)
        if (self.admission is not None and job.turns_finished == 0 and job.in_flight == 1
                and not is_implicit_chat(meta.job_id)):
            # A new session's first turn; a known session's new conversation
            # (a sub-agent, a side request) only with admission_sub_agents,
            # and then ahead of every stranger's (else it is never held);
            # never an implicit chat (its first turn was served already).
            known = self.conversations.has_siblings(meta.job_id)
            if not known or self.continuum_config.admission_sub_agents:
                self.admission.on_first_turn(request, known_session=known)

    def _counts_untagged(self, request: Request) -> bool:
        """Does the admission gate count this untagged request (a newcomer
        that may start an implicit job; ``admission_untagged``)?"""
        return (self.admission is not None and self.implicit_jobs is not None
                and self.continuum_config.admission_untagged and has_token_prompt(request))

    def _forget_waiting(self, request: Request) -> None:
        if self.admission is not None:  # an untagged first turn may be held too
            self.admission.forget(request)
        job_id = request_meta(request).job_id
        if job_id is not None:
            self._waiting_turns.discard(job_id, request)

    # ------------------------------------------------------------------
    # Scheduling step
    # ------------------------------------------------------------------
    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        if not self._waker.attached:
            self._waker.attach()
        self.pins.release_expired()
        prefetch = self.prefetch
        if prefetch is not None:
            prefetch.complete()  # a reported load is pinned before vLLM would run it
        self.soft_pins.arm()
        if self._running_order_dirty:
            self.order.sort_running(self.running)
            self._running_order_dirty = False
        gate = self.admission
        if gate is not None:
            gate.hold_back(self.waiting, bool(self.running), self.clock.time())
        room = self.turn_room
        if room is not None:
            room.make_room(self.clock.time())
        backfill = self.backfill
        if backfill is not None:
            backfill.apply(self.clock.monotonic())
        chunks = self.prefill_chunks
        if chunks is not None:
            chunks.apply((self.kv_holding_waiting, self.waiting), self.running)
        if prefetch is not None:
            prefetch.hold(self.waiting)  # a turn waits for its context's load in flight
            prefetch.start(self.waiting, self.kv_holding_waiting)
        try:
            output: SchedulerOutput = super().schedule(*args, **kwargs)  # type: ignore[misc]
        finally:
            if prefetch is not None:
                prefetch.restore(self.waiting)
                prefetch.after_schedule()
            if chunks is not None:
                chunks.restore()
            if backfill is not None:
                backfill.restore()
            if room is not None:
                room.restore()
            if gate is not None:
                self.continuum_metrics.on_admission(gate.restore(self.waiting))
        if output.scheduled_new_reqs or output.scheduled_cached_reqs.resumed_req_ids:
            self._running_order_dirty = True
            self._after_admission(output)
        if self.tier is not None:
            self.tier.after_step(self._waiting_turns.by_job(), self.clock.monotonic())
        if output.preempted_req_ids:
            self._running_order_dirty = True
        # (The waker's deadline is refreshed in update_from_output, which
        # the engine runs after every schedule().)
        return output

    def _after_admission(self, output: SchedulerOutput) -> None:
        now = self.clock.monotonic()
        wall_now = self.clock.time()
        for new_req in output.scheduled_new_reqs:
            request = self.requests.get(new_req.req_id)
            if request is None:
                continue
            self._forget_waiting(request)
            num_new = output.num_scheduled_tokens.get(new_req.req_id, 0)
            # Prefix-cache hit of this admission (local + external tokens).
            cached = new_req.num_computed_tokens
            if num_new > 0:  # tokens this admission must compute
                self._prefills.start(request.request_id, now, request.num_prompt_tokens - cached, cached)
            job_id = request_meta(request).job_id
            if job_id is None:
                if self._counts_untagged(request):  # counted while it runs (gate_feed)
                    self.admission.on_admitted(untagged_turn_key(request.request_id), request)
                continue
            job = self.jobs.get(job_id)
            if job is not None and job.turns_finished == 0 and job.first_hit_tokens is None:
                job.first_hit_tokens = cached
            if self.tier is not None:
                self.tier.admitted(request, job)
            if self.admission is not None:
                self.admission.on_admitted(job_id, request)
            if self.offload is not None:
                # This turn's reload (if any) was planned in this step; the
                # store's entries of the job are plain LRU entries from now.
                self.offload.end_hold(job_id)
            if not self.pins.hand_over(job_id, request.block_hashes, cached):
                if job is not None and job.turns_finished > 0:
                    # A later turn whose KV was not kept: the queueing delay it
                    # saw is the paper's T.
                    self.evicted_queueing_delay.add(max(0.0, wall_now - request.arrival_time))

    def _update_waiting_for_remote_kv(self, request: Request) -> None:
        failed = request.request_id in self.failed_recving_kv_req_ids
        super()._update_waiting_for_remote_kv(request)  # type: ignore[misc]
        if self.tier is not None:
            self.tier.load_finished(request.request_id, self.clock.monotonic(), failed)

    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        if self._prefills:
            self._prefills.observe(self.requests, self.clock.monotonic())
        # Pins created by requests that finished in this step need a wake-up
        # even if the engine goes idle right after.
        self._waker.set_deadline(self._next_wakeup())
        return outputs

    def _next_wakeup(self) -> float | None:
        """When an idle engine must step again: the next pin deadline or
        prefetch due (monotonic), or None."""
        times = [t for t in (self.pins.next_deadline(),
                             self.prefetch.next_due() if self.prefetch is not None else None) if t is not None]
        return min(times) if times else None

    def has_requests(self) -> bool:
        if super().has_requests():  # type: ignore[misc]
            return True
        # Report work while a pin is due so an idle engine, woken by the
        # ExpiryWaker, runs the step that releases it (or starts a prefetch).
        if self.pins.is_due() or (self.prefetch is not None and self.prefetch.is_due()):
            return True
        # Idle with nothing due: the waker sleeps until what is next (its
        # last deadline may have passed with nothing left to do, e.g. a pin
        # a cache reset released, while a later prefetch still waits).
        self._waker.set_deadline(self._next_wakeup())
        return False

    def _load_tokenizer(self) -> Any:
        tokenizer = getattr(self.structured_output_manager, "tokenizer", None)
        if tokenizer is None and not self.vllm_config.model_config.skip_tokenizer_init:
            from vllm.tokenizers import cached_tokenizer_from_config

            tokenizer = cached_tokenizer_from_config(self.vllm_config.model_config)
        return tokenizer

    def release_expired_pins(self) -> int:
        """Release every pin past its deadline (see ``PinManager.release_expired``)."""
        return self.pins.release_expired()

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        if self.prefetch is not None:
            # The plans stay: the host tier may still hold their contexts
            # (a reset of the GPU's prefix cache alone), which is when a
            # prefetch is what brings them back.
            self.prefetch.drop_in_flight()
        self.pins.release_all("reset")
        return super().reset_prefix_cache(*args, **kwargs)  # type: ignore[misc]

    def shutdown(self) -> None:
        if self.prefetch is not None:
            self.prefetch.cancel_all()
        self.pins.release_all("shutdown")
        self.decider.close()
        self._waker.close()
        self.continuum_metrics.close()
        super().shutdown()  # type: ignore[misc]


class ContinuumScheduler(ContinuumSchedulerMixin, Scheduler):
    """Continuum over vLLM's synchronous ``Scheduler`` (CPU, or async off)."""


class ContinuumAsyncScheduler(ContinuumSchedulerMixin, AsyncScheduler):
    """Continuum over vLLM's ``AsyncScheduler`` (the default on CUDA)."""
