"""Prefetch: a job's context is loaded back from a host tier before its tool returns.

Under a KV connector with a host tier that the plugin does not drive (vLLM's
native ``OffloadingConnector``, LMCache), a job's context that left the GPU
while its tool ran is loaded back only when its next turn arrives: the turn
waits in ``WAITING_FOR_REMOTE_KVS`` for the copy, on its critical path
(docs/capacity.md, "Where the TTFT goes", splits it out).
The plugin knows when the tool is likely back: the scope's measured tool
times (the CDF the TTL rule reads).

:class:`Prefetcher` starts that load before the turn. When a turn that
called a tool finishes, it plans a prefetch of the job's context (the
finished request's full blocks: their tokens and block hashes), due when the
``quantile`` of the tool's measured times, less twice the tier's measured
reload time of that context, has passed. When a plan is due, no request
waits for the GPU or for a load of its own, and the pool keeps ``reserve``
of its blocks free after the load, it adds an internal request for that context to vLLM's waiting
queue -- the scheduler's own waiting loop and the connector's own lookup
then allocate the blocks and start the asynchronous load, exactly as for a
returning turn. When the load is reported, the request is finished before
it computes anything, and its blocks, now in the prefix cache, are pinned
for the job until its tool is past the 90th percentile of its measured
times (the pin yields to memory pressure like any other). The job's next
turn then finds its context on the GPU; if it arrives while the load is in
flight, it waits for that load (starting a second copy of the same blocks
would only take longer).

A prefetch that loses its bet is cheap to drop: the turn that arrives
before its plan is due cancels the plan; a plan that finds the context on
the GPU (a pin, the prefix cache) or not in the tier is dropped without a
request; a request whose load could not start in its step is finished at
once (it holds no blocks) and its plan tried again shortly; a pin of
prefetched blocks that the turn never takes lapses or is released under
pressure. A connector that loads synchronously, inside the forward pass
(LMCache's default), would run the request: the first such answer turns
prefetching off.

Off by default (``prefetch``): where the GPU pool is full when contexts
come back -- the Claude Code traces at 1 session/min on an H100 with
Llama-3.1-8B -- a prefetch takes another job's place in the prefix cache,
and that job reloads it in turn (docs/offload.md).

Bounds: one prefetch in flight at a time (the host link is shared with
returning turns); plans hold at most ``max_bytes`` of tokens and hashes
(the oldest plans are dropped first); only requests of a job the plugin
tracks are planned.

Invariants: a prefetch request never computes a token -- it is added only
when the connector reported tokens to load for it, in the same
``schedule()`` call that starts the load (so the waiting loop puts it in
``WAITING_FOR_REMOTE_KVS``), and it is finished before the ``schedule()``
that would otherwise run it; every prefetch request the scheduler created is
freed through :meth:`Prefetcher.freed` (pinned or returned to the pool),
never through the turn path, so it changes no job's state.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from vllm.sampling_params import SamplingParams
from vllm.utils.math_utils import cdiv
from vllm.v1.request import Request, RequestStatus

from .clock import Clock
from .estimators.scopes import DEFAULT_SCOPE
from .estimators.ttl import ScopedToolHistory
from .metadata import JobMetadata
from .pin_manager import PinManager
from .request_record import request_meta, set_request_meta

logger = logging.getLogger("vllm.continuum_plugin")

__all__ = ["PREFETCH_ID_PREFIX", "PrefetchPlan", "Prefetcher"]

PREFETCH_ID_PREFIX = "continuum-prefetch-"
# Fewer measured times than this (of the tool, else of every tool of the
# scope) predict no return: no plan.
MIN_SAMPLES = 4
# The plan's last chance: past this quantile of the tool's times the tool is
# unlikely back soon, and the prefetched pin lapses then.
GIVE_UP_QUANTILE = 0.9
# A due plan that could not start (a request waits, no room, a load in
# flight) is tried again this much later.
RETRY_S = 0.25
# A waiting request in one of these states keeps prefetches back: it waits
# for the GPU (WAITING, PREEMPTED) or for its own load over the host link
# (WAITING_FOR_REMOTE_KVS), which a prefetch's copy would queue behind.
_BUSY = (RequestStatus.WAITING, RequestStatus.PREEMPTED, RequestStatus.WAITING_FOR_REMOTE_KVS)
# Bytes a plan's token costs (int32) and a block hash (vLLM's 32-byte
# digests plus the list slot).
_TOKEN_BYTES = 4
_HASH_BYTES = 40


@dataclass
class PrefetchPlan:
    """A job's context to load back, and when."""

    job_id: str
    tool_key: str
    rank: float  # the arrival the job's pins rank by (JobOrder)
    due_at: float  # monotonic: start the load from then
    give_up_at: float  # monotonic: no start after it; the prefetched pin lapses then
    lead_s: float  # twice the predicted reload of the context
    tokens: array  # the context's full blocks' tokens
    block_hashes: list[Any]  # their hashes (the request's block hasher)
    meta: JobMetadata

    @property
    def nbytes(self) -> int:
        return len(self.tokens) * _TOKEN_BYTES + len(self.block_hashes) * _HASH_BYTES


