"""Continuum scheduler hooks over vLLM's own ``Scheduler`` / ``AsyncScheduler``.

The mixin overrides a handful of methods and leaves vLLM's scheduling loop,
block manager and kernels untouched:

* ``_free_request_blocks`` -- **pin**: a non-final agent turn that finished
  normally keeps its hashed KV blocks for a TTL chosen by the estimator; the
  unhashed tail is freed. An untagged turn whose reply calls a tool starts an
  implicit job and is pinned the same way. Preemption, abort, error, last
  step (the client's flag, or a finish action such as mini-swe-agent's
  ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``, a ``final_answer`` tool),
  a final answer (a reply without a tool call in an implicit job, or in an
  explicit job that called tools before and did not send ``is_last_step``),
  TTL 0 and disabled prefix caching free as usual; a job's last turn
  (known, not an abort) then puts the job's own blocks first in line for
  eviction (:func:`~.eviction_order.evict_first`): nobody asks for a
  finished job's context again.
* ``schedule`` -- releases expired pins (TTL) before the step, orders
  ``running`` so that vLLM's "preempt running[-1]" picks the latest-arriving
  job not on its last step, takes the new jobs' first turns that the
  :class:`~.admission.AdmissionGate` holds out of the waiting queue for the
  step (and puts them back after it), and hands pins over to next turns
  that were admitted in the step (their blocks are now referenced by the
  new request).
* ``kv_cache_manager.allocate_slots`` (wrapped on the instance by
  :class:`~.soft_pins.SoftPins`, only in steps where an allocation could
  fail) -- **soft pins**: when an allocation would fail, pins are released
  (latest-arriving job first) and the allocation retried, before vLLM
  preempts a running request; a waiting request (or a whole idle engine)
  likewise, except that a waiting request of a newer job does not evict an
  older job's pin.
* ``add_request`` -- parses job metadata (an untagged request whose prompt
  continues a finished agent turn is that implicit job's next turn, see
  ``implicit_jobs``), measures tool time, and queues the request in the
  job-aware ``ContinuumRequestQueue``.
* ``_update_waiting_for_remote_kv`` -- with a KV connector the plugin does
  not drive (vLLM's native offloading, LMCache), times the loads of later
  turns from that connector's tier (:class:`~.foreign_tier.ForeignTier`), so a
  dropped context is priced as the reload it costs, not a prefill.
* ``reset_prefix_cache`` / ``shutdown`` -- release every pin first.

The pin lifecycle itself (taking blocks, the cap, expiry, release, soft-pin
victims) lives in :class:`~.pin_manager.PinManager`, where a request ranks
(bounded job-level FCFS) in :class:`~.job_order.JobOrder`, reading replies
(decode, stop strings, tool calls) in :class:`~.reply_reader.ReplyReader`,
finding untagged agents' next turns in
:class:`~.implicit_jobs.ImplicitJobIndex`, the client's share of a tool gap
in :class:`~.estimators.round_trip.RoundTripOverhead` (TTLs from
tool-duration estimates add it);
every time the scheduler
reads comes from the :class:`~.clock.Clock` it was constructed with
(``clock=``, default the system clock), so tests advance time instead of
sleeping.

Invariants: each pinned block carries exactly one reference owned by its pin;
``PinTable.pop`` returns a pin at most once and its blocks are returned to the
pool exactly then; the pinned share of the pool (distinct blocks) never
exceeds ``max_pinned_fraction``; a first turn the admission gate holds is
out of the waiting queue only inside ``schedule()`` and never longer than
``job_priority_window_s`` in all; requests without a job id whose reply
calls no tool, and every untagged request when ``implicit_jobs`` is off,
behave exactly as FCFS (the gate never holds them); client metadata always
wins over an implicit match; ending a job never changes which blocks are
free, only the order in which free cached blocks are evicted.
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
from .config import ContinuumConfig, load_config
from .estimators.history import JobTracker, SlidingMean, ToolDurationHistory, TurnCountCorrelation
from .decisions import Decider, make_decider
from .estimators.parser import NO_TOOL_KEY, is_finish_action
from .estimators.prefill import PrefillCostModel, PrefillTimer
from .estimators.round_trip import RoundTripOverhead
from .estimators.ttl import TTLContext, TTLPolicy, make_ttl_policy
from .implicit_jobs import ImplicitJobIndex, is_implicit_job
from .job_queue import ContinuumRequestQueue
from .job_order import JobOrder
from .metadata import UNTAGGED, JobMetadata, MetadataError, parse_metadata, request_meta, set_request_meta
from .metrics import EngineMetrics
from .foreign_tier import ForeignTier
from .eviction_order import evict_first
from .offload_backend import OffloadBackend, find_offload_backend
from .pin_manager import PinManager
from .soft_pins import SoftPins
from .registration import PLUGIN_POLICIES
from .reply_reader import ReplyReader, stop_token_ids
from .wakeup import ExpiryWaker, find_engine_input_queue

logger = logging.getLogger("vllm.continuum_plugin")

__all__ = [
    "ContinuumAsyncScheduler",
    "ContinuumScheduler",
    "ContinuumSchedulerMixin",
    "PLUGIN_POLICIES",
]

# Release reason of a job's remaining pin when its turn ends it (by how the
# end was known; None: the turn was aborted).
_RELEASE_REASON_AT_END = {
    None: "abort", "last_step": "last_step", "finish_action": "finish_action", "final_answer": "last_step",
}


class ContinuumSchedulerMixin:
    """Continuum behaviour for any vLLM ``Scheduler`` subclass (see module doc)."""

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
        self.round_trip = RoundTripOverhead(cfg.round_trip_default_s)
        self.tool_history = ToolDurationHistory(cfg.history_max_samples, cfg.history_max_tools)
        self.prefill_cost = PrefillCostModel(cfg.prefill_seconds_per_token)
        self.evicted_queueing_delay = SlidingMean(256)
        self.turn_correlation = TurnCountCorrelation()
        self.ttl_policy: TTLPolicy = make_ttl_policy(
            cfg.ttl_policy,
            self.tool_history,
            self.prefill_cost,
            default_ttl_s=cfg.default_ttl_s,
            max_ttl_s=cfg.max_ttl_s,
            fixed_ttl_s=cfg.fixed_ttl_s,
            cold_start_samples=cfg.cold_start_samples,
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
        self.pinning_enabled = bool(self.cache_config.enable_prefix_caching)
        # Untagged agents: finished turns that called a tool, found again by
        # the prefix of their next turn (needs block hashes: prefix caching).
        self.implicit_jobs: ImplicitJobIndex | None = (
            ImplicitJobIndex(self.block_size, cfg.implicit_max_jobs, cfg.implicit_max_blocks)
            if cfg.implicit_jobs and self.pinning_enabled
            else None
        )
        self._finish_actions = frozenset(cfg.finish_action_list)
        block_pool = self.kv_cache_manager.block_pool
        usable_blocks = max(0, block_pool.num_gpu_blocks - 1)  # minus the null block

        self.order = JobOrder(cfg.job_priority_window_s, has_pin=self._continues_pin)
        self.waiting = ContinuumRequestQueue(self.order.queue_key)
        self.kv_holding_waiting = ContinuumRequestQueue(self.order.queue_key)
        self._waiting_by_job: dict[str, set[Request]] = {}
        self._running_order_dirty = True
        self._prefills = PrefillTimer(self.prefill_cost)
        self.replies = ReplyReader(self._load_tokenizer, cfg.pin_on_stop_string)
        self._waker: ExpiryWaker | None = None
        self._waker_lookup_done = False

        parallel = vllm_config.parallel_config
        self.continuum_metrics = EngineMetrics(
            self.continuum_policy, getattr(parallel, "data_parallel_index", 0) or 0
        )
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
        self.soft_pins = SoftPins(
            self, self.pins, self.order,
            pins_are_cheap=self.tier.pins_are_cheap if self.tier is not None else lambda: False,
        )
        self.admission: AdmissionGate | None = None
        if cfg.admission and self.pinning_enabled and self.connector is None:
            self.admission = AdmissionGate(
                capacity_blocks=max(1, usable_blocks),
                block_size=self.block_size,
                quiet_after_s=cfg.max_ttl_s,
                max_wait_s=cfg.job_priority_window_s,
                rank=self.order.queue_key,
            )
        logger.info(
            "vllm-continuum-plugin active: policy=%s ttl_policy=%s scheduler=%s "
            "prefix_caching=%s max_pinned_blocks=%d implicit_jobs=%s admission=%s%s",
            self.continuum_policy,
            cfg.ttl_policy,
            type(self).__name__,
            self.pinning_enabled,
            self.max_pinned_blocks,
            self.implicit_jobs is not None,
            self.admission is not None,
            f" decider={type(self.decider).__name__}",
        )
        if not self.pinning_enabled:
            logger.warning(
                "vllm-continuum-plugin: prefix caching is disabled, so finished "
                "turns cannot be reused; no KV will be pinned (job ordering still applies)"
            )

    @property
    def max_pinned_blocks(self) -> int:
        return self.pins.max_pinned_blocks

    # ------------------------------------------------------------------
    # Queue ordering (the rule lives in JobOrder)
    # ------------------------------------------------------------------
    def _continues_pin(self, request: Request) -> bool:
        """Does ``request`` continue the context its job's pin holds? A job
        id belongs to nobody: a request that merely names it (another
        client's, a branched conversation) must not take the pin over, end
        it or jump the queue on it."""
        return self.pins.held_for(request_meta(request).job_id, request.block_hashes) is not None

    def _has_waiting_turn(self, job_id: str) -> bool:
        """A waiting request continues the job's pin (keep it past its deadline)."""
        return any(self._continues_pin(r) for r in self._waiting_by_job.get(job_id, ()))

    def _reprioritize_job(self, job_id: str) -> None:
        waiting = self._waiting_by_job.get(job_id)
        if waiting:
            # Only a request with its job's credit can change tier.
            credited = [r for r in waiting if self.order.has_credit(r)]
            if credited:
                self.waiting.reprioritize(credited)
                self.kv_holding_waiting.reprioritize(credited)

    def _order_running_for_preemption(self) -> None:
        """vLLM preempts ``running[-1]``: put the latest-arriving job that is
        not on its last step there. Timsort makes the usual already-sorted
        case O(n)."""
        if len(self.running) > 1:
            self.running.sort(key=self.order.running_key)

    # ------------------------------------------------------------------
    # Request arrival
    # ------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id not in self.requests:
            meta = self._parse_request_metadata(request)
            if meta.job_id is None and self.implicit_jobs is not None and _has_token_prompt(request):
                meta = self._match_implicit_job(request, meta)
            set_request_meta(request, meta)
            if meta.job_id is not None:
                self._on_job_arrival(request, meta)
        super().add_request(request)  # type: ignore[misc]

    def _parse_request_metadata(self, request: Request) -> JobMetadata:
        params = request.sampling_params
        extra_args = params.extra_args if params is not None else None
        try:
            return parse_metadata(
                extra_args, getattr(request, "session_id", None), getattr(request, "kv_hints", None)
            )
        except MetadataError as e:
            # The API server rejects these with HTTP 400; only offline callers
            # reach here. Never fail the engine: serve as an untagged request.
            logger.warning(
                "vllm-continuum-plugin: request %s has %s; serving it without job metadata",
                request.request_id,
                e,
            )
            return UNTAGGED

    def _match_implicit_job(self, request: Request, meta: JobMetadata) -> JobMetadata:
        """An untagged request whose prompt continues a finished implicit-job
        turn is that job's next turn (O(log n) lookups, see implicit_jobs)."""
        assert self.implicit_jobs is not None
        job_id = self.implicit_jobs.match(request.block_hashes, request.prompt_token_ids, self.replies.decode)
        if job_id is None:
            return meta
        self.continuum_metrics.on_implicit_turn("continued")
        logger.debug("continuum: request %s continues implicit job %r", request.request_id, job_id)
        return dataclasses.replace(meta, job_id=job_id)

    def _on_job_arrival(self, request: Request, meta: JobMetadata) -> None:
        assert meta.job_id is not None
        job, measured, tool_key = self.jobs.on_arrival(meta.job_id, request.arrival_time)
        self.order.credit(request, job)
        if measured is not None:
            if job.last_tool_s is not None:
                self.round_trip.observe(job, measured, job.last_tool_s)
            self.tool_history.record(tool_key or NO_TOOL_KEY, measured)
            self.decider.observe(job.last_call, measured)
            self.continuum_metrics.on_tool_time(measured, job.last_predicted_s)
        self._waiting_by_job.setdefault(meta.job_id, set()).add(request)
        if self.admission is not None and job.turns_finished == 0 and job.in_flight == 1:
            self.admission.on_first_turn(request)

    def _forget_waiting(self, request: Request) -> None:
        job_id = request_meta(request).job_id
        if job_id is None:
            return
        if self.admission is not None:
            self.admission.forget(request)
        waiting = self._waiting_by_job.get(job_id)
        if waiting is not None:
            waiting.discard(request)
            if not waiting:
                del self._waiting_by_job[job_id]

    # ------------------------------------------------------------------
    # Scheduling step
    # ------------------------------------------------------------------
    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        if not self._waker_lookup_done:
            self._init_waker()
        self.pins.release_expired()
        self.soft_pins.arm()
        if self._running_order_dirty:
            self._order_running_for_preemption()
            self._running_order_dirty = False
        gate = self.admission
        if gate is not None:
            gate.hold_back(self.waiting, bool(self.running), self.clock.time())
        try:
            output: SchedulerOutput = super().schedule(*args, **kwargs)  # type: ignore[misc]
        finally:
            if gate is not None:
                self.continuum_metrics.on_admission(gate.restore(self.waiting))
        if output.scheduled_new_reqs or output.scheduled_cached_reqs.resumed_req_ids:
            self._running_order_dirty = True
            self._after_admission(output)
        if self.tier is not None:
            self.tier.after_step(self._waiting_by_job.values(), self.clock.monotonic())
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
                self._prefills.start(request.request_id, now, request.num_prompt_tokens - cached)
            job_id = request_meta(request).job_id
            if job_id is None:
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
            pin = self.pins.held_for(job_id, request.block_hashes)
            if pin is not None:
                # The pin holds the job's previous prefix, so a hit covers the
                # pinned blocks first (group 0: the full-attention prefix).
                pinned_tokens = len(pin.blocks_by_group[0]) * self.block_size if pin.blocks_by_group else 0
                self.pins.release(job_id, "handoff", hit_tokens=min(cached, pinned_tokens))
            else:
                job = self.jobs.get(job_id)
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
        self._update_waker()
        return outputs

    def has_requests(self) -> bool:
        if super().has_requests():  # type: ignore[misc]
            return True
        # Report work while a pin is due so an idle engine, woken by the
        # ExpiryWaker, runs the step that releases it.
        return self.pins.is_due()

    # ------------------------------------------------------------------
    # Pinning on the block-freeing path
    # ------------------------------------------------------------------
    def _free_request_blocks(self, request: Request) -> None:
        if not request.is_finished():  # preemption: stock behaviour
            super()._free_request_blocks(request)  # type: ignore[misc]
            return
        self._forget_waiting(request)
        self._prefills.forget(request.request_id)
        if self.tier is not None:
            self.tier.forget(request.request_id)
        meta = request_meta(request)
        job_id = meta.job_id
        if job_id is None and self.implicit_jobs is None:
            super()._free_request_blocks(request)  # type: ignore[misc]
            return
        normal, reply_text = self.replies.finished_normally(request)
        # The reply is read once, and only when the turn may go on.
        call = self.replies.tool_call(meta, request, reply_text) if normal and not meta.is_last_step else None
        if job_id is None:
            if call is None or is_finish_action(call, self._finish_actions) or not _has_token_prompt(request):
                # Chat traffic, a one-turn agent, or a prompt of embeddings
                # (no token ids to find its next turn by): served as stock.
                super()._free_request_blocks(request)  # type: ignore[misc]
                return
            job_id = self._start_implicit_job(request, meta)
            meta = request_meta(request)
        if meta.is_last_step or not normal:
            self._end_job(request, meta, normal, "last_step" if meta.is_last_step else None)
            return
        if call is not None and is_finish_action(call, self._finish_actions):
            self._end_job(request, meta, normal, "finish_action")
            return
        if call is None and self._is_final_answer(job_id, meta):
            self._end_job(request, meta, normal, "final_answer")
            return
        tool_key = call.tool_key if call is not None else NO_TOOL_KEY
        job = self.jobs.on_finish(job_id, self.clock.time(), tool_key, counted=True)
        if call is not None and job is not None:
            job.had_tool_call = True
        if self.admission is not None:
            self.admission.on_turn_finished(job_id, request, self.clock.time())
        if job is not None:  # set again below when this turn is decided
            job.last_predicted_s = job.last_tool_s = None
            job.last_context_tokens = request.num_tokens
        if self.implicit_jobs is not None and is_implicit_job(job_id):
            self._register_implicit_turn(request, job_id)
        if not self.pinning_enabled:
            super()._free_request_blocks(request)  # type: ignore[misc]
            return
        # With async scheduling and a KV-consumer connector (the default GPU
        # set-up with offloading), an in-flight step may still write these
        # blocks: vLLM defers their free. A pin may hold them all the same;
        # what leaves it before that step is processed is deferred too.
        fence = None if self._request_blocks_can_be_freed(request) else request.last_sched_seq  # type: ignore[attr-defined]
        decision = self.decider.decide(
            meta,
            call,
            TTLContext(
                tool_key=tool_key,
                context_tokens=request.num_tokens,
                queueing_delay_s=self.evicted_queueing_delay.mean(0.0),
                eta=self.turn_correlation.eta(),
                rebuild_seconds=self._rebuild_seconds(request),
                round_trip_s=self.round_trip.margin(job),
                round_trip_measured=self.round_trip.is_measured(job),
                hold_price=self._hold_price(request),
            ),
        )
        if job is not None:  # measured against the next arrival
            job.last_call = call
            job.last_predicted_s = decision.predicted_seconds
            job.last_tool_s = decision.tool_seconds
        self.continuum_metrics.on_decision(decision.speed, decision.layer)
        logger.debug(
            "continuum: job %s request %s tool %r -> ttl %.3fs (%s)",
            job_id, request.request_id, tool_key, decision.ttl_s, decision.source,
        )
        # A newer turn of the same context supersedes the job's older pin
        # (overlapping turns); a request that only names the job does not
        # touch another context's pin and is served as stock.
        if job_id in self.pins:
            if self.pins.held_for(job_id, request.block_hashes) is None:
                logger.debug("continuum: request %s names job %s but does not continue its pin; not pinned",
                             request.request_id, job_id)
                super()._free_request_blocks(request)  # type: ignore[misc]
                return
            self.pins.release(job_id, "handoff")
        if decision.ttl_s <= 0:
            self.continuum_metrics.on_ttl_decision(0.0)
            if self.offload is not None:  # SLOW tool: reload later, not recompute
                self.offload.save_request(request, hold_job=job_id)
            super()._free_request_blocks(request)  # type: ignore[misc]
            return
        self.pins.pin(
            request, job_id, self.order.ranked_arrival(request), decision.ttl_s, tool_key, decision.speed, fence,
        )

    def _is_final_answer(self, job_id: str, meta: JobMetadata) -> bool:
        """A normally finished turn whose reply calls no tool: does it end
        its job? An implicit job's always does (it exists only because of
        tool calls). An explicit job's does when an earlier turn of it
        called a tool, the reply was actually read (a tokenizer decoded it:
        "no tool call" is then known, not assumed), and the client did not
        send ``is_last_step`` (an explicit ``false`` keeps the answer pinned
        while its user reads it)."""
        if is_implicit_job(job_id):
            return True
        if meta.is_last_step is not None or not self.replies.can_read():
            return False
        job = self.jobs.get(job_id)
        # A job forgotten (ended, LRU-evicted) and started again under the
        # same id is a new JobState: it has had no tool call yet.
        return job is not None and job.had_tool_call

    def _end_job(self, request: Request, meta: JobMetadata, normal: bool, last: str | None) -> None:
        """The job's last turn (``last``: how that was known) or an aborted
        turn (``last`` None) finished: release its pin, free its blocks."""
        job_id = meta.job_id
        assert job_id is not None
        job = self.jobs.on_finish(job_id, self.clock.time(), None, counted=normal)
        shared_tokens = job.first_hit_tokens if job is not None else None
        if last is not None:
            if normal and job is not None:
                self.turn_correlation.add_job(job.turns_finished)
            self.jobs.forget(job_id)
            self.continuum_metrics.on_job_end(last)
        if self.admission is not None:
            self.admission.on_job_end(job_id)
        if self.implicit_jobs is not None:
            # An aborted implicit turn is not retried by prefix: its job ends too.
            self.implicit_jobs.forget(job_id)
        if self.pins.held_for(job_id, request.block_hashes) is not None:
            self.pins.release(job_id, _RELEASE_REASON_AT_END[last])
        if self.offload is not None:
            # Nobody reloads a finished job's context: its stored blocks go
            # first. (An aborted turn may be retried: keep them.)
            self.offload.end_hold(job_id, demote=last is not None)
            if last is not None:
                self.offload.demote_request(request)
        if last is None or shared_tokens is None:  # an abort may be retried: LRU as usual
            super()._free_request_blocks(request)  # type: ignore[misc]
            return
        blocks = self.kv_cache_manager.get_blocks(request.request_id).blocks
        super()._free_request_blocks(request)  # type: ignore[misc]
        moved = evict_first(self.kv_cache_manager.block_pool, blocks, shared_tokens // self.block_size)
        logger.debug("continuum: job %s ended; %d of its blocks go first out of the prefix cache", job_id, moved)

    def _start_implicit_job(self, request: Request, meta: JobMetadata) -> str:
        """An untagged turn that called a tool: from now on it is a job."""
        assert self.implicit_jobs is not None
        job_id = self.implicit_jobs.new_job_id()
        set_request_meta(request, dataclasses.replace(meta, job_id=job_id))
        job, _, _ = self.jobs.on_arrival(job_id, request.arrival_time)
        self.order.credit(request, job)
        self.continuum_metrics.on_implicit_turn("started")
        logger.debug("continuum: request %s starts implicit job %r", request.request_id, job_id)
        return job_id

    def _register_implicit_turn(self, request: Request, job_id: str) -> None:
        assert self.implicit_jobs is not None
        self.implicit_jobs.register(
            job_id, request.block_hashes, request.all_token_ids, request.num_prompt_tokens,
            self.replies.decode, stop_token_ids(request),
        )

    def _free_after_fence(self, blocks: list[Any], fence: int | None) -> None:
        """Return pinned blocks (allocation order) to the pool, tail first;
        while the step ``fence`` may still write them, through vLLM's own
        fence-aware free (a fence is only set when vLLM defers frees)."""
        if fence is None:
            self.kv_cache_manager.block_pool.free_blocks(reversed(blocks))
        else:
            self._free_cow_retained_blocks(blocks[::-1], fence)  # type: ignore[attr-defined]

    def _hold_price(self, request: Request) -> float:
        """What a second of holding ``request``'s context costs the others:
        its share of the pool (the hashed blocks a pin would keep) times
        how full the pool is now (blocks neither free nor evictable: running
        requests and pins). An idle pool makes holding free; a full one
        charges a pin its share of the memory."""
        pool = self.kv_cache_manager.block_pool
        blocks = min(len(request.block_hashes), request.num_tokens // self.block_size)
        return blocks / max(1, pool.num_gpu_blocks - 1) * min(1.0, max(0.0, pool.get_usage()))

    def _rebuild_seconds(self, request: Request) -> float | None:
        """With the plugin's offload connector, rebuilding the context costs a
        reload of what the store holds plus a prefill of the rest; with
        another connector's tier, its learned reload cost (``tier``); None
        (a prefill) otherwise or while nothing is known."""
        if self.offload is None:
            if self.tier is not None:
                return self.tier.rebuild_seconds(request.num_tokens)
            return None
        per_token = self.offload.reload_seconds_per_token()
        if per_token is None:
            return None
        stored = self.offload.stored_prefix_tokens(request)
        return per_token * stored + self.prefill_cost.seconds(max(0, request.num_tokens - stored))

    def _load_tokenizer(self) -> Any:
        tokenizer = getattr(self.structured_output_manager, "tokenizer", None)
        if tokenizer is None and not self.vllm_config.model_config.skip_tokenizer_init:
            from vllm.tokenizers import cached_tokenizer_from_config

            tokenizer = cached_tokenizer_from_config(self.vllm_config.model_config)
        return tokenizer

    def release_expired_pins(self) -> int:
        """Release every pin past its deadline (see ``PinManager.release_expired``)."""
        return self.pins.release_expired()

    # ------------------------------------------------------------------
    # Lifecycle
    # ------------------------------------------------------------------
    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        self.pins.release_all("reset")
        return super().reset_prefix_cache(*args, **kwargs)  # type: ignore[misc]

    def shutdown(self) -> None:
        self.pins.release_all("shutdown")
        self.decider.close()
        if self._waker is not None:
            self._waker.close()
        self.continuum_metrics.close()
        super().shutdown()  # type: ignore[misc]

    def _init_waker(self) -> None:
        self._waker_lookup_done = True
        input_queue = find_engine_input_queue()
        if input_queue is None:
            return
        from vllm.v1.engine import EngineCoreRequestType

        self._waker = ExpiryWaker(input_queue, (EngineCoreRequestType.WAKEUP, None), self.clock)

    def _update_waker(self) -> None:
        if self._waker is not None:
            self._waker.set_deadline(self.pins.next_deadline())


def _has_token_prompt(request: Request) -> bool:
    """The prompt is token ids (not ``prompt_embeds``): implicit jobs match
    and register turns by them."""
    return request.prompt_token_ids is not None and getattr(request, "prompt_embeds", None) is None


class ContinuumScheduler(ContinuumSchedulerMixin, Scheduler):
    """Continuum over vLLM's synchronous ``Scheduler`` (CPU, or async off)."""


class ContinuumAsyncScheduler(ContinuumSchedulerMixin, AsyncScheduler):
    """Continuum over vLLM's ``AsyncScheduler`` (the default on CUDA)."""
