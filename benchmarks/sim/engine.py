"""The replay loop: vLLM's real scheduler, a virtual clock, a step-time model.

Each step:

1. every turn whose arrival time has come is added (``add_request``) with
   what the client profile sends (``clients``: the job metadata --
   ``job_id``, ``is_last_step``, ``tool_name`` -- or a session id alone) and
   an ``arrival_time`` read from the virtual clock;
2. ``schedule()`` runs on the real scheduler (vLLM's stock one, or the
   plugin's ``continuum`` / ``context_serve``);
3. the batch it built is read off the ``SchedulerOutput`` -- for each
   scheduled request its new tokens and the context computed before them --
   and priced by the :class:`~.step_model.StepModel`; the clock advances by
   that many seconds;
4. a ``ModelRunnerOutput`` with scripted tokens (the reply the job's next
   turn re-sends) goes to ``update_from_output()``;
5. each finished turn queues its job's next turn at ``now + think_s`` and
   launches the sub-agents it starts; a blocking sub-agent holds its
   parent's next turn until it has finished (then ``resume_s`` later).

When nothing runs, the clock jumps to the next arrival (or pin deadline).

Invariants: nothing on a decision path reads a wall clock -- the scheduler,
its pins and its estimators read the injected :class:`ManualClock`, which
only this loop advances -- so a run is a pure function of its inputs and two
runs give identical records. Wall time is measured (for the simulator's own
speed) and reported apart from the records.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import deque
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import BlockHash, hash_block_tokens, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from vllm_continuum_plugin.clock import ManualClock

from .batch import BatchShape, PrefillChunk
from .clients import TAGGED, ClientProfile, request_metadata, retention_directives
from .jobs import Segment, SimJob, TokenBook
from .offload import OffloadCopies

if TYPE_CHECKING:
    from .offload import OffloadWorker
    from .step_model import StepModel

__all__ = ["JobHasher", "ReplayEngine", "RunRecords", "SimulationStuck", "TurnRecord"]

# Seconds: two events this close are one (float sums of step times).
_EPS = 1e-9
# Idle steps that draining the offload copies may take before the run is stuck.
_MAX_DRAIN_STEPS = 100_000
_NO_COPIES = OffloadCopies()  # a step without an offload worker


class SimulationStuck(RuntimeError):
    """Requests wait, nothing can be scheduled, and no event is pending."""


@dataclass
class TurnRecord:
    """What one turn saw. Times are seconds from the start of the run."""

    job_id: str
    turn: int
    arrival_s: float
    prompt_tokens: int
    reusable_tokens: int  # what a pool that never evicts would hold (prefix shared with the previous turn)
    output_tokens: int = 0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    cached_tokens: int = 0  # prefix-cache hit at first admission
    # Seconds the turn waited for its prefix to load from a host tier
    # (vLLM's asynchronous OffloadingConnector: from the load's start to its
    # report), part of ``queueing_s``; 0 when nothing was loaded so.
    load_wait_s: float = 0.0
    prefill_tokens: int = 0  # prompt tokens computed, every admission counted (preemption recomputes)
    preemptions: int = 0

    @property
    def ttft_s(self) -> float:
        assert self.first_token_s is not None
        return self.first_token_s - self.arrival_s

    @property
    def queueing_s(self) -> float:
        assert self.first_scheduled_s is not None
        return self.first_scheduled_s - self.arrival_s

    @property
    def recomputed_tokens(self) -> int:
        """Prefill work beyond what no pool could have saved: tokens this turn
        computed although its job had them in KV before (evicted, or
        recomputed after a preemption)."""
        must = self.prompt_tokens - self.reusable_tokens
        return max(0, self.prefill_tokens - must)


@dataclass
class RunRecords:
    """One arm's run: per-turn records and per-run counters."""

    turns: list[TurnRecord] = field(default_factory=list)
    job_arrival_s: dict[str, float] = field(default_factory=dict)
    job_finish_s: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    busy_s: float = 0.0
    makespan_s: float = 0.0
    preemptions: int = 0
    loaded_tokens: int = 0
    stored_tokens: int = 0
    counters: dict[str, Any] = field(default_factory=dict)  # pins, releases (plugin schedulers)
    wall_s: float = 0.0  # the simulator's own time: NOT deterministic, kept out of summaries

    def jct_s(self) -> dict[str, float]:
        return {j: self.job_finish_s[j] - a for j, a in self.job_arrival_s.items() if j in self.job_finish_s}


