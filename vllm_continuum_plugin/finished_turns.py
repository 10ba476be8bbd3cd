"""What a finished turn does to its job and its KV: the block-freeing path.

vLLM frees a request's blocks in ``Scheduler._free_request_blocks`` (a
finished or preempted request). :class:`FinishedTurnsMixin` overrides that
one hook: :class:`~.turn_facts.TurnReader` reads the turn's facts,
:func:`~.turn_outcome.decide_turn` decides what the turn becomes, and this
applies it -- stock (an untagged answer is remembered for the implicit chat
a later prompt may continue), end the job (its pin goes; a known last turn
puts the job's blocks first in line for eviction), or continue it (a TTL is
decided; the blocks are pinned, offloaded or freed). An untagged turn that
called a tool starts its implicit job here, and an untagged answer its
implicit chat where the scope's answers come back.

It is half of :class:`~.scheduler.ContinuumSchedulerMixin`, which builds
every collaborator it uses; the split keeps each file one concern.

Invariants: every finished request's blocks are freed exactly once, by
vLLM's own free, a pin (which returns them when it is released) or a
declared hold; ending a job never changes which blocks are free, only the
order in which free cached blocks are evicted; a request that does not
continue the context of the job it names never changes that job's state.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from vllm.v1.request import Request

from .admission import AdmissionGate
from .clock import Clock
from .context_costs import ContextCosts
from .conversations import Conversations
from .decisions import Decider
from .declared_holds import DeclaredHolds
from .estimators.history import JobTracker, TurnCountCorrelation
from .estimators.parser import NO_TOOL_KEY, ToolCall
from .estimators.prefill import PrefillTimer
from .eviction_order import evict_first
from .foreign_tier import ForeignTier
from .gate_feed import GateFeed
from .host_tier_order import FinishedFirstLRUCachePolicy
from .implicit_jobs import ImplicitJobIndex, is_implicit_job, untagged_turn_key
from .job_order import JobOrder
from .metadata import JobMetadata
from .metrics import EngineMetrics
from .offload_backend import OffloadBackend
from .pin_manager import PinManager
from .prefetch import Prefetcher
from .reply_reader import ReplyReader, stop_token_ids
from .request_record import request_meta, set_request_meta
from .turn_facts import TurnReader
from .turn_outcome import PinRelation, TurnOutcome, TurnOutcomeKind, decide_turn

logger = logging.getLogger("vllm.continuum_plugin")

__all__ = ["FinishedTurnsMixin"]


class FinishedTurnsMixin:
    """The block-freeing path of the Continuum scheduler (see module doc)."""

    # Built by ContinuumSchedulerMixin.__init__ (for type checkers).
    admission: AdmissionGate | None
    block_size: int
    clock: Clock
    continuum_metrics: EngineMetrics
    conversations: Conversations
    costs: ContextCosts
    decider: Decider
    declared: DeclaredHolds
    gate_feed: GateFeed | None
    implicit_jobs: ImplicitJobIndex | None
    jobs: JobTracker
    kv_cache_manager: Any
    offload: OffloadBackend | None
    order: JobOrder
    pins: PinManager
    prefetch: Prefetcher | None
    replies: ReplyReader
    tier: ForeignTier | None
    tier_order: FinishedFirstLRUCachePolicy | None
    turn_correlation: TurnCountCorrelation
    turns: TurnReader
    _prefills: PrefillTimer
    # The scheduler's arrival side: a finished request waits no longer.
    _forget_waiting: Callable[[Request], None]

    def _free_request_blocks(self, request: Request) -> None:
        """A request leaves vLLM (finished or preempted): ``decide_turn``
        says what its turn becomes, this applies it."""
        prefetch = self.prefetch
        if prefetch is not None and prefetch.owns(request.request_id):
            prefetch.freed(request, self._stock_free)  # no turn of any job
            return
        if request.is_finished():
            self._forget_waiting(request)
            self._prefills.forget(request.request_id)
            if self.tier is not None:
                self.tier.forget(request.request_id)
        turn, call = self.turns.read(request)
        outcome = decide_turn(turn, self.turns.rules)
        if outcome.kind is TurnOutcomeKind.STOCK:
            if outcome.registers_answer and self.implicit_jobs is not None:
                # A prompt that continues this answer later starts a chat.
                self.implicit_jobs.register_answer(request, stop_token_ids(request), request_meta(request).scope)
            if turn.finished and turn.job_id is None and self.gate_feed is not None:
                # Counted while it ran; a chat it may start is counted when
                # its next turn is admitted.
                self.gate_feed.untagged_finished(untagged_turn_key(request.request_id), None)
            self.declared.free(request)
        elif outcome.kind is TurnOutcomeKind.END_JOB:
            assert turn.reply is not None
            self._end_job(request, outcome, turn.reply.normal, turn.pin is PinRelation.CONTINUED)
        else:
            self._continue_job(request, outcome, call)

    def _continue_job(self, request: Request, outcome: TurnOutcome, call: ToolCall | None) -> None:
        """A turn after which its job goes on (RETAIN or FREE): note the
        turn, decide its TTL, then pin, offload or free its blocks."""
        meta = request_meta(request)
        if outcome.starts_implicit_job or outcome.starts_implicit_chat:
            started = self._start_implicit_job(request, meta, outcome.starts_implicit_chat)
            if self.gate_feed is not None:  # counted while it ran: now as its job, if any
                self.gate_feed.untagged_finished(untagged_turn_key(request.request_id),
                                                 started.job_id if started is not None else None)
            if started is None:  # an answer that cannot be found again: served as stock
                self.declared.free(request)
                return
            meta = started
        job_id = meta.job_id
        assert job_id is not None
        now = self.clock.time()
        tool_key = call.tool_key if call is not None else NO_TOOL_KEY
        job = self.jobs.on_finish(job_id, now, tool_key, counted=True)
        if job is not None:
            job.had_tool_call |= call is not None
            job.tools_offered = meta.tools_offered
        if self.gate_feed is not None:
            self.gate_feed.turn_finished(job_id, request, now, tool_key, meta.scope)
        if job is not None:  # set again below when this turn is decided
            job.last_predicted_s = job.last_tool_s = None
            job.last_context_tokens = request.num_tokens
        if self.implicit_jobs is not None and is_implicit_job(job_id) and not outcome.starts_implicit_chat:
            # (A chat's first answer is registered as an answer: its
            # follow-up counts towards the scope's answer return rate.)
            self.implicit_jobs.register_request(
                job_id, request, self.replies.decode, stop_token_ids(request), meta.scope
            )
        if self.prefetch is not None and job is not None and call is not None:
            # Its context comes back from the host tier before its tool does.
            self.prefetch.plan(request, meta, tool_key, self.order.ranked_arrival(request))
        if outcome.kind is TurnOutcomeKind.FREE:  # no pinning: nothing to decide
            if self.gate_feed is not None:
                self.gate_feed.holds_nothing(job_id)
            self.declared.free(request)
            return
        # With async scheduling and a KV-consumer connector (the default GPU
        # set-up with offloading), an in-flight step may still write these
        # blocks: vLLM defers their free. A pin may hold them all the same;
        # what leaves it before that step is processed is deferred too.
        fence = None if self._request_blocks_can_be_freed(request) else request.last_sched_seq  # type: ignore[attr-defined]
        decision = self.decider.decide(meta, call, self.costs.ttl_context(request, tool_key, job, meta.scope))
        if job is not None:  # measured against the next arrival
            job.last_call = call
            job.last_predicted_s = decision.predicted_seconds
            job.last_tool_s = decision.tool_seconds
        self.continuum_metrics.on_decision(decision.speed, decision.layer)
        logger.debug(
            "continuum: job %s request %s tool %r -> ttl %.3fs (%s)",
            job_id, request.request_id, tool_key, decision.ttl_s, decision.source,
        )
        outcome = outcome.with_ttl(decision.ttl_s)
        if outcome.kind is TurnOutcomeKind.FREE:
            # The job's pin holds another context (an overlapping turn of
            # another branch): it stays, this turn is served as stock.
            logger.debug("continuum: request %s names job %s but does not continue its pin; not pinned",
                         request.request_id, job_id)
            self.declared.free(request)
            return
        if outcome.supersedes_pin:  # a newer turn of the same context
            self.pins.release(job_id, "handoff")
        if outcome.kind is TurnOutcomeKind.OFFLOAD:
            self.continuum_metrics.on_ttl_decision(0.0)
            if self.offload is not None:  # SLOW tool: reload later, not recompute
                self.offload.save_request(request, hold_job=job_id)
            # What the client declared is still held, for the job's next
            # turn to take over (then the gate counts the job as holding).
            self.declared.free(request, job_id)
            if self.gate_feed is not None:
                self.gate_feed.holds_nothing(job_id, decision, tool_key, meta.scope)
            return
        if self.declared.apply(request, job_id, decision.ttl_s, tool_key, fence):
            return
        self.pins.pin(
            request, job_id, self.order.ranked_arrival(request), decision.ttl_s, tool_key, decision.speed, fence,
        )

    def _stock_free(self, request: Request) -> None:
        super()._free_request_blocks(request)  # type: ignore[misc]

    def _end_job(self, request: Request, outcome: TurnOutcome, normal: bool, continues_pin: bool) -> None:
        """The job's last turn, an answer its session may follow up
        (``outcome.answered``: the state stays, the blocks age as stock
        LRU) or an aborted turn (``outcome.end_reason`` None) finished:
        release its pin, free its blocks."""
        job_id = request_meta(request).job_id
        assert job_id is not None
        ends = outcome.ends_job
        job = self.jobs.on_finish(job_id, self.clock.time(), None, counted=normal)
        shared_tokens = job.first_hit_tokens if job is not None else None
        end_reason = outcome.end_reason
        if end_reason is not None and normal and job is not None:
            self.turn_correlation.add_job(job.turns_finished)
        self._forget_job(job_id, end_reason, outcome.release_reason if continues_pin else None,
                         forget_state=ends)
        if outcome.answered and self.implicit_jobs is not None and is_implicit_job(job_id):
            # The user may follow the answer up: found again by its prompt,
            # the follow-up is the job's next turn (its rank kept, not held).
            self.implicit_jobs.register_request(
                job_id, request, self.replies.decode, stop_token_ids(request), request_meta(request).scope
            )
        if ends and self.offload is not None:
            self.offload.demote_request(request)  # nobody reloads a finished job's context
        if ends and self.tier_order is not None and shared_tokens is not None:
            # Its own blocks go first out of vLLM's host tier too.
            self.tier_order.mark_finished(request.request_id, shared_tokens)
        if self.declared.apply(request, None, 0.0):
            return
        if not ends or shared_tokens is None:  # retried, followed up: LRU as usual
            super()._free_request_blocks(request)  # type: ignore[misc]
            return
        blocks = self.kv_cache_manager.get_blocks(request.request_id).blocks
        super()._free_request_blocks(request)  # type: ignore[misc]
        moved = evict_first(self.kv_cache_manager.block_pool, blocks, shared_tokens // self.block_size)
        logger.debug("continuum: job %s ended; %d of its blocks go first out of the prefix cache", job_id, moved)

    def _forget_job(self, job_id: str, end_reason: str | None, release_reason: str | None,
                    forget_state: bool = True) -> None:
        """A job's task ended (``end_reason``, counted; its state is
        forgotten unless ``forget_state`` is False: an answer its session
        may follow up) or its turn aborted (None: the state stays, the job
        may retry); its pin goes when ``release_reason`` is given, its
        offload hold always."""
        ended = end_reason is not None and forget_state
        if end_reason is not None:
            self.continuum_metrics.on_job_end(end_reason)
        if ended:
            self.jobs.forget(job_id)
            self.conversations.forget(job_id)
        if self.admission is not None:
            self.admission.on_job_end(job_id, ended=end_reason is not None)
        if self.implicit_jobs is not None:
            # An aborted implicit turn is not retried by prefix: its job ends too.
            self.implicit_jobs.forget(job_id)
        if release_reason is not None:
            self.pins.release(job_id, release_reason)
        if self.prefetch is not None:
            self.prefetch.cancel(job_id)
        if self.offload is not None:
            # An ended job's stored blocks go first; an aborted turn may be
            # retried, an answer followed up: keep them.
            self.offload.end_hold(job_id, demote=ended)

    def _start_implicit_job(self, request: Request, meta: JobMetadata, chat: bool = False) -> JobMetadata | None:
        """An untagged turn that called a tool, or (``chat``) an answer where
        the scope's answers come back: from now on it is a job. A chat's
        answer is registered as an answer (found again by prefix); None when
        it cannot be (no full prompt block, a twin in its scope)."""
        assert self.implicit_jobs is not None
        if chat:
            job_id = self.implicit_jobs.register_answer(request, stop_token_ids(request), meta.scope)
            if job_id is None:
                return None
        else:
            job_id = self.implicit_jobs.new_job_id()
        meta = dataclasses.replace(meta, job_id=job_id)
        set_request_meta(request, meta)
        job, _, _ = self.jobs.on_arrival(job_id, request.arrival_time, meta.scope)
        self.order.credit(request, job)
        self.continuum_metrics.on_implicit_turn("started")
        logger.debug("continuum: request %s starts implicit %s %r", request.request_id,
                     "chat" if chat else "job", job_id)
        return meta

    def _free_after_fence(self, blocks: list[Any], fence: int | None) -> None:
        """Return pinned blocks (allocation order) to the pool, tail first;
        while the step ``fence`` may still write them, through vLLM's own
        fence-aware free (a fence is only set when vLLM defers frees)."""
        if fence is None:
            self.kv_cache_manager.block_pool.free_blocks(reversed(blocks))
        else:
            self._free_cow_retained_blocks(blocks[::-1], fence)  # type: ignore[attr-defined]