class Prefetcher:
    """Loads jobs' contexts back from a foreign host tier before their
    tools return (see module doc). One per scheduler; every method is
    called from the scheduler's thread."""

    def __init__(
        self,
        scheduler: Any,
        pins: PinManager,
        history: ScopedToolHistory,
        reload_seconds: Callable[[int], float],
        clock: Clock,
        quantile: float,
        max_bytes: int,
        reserve: float,
        on_event: Callable[[str, int], None] = lambda outcome, n: None,
    ) -> None:
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"Prefetcher: quantile must be in (0, 1), got {quantile!r}")
        if max_bytes < 0:
            raise ValueError(f"Prefetcher: max_bytes must be >= 0, got {max_bytes!r}")
        if not 0.0 <= reserve < 1.0:
            raise ValueError(f"Prefetcher: reserve must be in [0, 1), got {reserve!r}")
        self._sched = scheduler
        self._pins = pins
        self._history = history
        self._reload_seconds = reload_seconds
        self._clock = clock
        self.quantile = quantile
        self.max_bytes = max_bytes
        self.reserve = reserve
        self._on_event = on_event
        self._plans: OrderedDict[str, PrefetchPlan] = OrderedDict()  # oldest first
        self._bytes = 0
        self._due: list[tuple[float, int, str]] = []  # (due_at, seq, job_id); stale entries skipped
        self._seq = itertools.count()
        # The request whose load is in flight, and its plan; the plan whose
        # request this step added (after_schedule sees whether it started).
        self._inflight: Request | None = None
        self._inflight_plan: PrefetchPlan | None = None
        self._starting: PrefetchPlan | None = None
        # Prefetch requests not yet freed (in flight, finished, or aborted
        # while their load runs: vLLM frees those when it is reported).
        self._ids: set[str] = set()
        # Loaded requests finished for their pin: freed() pins their blocks.
        self._loaded: dict[str, PrefetchPlan] = {}
        self._held: list[Request] = []
        # Off for good once the connector turns out to load synchronously.
        self.enabled = True

    # -- plans ------------------------------------------------------------
    @property
    def plans(self) -> int:
        return len(self._plans)

    @property
    def plan_bytes(self) -> int:
        """Bytes the plans hold (tokens and hashes): at most ``max_bytes``."""
        return self._bytes

    def owns(self, request_id: str) -> bool:
        """Is ``request_id`` a prefetch request not yet freed?"""
        return request_id in self._ids

    def _when(self, scope: str, tool_key: str, tokens: int) -> tuple[float, float, float] | None:
        """(delay until the load starts, delay until the plan gives up,
        lead) after a turn that called ``tool_key`` finished, from the
        scope's measured times of that tool (of every tool while it has
        fewer than MIN_SAMPLES); None when too few are measured."""
        history = self._history.get(scope)
        if history is None:
            return None
        samples = history.sorted_samples(tool_key)
        if len(samples) < MIN_SAMPLES:
            samples = history.sorted_samples(None)
            if len(samples) < MIN_SAMPLES:
                return None
        lead = 2.0 * max(0.0, self._reload_seconds(tokens))
        back = float(np.quantile(samples, self.quantile))
        last = float(np.quantile(samples, GIVE_UP_QUANTILE))
        start = max(0.0, back - lead)
        return start, max(last, start + lead), lead

    def plan(self, request: Request, meta: JobMetadata, tool_key: str, rank: float) -> bool:
        """``request``, a turn of ``meta.job_id`` that called ``tool_key``,
        finished: plan the prefetch of its context (replacing the job's
        previous plan). Returns whether a plan was made."""
        job_id = meta.job_id
        assert job_id is not None
        self.cancel(job_id)
        if not self.enabled:
            return False
        block_size = self._sched.block_size
        hashes = list(request.block_hashes)
        n_blocks = min(len(hashes), request.num_tokens // block_size)
        if n_blocks == 0:
            return False
        when = self._when(meta.scope or DEFAULT_SCOPE, tool_key, n_blocks * block_size)
        if when is None:
            return False
        start, give_up, lead = when
        now = self._clock.monotonic()
        tokens = array("i", request.all_token_ids[: n_blocks * block_size])
        plan = PrefetchPlan(job_id, tool_key, rank, now + start, now + give_up, lead, tokens,
                            hashes[:n_blocks], meta)
        if plan.nbytes > self.max_bytes:
            return False
        while self._bytes + plan.nbytes > self.max_bytes and self._plans:
            self._drop(next(iter(self._plans)))
        self._plans[job_id] = plan
        self._bytes += plan.nbytes
        heapq.heappush(self._due, (plan.due_at, next(self._seq), job_id))
        logger.debug("continuum: prefetch of job %s (%d blocks) due in %.2fs", job_id, n_blocks, start)
        return True

    def _drop(self, job_id: str) -> PrefetchPlan | None:
        plan = self._plans.pop(job_id, None)
        if plan is not None:
            self._bytes -= plan.nbytes
            if len(self._due) > 2 * len(self._plans) + 64:
                # Entries of dropped plans are skipped when they reach the
                # top; rebuilt here, the heap stays within twice the plans.
                self._due = [(p.due_at, next(self._seq), key) for key, p in self._plans.items()]
                heapq.heapify(self._due)
        return plan

    def _retry(self, plan: PrefetchPlan, now: float) -> None:
        """``plan`` is due again RETRY_S from ``now``."""
        plan.due_at = now + RETRY_S
        heapq.heappush(self._due, (plan.due_at, next(self._seq), plan.job_id))

    def cancel(self, job_id: str) -> None:
        """The job's plan goes (its next turn arrived, it ended, it was
        forgotten); a load in flight for it is aborted unless the job's turn
        is waiting for it (:meth:`on_arrival` keeps it)."""
        self._drop(job_id)
        plan = self._inflight_plan
        if plan is not None and plan.job_id == job_id:
            self.drop_in_flight()

    def on_arrival(self, job_id: str) -> None:
        """The job's next turn arrived: its plan is moot; a load in flight
        for it goes on (the turn waits for it: :meth:`hold`)."""
        self._drop(job_id)

    def cancel_all(self) -> None:
        """Nothing will return (a replay is over, the engine stops)."""
        self._plans.clear()
        self._bytes = 0
        self._due.clear()
        self.drop_in_flight()

    def next_due(self) -> float | None:
        """When the earliest plan is due (monotonic), or None."""
        if not self.enabled:
            return None
        due = self._due
        while due and (due[0][2] not in self._plans or self._plans[due[0][2]].due_at != due[0][0]):
            heapq.heappop(due)
        return due[0][0] if due else None

    def is_due(self) -> bool:
        due = self.next_due()
        return due is not None and due <= self._clock.monotonic()

    # -- the step ---------------------------------------------------------
    def complete(self) -> None:
        """Before ``schedule()``: a prefetch whose load was reported is
        finished before vLLM would run it; vLLM caches its blocks first
        (loaded) and :meth:`freed` pins them."""
        request = self._inflight
        sched = self._sched
        if request is None or request.request_id not in sched.finished_recving_kv_req_ids:
            return
        plan = self._inflight_plan
        assert plan is not None
        failed = request.request_id in sched.failed_recving_kv_req_ids
        # vLLM's own bookkeeping of a finished load: caches the loaded blocks
        # (the valid prefix of a failed load) and clears the load's ids.
        sched._update_waiting_for_remote_kv(request)
        request.status = RequestStatus.WAITING
        self._inflight = self._inflight_plan = None
        if not failed:
            self._loaded[request.request_id] = plan
        self._on_event("failed" if failed else "loaded", 1)
        sched.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)

    def start(self, *queues: Iterable[Request]) -> Request | None:
        """Before ``schedule()``, after :meth:`complete`: when a plan is due,
        no request in the waiting ``queues`` waits for the GPU or for a load
        of its own, and no prefetch is in flight, add the prefetch request of
        the earliest due plan whose context the tier holds and the pool has
        room for; returns it."""
        now = self._clock.monotonic()
        due = self.next_due()
        if due is None or due > now:
            return None
        if self._inflight is not None or any(
                r.status in _BUSY for queue in queues for r in itertools.islice(queue, 64)):
            self._postpone(now)
            return None
        while (due := self.next_due()) is not None and due <= now:
            _, _, job_id = heapq.heappop(self._due)
            plan = self._plans[job_id]
            if now > plan.give_up_at or self._pins.get(job_id) is not None:
                self._drop(job_id)  # past its chance, or its context is pinned on the GPU
                continue
            request = self._try(plan, now)
            if request is not None:
                return request
        return None

    def _postpone(self, now: float) -> None:
        """Every due plan is tried again RETRY_S from now (the clock of an
        idle engine moves on: a due plan never blocks a wake-up loop)."""
        while (due := self.next_due()) is not None and due <= now:
            _, _, job_id = heapq.heappop(self._due)
            self._retry(self._plans[job_id], now)

    def _try(self, plan: PrefetchPlan, now: float) -> Request | None:
        sched = self._sched
        block_size = sched.block_size
        request = Request(
            request_id=f"{PREFETCH_ID_PREFIX}{next(self._seq)}",
            prompt_token_ids=plan.tokens.tolist(),
            sampling_params=SamplingParams(max_tokens=1),
            pooling_params=None,
            arrival_time=self._clock.time(),
        )
        request.block_hashes = list(plan.block_hashes)
        set_request_meta(request, plan.meta)
        self._ids.add(request.request_id)
        self._add(request)
        blocks = sched.kv_cache_manager.get_computed_blocks(request)
        local = blocks[1] - blocks[1] % block_size
        missing = request.num_tokens - local
        pool = sched.kv_cache_manager.block_pool
        need = cdiv(missing, block_size)
        room = pool.get_num_free_blocks() - need
        reserve = self.reserve * max(1, pool.num_gpu_blocks - 1)
        if missing < block_size:
            verdict = "on the GPU"
        elif room < reserve:
            verdict = "no room"
        else:
            loadable, is_async = sched.connector.get_num_new_matched_tokens(request, local)
            if loadable and not is_async:
                # A connector that loads inside the forward pass (LMCache's
                # default) would run the request: prefetching is off for it.
                self.enabled = False
                logger.info("continuum: prefetch off: the KV connector loads synchronously")
                verdict = "synchronous loads"
            else:
                verdict = "" if loadable and loadable >= missing // 2 else "not in the tier"
        if verdict:
            self._finish(request)
            if not self.enabled:
                self.cancel_all()
            elif verdict == "no room":  # the pool may have room later
                self._retry(plan, now)
            else:
                self._drop(plan.job_id)
            logger.debug("continuum: prefetch of job %s not started: %s", plan.job_id, verdict)
            return None
        # The plan stays until the step has started the load (after_schedule).
        self._inflight, self._inflight_plan = request, plan
        self._starting = plan
        logger.debug("continuum: prefetching %d tokens of job %s", missing, plan.job_id)
        return request

    def _add(self, request: Request) -> None:
        # The scheduler's add_request passes a request this owns straight to
        # vLLM's (its arrival path would take it for a turn of its job).
        self._sched.add_request(request)

    def _finish(self, request: Request) -> None:
        self._sched.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)

    def drop_in_flight(self) -> None:
        """Abort the prefetch whose load is in flight, if any (its plan is
        spent): vLLM frees its blocks when the load is reported."""
        request = self._inflight
        if request is None:
            return
        self._inflight = self._inflight_plan = None
        self._on_event("dropped", 1)
        # While its load runs vLLM keeps the blocks and frees them when the
        # load is reported (then freed() runs).
        self._finish(request)

    def after_schedule(self) -> None:
        """After ``schedule()``: the prefetch added in the step started its
        load (its plan is done), or it did not (the waiting loop found no
        room, budget or running slot for it): then it is finished -- it
        holds no blocks -- and its plan is tried again RETRY_S later."""
        plan, self._starting = self._starting, None
        request = self._inflight
        if plan is None or request is None:
            return  # nothing added in this step
        if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            self._drop(plan.job_id)
            self._on_event("started", 1)
            return
        if request.status != RequestStatus.WAITING:
            # Not expected: the connector reported tokens to load for it.
            logger.warning("continuum: prefetch request %s left the waiting queue as %s",
                           request.request_id, request.status)
        self._inflight = self._inflight_plan = None
        self._finish(request)
        self._retry(plan, self._clock.monotonic())

    def hold(self, waiting: Any) -> None:
        """Before ``schedule()``: the waiting turns of the job whose context
        is being loaded wait for that load, out of the queue for this step."""
        assert not self._held, "restore() must follow every hold()"
        plan = self._inflight_plan
        if plan is None:
            return
        held = [r for r in itertools.islice(waiting, 256)
                if r.status == RequestStatus.WAITING and request_meta(r).job_id == plan.job_id
                and not self.owns(r.request_id)]
        if held:
            waiting.remove_requests(held)
            self._held = held

    def restore(self, waiting: Any) -> None:
        """After ``schedule()``: the held turns wait again."""
        for request in self._held:
            waiting.add_request(request)
        self._held.clear()

    def freed(self, request: Request, stock_free: Callable[[Request], None]) -> None:
        """vLLM frees the prefetch ``request``'s blocks: a loaded one's are
        pinned for its job until its plan gives up (unless the job's own
        pin holds its context by now); the others go back to the pool."""
        self._ids.discard(request.request_id)
        plan = self._loaded.pop(request.request_id, None)
        if plan is None or self._pins.get(plan.job_id) is not None:
            stock_free(request)
            return
        ttl = max(plan.give_up_at - self._clock.monotonic(), plan.lead_s)
        self._pins.pin(request, plan.job_id, plan.rank, ttl, plan.tool_key)
