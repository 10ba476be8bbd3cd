"""Admission: a new job waits while the jobs under way fill the KV pool.

When the contexts of the jobs already under way exceed the pool, admitting
one more only makes every job rebuild its context after each tool call: the
FCFS collapse, where everyone thrashes and nobody finishes. The gate holds a
new job's first turn back while the jobs under way would not fit with it, so
the admitted ones keep their contexts and finish fast.

* A job is *under way* from its first admitted turn until its last turn
  ends, while it has a turn running or waiting (a later turn that arrived
  and waits in the queue keeps its job counted however long it waits: at
  load a turn can queue far longer than the gaps after which jobs return,
  and a gate that let such a job go quiet would admit a newcomer over it),
  or its last turn finished less than its quiet horizon ago:
  ``quiet_after_s`` (``max_ttl_s``: no TTL holds a context longer, so a
  job quiet for that long no longer counts on its KV), or for a turn whose reply called no tool the horizon
  :func:`return_horizon` learns from the scope's measured gaps after such
  replies. A reply without a tool call may be the session's last (a client
  that never says so, such as AIPerf's replay, ends every session that way),
  and a job quiet well past the gaps after which such jobs did come back
  has most likely ended: counting it until ``max_ttl_s`` would hold
  newcomers behind a session that is gone.
* Its *footprint* is its context's blocks as last seen (the prompt of its
  admitted turn, then everything the turn computed). A turn whose TTL chose
  not to hold its context (freed or offloaded) holds nothing: the job
  leaves the demand until its next turn is admitted.
* With ``forecast`` on, a footprint is what the job will hold, not what it
  holds: agent sessions grow after admission (by ~30k tokens on the real
  Claude Code traces), so a gate that counts only the context as last seen
  admits jobs that will not fit later, and they thrash. The forecast is the
  mean growth, first admission to end, of the last jobs that ended
  (``GROWTH_WINDOW``, once ``MIN_GROWTH_SAMPLES`` ended): a job under way
  counts ``max(blocks now, blocks at admission + mean growth)``, a newcomer
  its prompt plus the mean growth.
* Blocks several jobs share (a system prompt, a tool list: the same chained
  block hashes) are one set of blocks in the pool and count once: each job
  counts the blocks beyond the longest prefix it shares with another job
  under way, and each shared prefix (named by its last block's hash) counts
  once.
* A job's first turn is admitted when the footprints of the jobs under way
  plus its prompt fit in the pool. New jobs pass the gate in queue order
  (bounded job-level FCFS): the first that does not fit holds back every
  later one, so a large job is not overtaken forever by small ones. A known
  session's new conversation (a sub-agent, a side request) passes at once,
  or with ``admission_sub_agents`` (``on_first_turn`` with
  ``known_session``) waits for room but goes ahead of every stranger's new
  job: its session is under way and waits on it, so it is never held
  behind a stranger, while a sub-agent admitted over a full pool costs the
  jobs under way their contexts (its parent's included) as any newcomer
  does.

``capacity_blocks`` is what the server keeps without recomputing: the
pool, or with a host tier of known size the pool and the tier together
(``tier_capacity``; the scheduler then keeps counting a job whose context
left the GPU, since the tier holds it).

The bound adapts to what the jobs hold, not to a count of sessions: many
short contexts or a few long ones. A job's later turns (a follow-up after
an answer included: the job stays known), a known session's new
conversation (unless ``admission_sub_agents``) and an implicit job's turns
(an untagged request that continues an earlier one) are never held: the
scheduler does not report them. An untagged request that continues
nothing is a newcomer like a new job's first turn (``admission_untagged``):
whether it starts a session shows only at its next turn, and admitting it
over the jobs under way costs them their contexts all the same. Once
admitted it counts while it runs, and after its end only as the job it
turned out to start: an implicit agent's (a tool call), or a chat's where
the scope's answers are seen to come back (``GateFeed.untagged_finished``);
a one-shot request leaves the demand when it finishes.

Bounds, so that no job starves and the engine never idles for it:

* a first turn that has waited ``max_wait_s`` (``admission_max_wait_s``)
  passes whatever the pool holds;
* when nothing is running, the first held turn passes (a gate must not
  idle the GPU).

Invariant: a held request is out of the scheduler's waiting queue only for
the duration of one ``schedule()`` call (:meth:`hold_back` before it,
:meth:`restore` after), so every other path (aborts, stats, the engine's
"has work" checks) sees it waiting.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from vllm.v1.request import Request

from .estimators.history import SlidingMean
from .prompt_prefix import PromptPrefix

__all__ = ["GROWTH_WINDOW", "MIN_GROWTH_SAMPLES", "MIN_RETURN_SAMPLES", "AdmissionGate", "return_horizon"]

# Ended jobs whose growth the forecast averages, and how many must have
# ended before it forecasts at all.
GROWTH_WINDOW = 256
MIN_GROWTH_SAMPLES = 8
# The quiet horizon after a reply without a tool call (``return_horizon``):
# this quantile of the measured gaps after which such jobs came back, times
# the margin, once the scope has measured this many.
RETURN_QUANTILE = 0.99
RETURN_MARGIN = 1.2
MIN_RETURN_SAMPLES = 32
# Jobs whose size at first admission is remembered for their growth sample
# (the oldest go first past this: a job that never ends gives no sample).
MAX_TRACKED_JOBS = 65536


def return_horizon(gaps: np.ndarray | None, longest_s: float) -> float:
    """How long a job whose last reply called no tool counts as under way.

    ``gaps`` are the sorted gaps (seconds) after which jobs of the scope came
    back after such a reply; ``longest_s`` the gate's horizon for every job.
    With at least ``MIN_RETURN_SAMPLES`` gaps: ``RETURN_MARGIN`` times their
    ``RETURN_QUANTILE`` quantile, at most ``longest_s``; else ``longest_s``.
    Gaps measure only the jobs that did come back, so the horizon bounds how
    long a returning job can be out of the demand: with the margin, almost
    never; a job that ended leaves the demand after it, not after
    ``longest_s``."""
    if gaps is None or len(gaps) < MIN_RETURN_SAMPLES:
        return longest_s
    quantile = float(gaps[min(len(gaps) - 1, int(RETURN_QUANTILE * len(gaps)))])
    return min(longest_s, RETURN_MARGIN * quantile)


@dataclass
class _Footprint:
    """What one job under way holds."""

    # Its context's full blocks as last seen.
    blocks: int
    # Its last admitted prompt (to find what later jobs share with it).
    prompt: PromptPrefix
    # Leading blocks it shares with another job under way, and that shared
    # prefix's name (the hash of its last block); 0 and None: none.
    shared: int = 0
    shared_key: Any = None
    # When its last turn finished (None while one is in flight).
    finished_at: float | None = None
    # How long after that it stops counting (the gate's horizon, or its
    # reply's ``return_horizon``).
    quiet_after_s: float = math.inf


class AdmissionGate:
    """Holds new jobs' first turns while the pool is spoken for (see module doc)."""

    def __init__(
        self,
        capacity_blocks: int,
        block_size: int,
        quiet_after_s: float,
        max_wait_s: float,
        rank: Callable[[Request], Any],
        forecast: bool = False,
        has_waiting_turn: Callable[[str], bool] = lambda job_id: False,
    ) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self.quiet_after_s = quiet_after_s
        self.max_wait_s = max_wait_s
        self._rank = rank
        self.forecast = forecast
        # Whether a job has a later turn waiting in the queue (the
        # scheduler's WaitingTurns): such a job is never quiet.
        self._has_waiting_turn = has_waiting_turn
        self._jobs: dict[str, _Footprint] = {}
        # job -> (blocks at its first admission, blocks last seen): a job's
        # growth when it ends (kept while it holds nothing, too).
        self._sizes: dict[str, tuple[int, int]] = {}
        self._growth = SlidingMean(GROWTH_WINDOW)
        # request id -> (a stranger's: False for a known session's new
        # conversation, which sorts first), a waiting first turn
        self._new: dict[str, tuple[bool, Request]] = {}
        self._held: list[Request] = []
        self.held_total = 0  # first turns held back in a step (a turn held for k steps counts k)
        # The last decision, reused while nothing it depends on changed: the
        # reports above (version), whether anything runs, and the clock
        # before the next job goes quiet or held turn becomes overdue.
        self._version = 0
        self._decided: tuple[int, bool] | None = None
        self._decision: list[Request] = []
        self._valid_until = -math.inf

    # -- what the scheduler reports ------------------------------------------
    def on_first_turn(self, request: Request, known_session: bool = False) -> None:
        """A new job's first turn is waiting; ``known_session``: it opens a
        new conversation of a session under way (a sub-agent, a side
        request), which passes before every stranger's new job."""
        self._new[request.request_id] = (not known_session, request)
        self._version += 1

    def on_admitted(self, job_id: str, request: Request) -> None:
        """A turn of ``job_id`` was scheduled: the job is under way, with its
        prompt's blocks (at least), sharing the longest prefix it has in
        common with another job under way (O(jobs) hash compares)."""
        self._new.pop(request.request_id, None)
        prompt = PromptPrefix.of_request(request, self.block_size)
        old = self._jobs.get(job_id)
        footprint = _Footprint(max(prompt.num_blocks, old.blocks if old else 0), prompt)
        partner: _Footprint | None = None
        for other_id, other in self._jobs.items():
            if other_id == job_id:
                continue
            shared = min(other.prompt.shared_blocks(request.block_hashes), other.blocks)
            if shared > footprint.shared:
                footprint.shared, partner = shared, other
        if partner is not None:
            footprint.shared_key = request.block_hashes[footprint.shared - 1]
            if partner.shared < footprint.shared:  # the partner's prefix is the shared one now
                partner.shared, partner.shared_key = footprint.shared, footprint.shared_key
        self._jobs[job_id] = footprint
        self._note_size(job_id, footprint.blocks)
        self._version += 1

    def _note_size(self, job_id: str, blocks: int) -> None:
        first, last = self._sizes.pop(job_id, (blocks, blocks))
        self._sizes[job_id] = (first, max(last, blocks))
        if len(self._sizes) > MAX_TRACKED_JOBS:
            del self._sizes[next(iter(self._sizes))]

    def on_turn_finished(self, job_id: str, request: Request, now: float,
                         quiet_after_s: float | None = None) -> None:
        """A non-final turn finished: the job waits on its tool with this
        context, for at most ``quiet_after_s`` (the gate's horizon when None
        or longer)."""
        footprint = self._jobs.get(job_id)
        if footprint is not None:
            footprint.blocks = max(footprint.shared, request.num_tokens // self.block_size)
            footprint.finished_at = now
            footprint.quiet_after_s = (self.quiet_after_s if quiet_after_s is None
                                       else min(self.quiet_after_s, quiet_after_s))
            self._note_size(job_id, footprint.blocks)
            self._version += 1

    def on_job_end(self, job_id: str, ended: bool = False) -> None:
        """The job ended or answered (``ended``: its growth is a sample of
        the forecast), or its finished turn holds nothing (its TTL freed or
        offloaded the context): it leaves the demand."""
        if ended:
            sizes = self._sizes.pop(job_id, None)
            if sizes is not None:
                self._growth.add(sizes[1] - sizes[0])
                self._version += 1  # the forecast may have moved
        if self._jobs.pop(job_id, None) is not None:
            self._version += 1

    def discard(self, key: str) -> None:
        """Stop counting ``key`` and forget its sizes: it started no job (an
        untagged one-shot request), so it is no sample of growth either."""
        self._sizes.pop(key, None)
        self.on_job_end(key)

    def rename(self, old_key: str, new_key: str) -> None:
        """The job counted as ``old_key`` is ``new_key`` from now on (an
        untagged turn counted while it ran, whose job got its id at its
        end); nothing when ``old_key`` is not counted."""
        footprint = self._jobs.pop(old_key, None)
        if footprint is None:
            return
        self._jobs[new_key] = footprint
        sizes = self._sizes.pop(old_key, None)
        if sizes is not None:
            self._sizes[new_key] = sizes
        self._version += 1

    def expected_growth(self) -> int:
        """Blocks a job is forecast to grow by from its first admission to its
        end (0 with ``forecast`` off or too few jobs ended)."""
        if not self.forecast or len(self._growth) < MIN_GROWTH_SAMPLES:
            return 0
        return max(0, round(self._growth.mean()))

    def forget(self, request: Request) -> None:
        """A waiting turn left the queue: admitted, or aborted before it was
        (a first turn leaves the gate's queue; a later one's job may go
        quiet again, so the last decision is not reused)."""
        self._new.pop(request.request_id, None)
        self._version += 1

    # -- the gate --------------------------------------------------------------
    def demand_blocks(self, now: float) -> int:
        """Blocks the jobs under way hold, shared prefixes once; drops jobs
        quiet for too long."""
        quiet = [j for j, f in self._jobs.items() if f.finished_at is not None
                 and now - f.finished_at >= f.quiet_after_s and not self._has_waiting_turn(j)]
        for job_id in quiet:
            del self._jobs[job_id]
        prefixes: dict[Any, int] = {}
        own = 0
        growth = self.expected_growth()
        for job_id, f in self._jobs.items():
            blocks = f.blocks
            if growth:
                first = self._sizes.get(job_id, (blocks, blocks))[0]
                blocks = max(blocks, first + growth)
            own += blocks - f.shared
            if f.shared:
                prefixes[f.shared_key] = max(prefixes.get(f.shared_key, 0), f.shared)
        return own + sum(prefixes.values())

    def hold_back(self, waiting: Any, running: bool, now: float) -> None:
        """Take the first turns that must wait out of ``waiting`` (a
        ``RequestQueue``) for the coming ``schedule()``. ``running``: whether
        anything runs; ``now``: the clock of requests' arrival times."""
        assert not self._held, "restore() must follow every hold_back()"
        if not self._new:
            return
        if self._decided != (self._version, running) or now >= self._valid_until:
            self._decide(waiting, running, now)
        held = [r for r in self._decision if r in waiting]
        if held:
            waiting.remove_requests(held)
            self._held = held
            self.held_total += len(held)

    def _decide(self, waiting: Any, running: bool, now: float) -> None:
        room = self.capacity_blocks - self.demand_blocks(now)
        growth = self.expected_growth()
        ordered = sorted((entry for entry in self._new.values() if entry[1] in waiting),
                         key=lambda entry: (entry[0], self._rank(entry[1])))
        candidates = [request for _, request in ordered]
        decision: list[Request] = []
        blocked = False
        valid_until = math.inf
        for request in candidates:
            # Its prefix that jobs under way hold already costs nothing more.
            need = request.num_prompt_tokens // self.block_size - self._held_prefix(request) + growth
            due = request.arrival_time + self.max_wait_s
            if now >= due:
                continue  # overdue: passes whatever the pool holds
            if not blocked and (need <= room or (not running and not decision)):
                room -= need
                continue
            blocked = True
            decision.append(request)
            valid_until = min(valid_until, due)
        if decision:
            # A quiet job leaving the demand may open the gate (one with a
            # turn waiting leaves it only when that turn is admitted or
            # aborted, which changes the version).
            for job_id, f in self._jobs.items():
                if f.finished_at is not None and not self._has_waiting_turn(job_id):
                    valid_until = min(valid_until, f.finished_at + f.quiet_after_s)
        self._decision = decision
        self._decided = (self._version, running)
        self._valid_until = valid_until

    def _held_prefix(self, request: Request) -> int:
        """The longest prefix of ``request``'s prompt a job under way holds."""
        return max((min(f.prompt.shared_blocks(request.block_hashes), f.blocks) for f in self._jobs.values()),
                   default=0)

    def restore(self, waiting: Any) -> int:
        """Put the held first turns back (after ``schedule()``); returns how
        many were held."""
        held = len(self._held)
        if held:
            for request in self._held:
                waiting.add_request(request)
            self._held.clear()
        return held