class JobHasher:
    """vLLM's block hashes (the same chain ``get_request_block_hasher``
    computes), reused along each job: a turn re-sends its job's whole history,
    and hashing 100k tokens each turn would dominate the run.

    Per job it keeps the request it hashed last (its token ids and block
    hashes only ever grow, so they stay valid). A new request reuses the
    hashes of the longest run of that request's blocks whose tokens it
    repeats, found by comparing token slices (one C-level comparison per
    probe of a binary search, not a Python step per block), and hashes only
    the blocks past it. A block's hash is a function of its parent's hash and
    its tokens, so equal tokens from the start mean equal hashes: the reuse
    is exact.

    Invariant: for every request, the hashes equal vLLM's own hasher's.
    """

    def __init__(self, block_size: int) -> None:
        init_none_hash(sha256)
        self.block_size = block_size
        self._last: dict[str, Request] = {}  # job -> the request it hashed last

    def for_job(self, job_id: str) -> Callable[[Request], list[BlockHash]]:
        size = self.block_size
        last = self._last

        def hasher(request: Request) -> list[BlockHash]:
            first = len(request.block_hashes)  # blocks this request hashed already
            full = request.num_tokens // size
            if full <= first:
                return []
            tokens = request.all_token_ids
            parent = request.block_hashes[-1] if first else None
            out: list[BlockHash] = []
            reuse = first
            prev = last.get(job_id)
            if prev is not None and prev is not request:
                known = prev.block_hashes
                # Its blocks continue this request's chain only if the two
                # agree up to ``first`` (equal parent hash: equal history).
                if first <= len(known) and (first == 0 or known[first - 1] == parent):
                    reuse = _common_blocks(tokens, prev.all_token_ids, first, min(len(known), full), size)
                    out = known[first:reuse]
                    if out:
                        parent = out[-1]
            for b in range(reuse, full):
                parent = hash_block_tokens(sha256, parent, tuple(tokens[b * size : (b + 1) * size]), None)
                out.append(parent)
            last[job_id] = request
            return out

        return hasher

    def forget(self, job_id: str) -> None:
        self._last.pop(job_id, None)


def _common_blocks(tokens: Sequence[int], known: Sequence[int], lo: int, hi: int, size: int) -> int:
    """The largest ``k`` in ``[lo, hi]`` with ``tokens`` and ``known`` equal on
    blocks ``[lo, k)`` (given equal before ``lo``). Equality of a prefix is
    monotone in its length, so a binary search over slice comparisons finds
    it; the common case -- the whole known history repeated -- is one probe."""
    if tokens[lo * size : hi * size] == known[lo * size : hi * size]:
        return hi
    while lo < hi:  # invariant: blocks [.., lo) equal, block hi - 1 or earlier differs
        mid = (lo + hi + 1) // 2
        if tokens[lo * size : mid * size] == known[lo * size : mid * size]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class _Live:
    """A submitted turn in flight."""

    job: int
    turn: int
    request: Request
    reply: list[int]
    record: TurnRecord


class ReplayEngine:
    """Replays ``jobs`` through ``scheduler`` on ``clock`` priced by ``step_model``.

    ``send_metadata``: whether requests carry the job metadata (the plugin's
    schedulers read it; vLLM's stock one ignores it either way); ``client``:
    what they carry (``clients.request_metadata``).

    Only top-level jobs have a JCT (``RunRecords.job_arrival_s``); a
    sub-agent's turns are recorded like any other and count in its
    session's time through the parent's turns it holds.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        clock: ManualClock,
        step_model: "StepModel",
        jobs: Sequence[SimJob],
        *,
        block_size: int,
        send_metadata: bool = True,
        on_turn_finished: Callable[[TurnRecord], None] | None = None,
        offload_worker: "OffloadWorker | None" = None,
        max_jobs_in_flight: int = 0,
        client: ClientProfile = TAGGED,
    ) -> None:
        self.scheduler = scheduler
        self.clock = clock
        self.step_model = step_model
        self.jobs = list(jobs)
        self.block_size = block_size
        self.send_metadata = send_metadata
        self.client = client
        self.on_turn_finished = on_turn_finished
        self.offload_worker = offload_worker
        # Plain admission in front of the engine (a client- or router-side
        # cap): at most this many jobs between their first turn's submission
        # and their last turn's finish; later jobs wait first come, first
        # served, and the wait counts in their JCT. 0: no cap.
        self.max_jobs_in_flight = max_jobs_in_flight
        self._jobs_in_flight = 0
        self._capped: deque[int] = deque()  # jobs waiting at the cap, in arrival order
        self.book = TokenBook()
        self.hasher = JobHasher(block_size)
        self._t0 = clock.monotonic()
        self._events: list[tuple[float, int, int, int]] = []  # (time, seq, job, turn)
        self._seq = 0
        self._live: dict[str, _Live] = {}
        # Requests whose asynchronous load is in flight -> when it started.
        self._loading: dict[str, float] = {}
        self._prompts: dict[int, tuple[tuple[Segment, ...], list[int]]] = {}  # job -> its last prompt's ids
        self._index = {job.job_id: i for i, job in enumerate(self.jobs)}
        # (parent job, turn) -> the sub-agent jobs that turn launches.
        self._children: dict[tuple[int, int], list[int]] = {}
        for i, job in enumerate(self.jobs):
            if job.parent:
                if job.parent not in self._index:
                    raise ValueError(f"sub-agent {job.job_id!r} names parent {job.parent!r}, which is not a job")
                self._children.setdefault((self._index[job.parent], job.launch_after), []).append(i)
        # parent job -> [blocking sub-agents still running, earliest time its next turn may come]
        self._held: dict[int, list[float]] = {}
        self.records = RunRecords()

    # -- time ---------------------------------------------------------------
    def now(self) -> float:
        """Seconds since the run started, on the virtual clock."""
        return self.clock.monotonic() - self._t0

    def _advance_to(self, t: float) -> None:
        dt = t - self.now()
        if dt > 0:
            self.clock.advance(dt)

    # -- arrivals -----------------------------------------------------------
    def _queue(self, t: float, job: int, turn: int) -> None:
        heapq.heappush(self._events, (t, self._seq, job, turn))
        self._seq += 1

    def _submit(self, job_index: int, turn_index: int) -> None:
        job = self.jobs[job_index]
        turn = job.turns[turn_index]
        last = turn_index == len(job.turns) - 1
        extra: dict[str, Any] | None = None
        session: str | None = None
        if self.send_metadata:
            extra, session = request_metadata(self.client, job.job_id, last, turn.tool_name, job.session)
            if self.client.retention == "continuum-policy":
                previous = self._prompts.get(job_index)
                directives = retention_directives(
                    turn.prompt[0].length, len(previous[1]) if previous else 0, turn.prompt_tokens,
                    None if last else job.turns[turn_index + 1].think_s)
                extra = {**(extra or {}), "retention_directives": directives}
        params = SamplingParams(max_tokens=turn.output_tokens, ignore_eos=True, extra_args=extra)
        request_id = f"{job.job_id}#{turn_index}"
        prompt = self.book.prompt(turn.prompt, self._prompts.get(job_index))
        self._prompts[job_index] = (turn.prompt, prompt)
        request = Request(
            request_id=request_id,
            prompt_token_ids=prompt,
            sampling_params=params,
            pooling_params=None,
            arrival_time=self.clock.time(),
            block_hasher=self.hasher.for_job(job.job_id),
            session_id=session,
        )
        # A prefix hit is whole blocks, and vLLM recomputes at least the
        # prompt's last token: what any pool could serve is rounded so.
        bs = self.block_size
        reusable = min(job.reusable_tokens(turn_index), (turn.prompt_tokens - 1) // bs * bs) // bs * bs
        record = TurnRecord(job.job_id, turn_index, self.now(), turn.prompt_tokens, reusable, turn.output_tokens)
        self._live[request_id] = _Live(job_index, turn_index, request, job.reply_tokens(turn_index, self.book), record)
        self.scheduler.add_request(request)

    def _admit_capped(self) -> None:
        """Submit the first turns waiting at the job cap while it has room
        (every job counts from its first submission to its last finish)."""
        if not self.max_jobs_in_flight:
            return
        while self._capped and self._jobs_in_flight < self.max_jobs_in_flight:
            self._jobs_in_flight += 1
            self._submit(self._capped.popleft(), 0)

    def _next_event_s(self, waiting: bool) -> float | None:
        """The next arrival, and while requests ``waiting`` cannot be
        scheduled also what can unblock them: the next pin deadline (frees
        memory) and the next offload copy to complete (a loaded prefix). An
        idle engine need not wake for either: the next ``schedule()`` releases
        every lapsed pin before it admits anything, and a copy is reported by
        the next step whenever it comes."""
        times = [self._events[0][0]] if self._events else []
        if waiting:
            pins = getattr(self.scheduler, "pins", None)
            deadline = pins.next_deadline() if pins is not None else None
            copy = self.offload_worker.next_completion_s() if self.offload_worker is not None else None
            for t in (None if deadline is None else deadline - self._t0, copy):
                if t is not None and t > self.now() + _EPS:
                    times.append(t)
        return min(times) if times else None

    # -- one step -----------------------------------------------------------
    def _batch(self, output: SchedulerOutput) -> BatchShape:
        prefills: list[PrefillChunk] = []
        decodes: list[int] = []
        now = self.now()
        for new_req in output.scheduled_new_reqs:
            live = self._live[new_req.req_id]
            if live.record.first_scheduled_s is None:
                live.record.first_scheduled_s = now
                live.record.cached_tokens = new_req.num_computed_tokens
        for req_id in output.scheduled_cached_reqs.resumed_req_ids:
            self._live[req_id].record.preemptions += 1
            self.records.preemptions += 1
        for req_id, n in output.num_scheduled_tokens.items():
            live = self._live[req_id]
            request = live.request
            # schedule() has already advanced num_computed_tokens by n.
            before = request.num_computed_tokens - n
            if n == 1 and request.num_output_tokens > 0 and before == request.num_tokens - 1:
                decodes.append(before)
            else:
                prefills.append(PrefillChunk(n, before))
                live.record.prefill_tokens += min(n, max(0, request.num_prompt_tokens - before))
        return BatchShape(tuple(prefills), tuple(decodes))

    def _runner_output(self, output: SchedulerOutput) -> ModelRunnerOutput:
        req_ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for req_id in req_ids:
            live = self._live[req_id]
            request = live.request
            if request.num_computed_tokens >= request.num_tokens:
                sampled.append([live.reply[request.num_output_tokens]])
            else:
                sampled.append([])
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )

    def _collect(self, engine_outputs: Any) -> None:
        now = self.now()
        for eco in (engine_outputs or {}).values():
            for out in eco.outputs:
                live = self._live.get(out.request_id)
                if live is None:
                    continue
                if out.new_token_ids and live.record.first_token_s is None:
                    live.record.first_token_s = now
                if out.finish_reason is not None:
                    self._finish(live, now)

    def _finish(self, live: _Live, now: float) -> None:
        del self._live[live.request.request_id]
        live.record.finish_s = now
        self.records.turns.append(live.record)
        job = self.jobs[live.job]
        kids = self._children.get((live.job, live.turn), [])
        for kid in kids:
            self._queue(now + self.jobs[kid].arrival_s, kid, 0)
        held = sum(1 for kid in kids if self.jobs[kid].blocking)
        if live.turn + 1 < len(job.turns):
            if held:
                self._held[live.job] = [held, now]
            else:
                self._queue(now + job.turns[live.turn + 1].think_s, live.job, live.turn + 1)
        else:
            if not job.parent:
                self.records.job_finish_s[job.job_id] = now
            self.hasher.forget(job.job_id)
            self._prompts.pop(live.job, None)
            if self.max_jobs_in_flight and not job.parent:
                self._jobs_in_flight -= 1
            if job.blocking:
                self._release_parent(job, now)
        if self.on_turn_finished is not None:
            self.on_turn_finished(live.record)

    def _release_parent(self, child: SimJob, now: float) -> None:
        """A blocking sub-agent finished: its parent's next turn (the one
        after the turn that launched it) comes ``resume_s`` after the last of
        its blocking sub-agents finishes."""
        parent = self._index[child.parent]
        held = self._held.get(parent)
        if held is None:  # the launching turn was the parent's last: nothing to hold
            return
        held[0] -= 1
        held[1] = max(held[1], now + child.resume_s)
        if held[0] == 0:
            del self._held[parent]
            self._queue(held[1], parent, child.launch_after + 1)

    # -- the loop -----------------------------------------------------------
    def run(self) -> RunRecords:
        wall0 = time.perf_counter()
        for i, job in enumerate(self.jobs):
            if job.parent:
                continue  # launched by its parent's turn
            self.records.job_arrival_s[job.job_id] = job.arrival_s
            self._queue(job.arrival_s, i, 0)
        sched = self.scheduler
        while self._events or self._live or self._capped:
            # (A parent held by its sub-agents has one of them live or queued.)
            while self._events and self._events[0][0] <= self.now() + _EPS:
                _, _, job, turn = heapq.heappop(self._events)
                if turn == 0 and self.max_jobs_in_flight and not self.jobs[job].parent:
                    self._capped.append(job)
                else:
                    self._submit(job, turn)
            self._admit_capped()
            if not self._live:
                nxt = self._next_event_s(waiting=False)
                due = self._prefetch_due_s()
                if due is not None and (nxt is None or due < nxt):
                    # vLLM's engine is woken for a due prefetch (the plugin's
                    # EngineWaker): a step that runs no model starts it.
                    self._advance_to(max(self.now(), due))
                    self._idle_step(sched.schedule())
                    continue
                assert nxt is not None
                self._advance_to(nxt)
                continue
            output = sched.schedule()
            if output.total_num_scheduled_tokens == 0:
                # Nothing fits: what frees memory or brings work is an event.
                if self._idle_step(output):
                    continue  # copies reported (a loaded prefix): the next schedule() may run it
                if self._events and self._events[0][0] <= self.now() + _EPS:
                    continue  # a flush's stall carried the clock past an arrival
                nxt = self._next_event_s(waiting=True)
                if nxt is None or nxt <= self.now() + _EPS:
                    raise SimulationStuck(
                        f"{len(self._live)} turns wait and nothing can be scheduled at t={self.now():.3f}s "
                        f"(pool too small for one prompt?)"
                    )
                self._advance_to(nxt)
                continue
            batch = self._batch(output)
            runner_output = self._runner_output(output)
            copies = self._start_copies(output)
            if copies.synchronous and (copies.loaded_tokens or copies.stored_tokens):
                batch = dataclasses.replace(batch, loaded_tokens=copies.loaded_tokens,
                                            stored_tokens=copies.stored_tokens)
            dt = self.step_model.step_seconds(batch) + copies.stall_s
            self.clock.advance(dt)
            self.records.steps += 1
            self.records.busy_s += dt
            self._report_copies(runner_output)
            self._collect(sched.update_from_output(output, runner_output))
        self.records.makespan_s = self.now()
        prefetch = getattr(self.scheduler, "prefetch", None)
        if prefetch is not None:
            prefetch.cancel_all()  # the replay is over: no tool returns
        self._drain_pins()
        self._drain_copies()
        metrics = getattr(self.scheduler, "continuum_metrics", None)
        if metrics is not None:
            self.records.counters = {
                "pins_created": metrics.pins_created,
                "pins_released": dict(metrics.pins_released),
                "pin_hit_tokens": metrics.pin_hit_tokens,
                "prefetches": dict(metrics.prefetches),
            }
        self.records.wall_s = time.perf_counter() - wall0
        return self.records

    def _prefetch_due_s(self) -> float | None:
        """When the scheduler's next prefetch is due, on the run's clock
        (None: none, or not a plugin scheduler)."""
        prefetch = getattr(self.scheduler, "prefetch", None)
        due = prefetch.next_due() if prefetch is not None else None
        return None if due is None else due - self._t0

    def _drain_pins(self) -> None:
        """Let every pin lapse (the clock moves past each deadline and a step
        releases it), so the run ends with every KV block free and the pin
        counters final."""
        pins = getattr(self.scheduler, "pins", None)
        last: float | None = None
        while pins is not None and (deadline := pins.next_deadline()) is not None:
            if deadline == last:  # a lapsed pin that release_expired keeps: nothing more to wait for
                raise SimulationStuck(f"a pin with deadline {deadline} is not released after it lapsed")
            last = deadline
            self._advance_to(max(self.now(), deadline - self._t0) + _EPS)
            self._idle_step(self.scheduler.schedule())

    def _drain_copies(self) -> None:
        """Run idle steps until the offload connector and its workers have no
        copy left (vLLM's engine keeps stepping while the connector has
        work: ``has_pending_push_work``), so the store and its counters are
        final."""
        worker = self.offload_worker
        if worker is None:
            return
        connector = getattr(self.scheduler, "connector", None)
        for _ in range(_MAX_DRAIN_STEPS):
            nxt = worker.next_completion_s()
            if nxt is None and not (connector is not None and connector.has_pending_push_work()):
                return
            if nxt is not None:
                self._advance_to(max(self.now(), nxt))
            self._idle_step(self.scheduler.schedule())
        raise SimulationStuck(f"offload copies still pending after {_MAX_DRAIN_STEPS} idle steps")

    def _idle_step(self, output: SchedulerOutput) -> bool:
        """A step that runs no model: the workers still run the step's
        offload copies (a finished request's blocks are freed when its final
        stores are reported; a flush stalls the clock). Returns whether the
        workers reported any copy done, which the scheduler acts on only in
        its next ``schedule()``."""
        runner_output = ModelRunnerOutput(req_ids=[], req_id_to_index={})
        copies = self._start_copies(output)
        if copies.stall_s > 0:
            self.clock.advance(copies.stall_s)
        reported = self._report_copies(runner_output)
        self.scheduler.update_from_output(output, runner_output)
        return reported

    def _start_copies(self, output: SchedulerOutput) -> OffloadCopies:
        """The offload copies the step that ``output`` schedules starts now
        (none without an offload worker), counted in the records."""
        if self.offload_worker is None:
            return _NO_COPIES
        copies = self.offload_worker.submit(output, self.now())
        for req_id in copies.load_requests:
            self._loading.setdefault(req_id, self.now())
        self.records.loaded_tokens += copies.loaded_tokens
        self.records.stored_tokens += copies.stored_tokens
        return copies

    def _report_copies(self, runner_output: ModelRunnerOutput) -> bool:
        """What the workers report with the step that ends now; whether they
        report anything."""
        if self.offload_worker is None:
            return False
        out = runner_output.kv_connector_output = self.offload_worker.report(self.now())
        if out is None:
            return False
        for req_id in out.finished_recving or ():
            started = self._loading.pop(req_id, None)
            live = self._live.get(req_id)
            if started is not None and live is not None:
                live.record.load_wait_s += self.now() - started
        return True

    def free_blocks(self) -> tuple[int, int]:
        """(free, usable) KV blocks of the pool (the null block excluded)."""
        pool = self.scheduler.kv_cache_manager.block_pool
        return pool.get_num_free_blocks(), pool.num_gpu_blocks - 1
