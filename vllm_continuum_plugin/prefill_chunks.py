"""Prefill chunks: a job's next turn does not wait behind a long prefill.

vLLM's scheduler gives the step's token budget to the running requests
first, in order, and the waiting queue gets what is left. A running prefill
of 49k tokens takes the whole budget (8,192 tokens on an H100 by default)
step after step, so an agent's next turn that needs a few hundred new
tokens over a context the pool already holds waits the whole prefill out:
2-3 s on Llama-3.1-70B, and the turn misses a 2 s TTFT bound it would have
kept by a wide margin. This head-of-line blocking is what made the turns
that returned to a context they kept miss the SLO in docs/capacity.md.

vLLM already has the knob that stops it, ``long_prefill_token_threshold``
(each request's chunk in a step is cut to it), but it is static: set, it
slows every long prefill in every step, whether anyone waits or not.
:class:`PrefillChunks` sets it for one step at a time, only while a later
turn of a job under way heads the waiting queue (Continuum ranks those
first) and its context is kept, so that what it must compute fits in its
share of the step, and a running prefill would take more than its share:
each prefill is cut to ``budget // (prefills running + 1)`` tokens (a whole
number of blocks), and the turn runs in the same step. Steps without such a
turn run exactly as vLLM would.

A next turn whose context was lost is itself a long prefill: letting it in
beside another only interleaves the two, and both finish later. The
scheduler's estimate of what the turn must compute (``new_tokens``) is
therefore None unless its context is held: by its job's pin (the prompt
beyond the pinned blocks), or by a host tier (the prompt beyond the job's
last context). Without a host tier even that costs: the blocks a cut
prefill holds for longer press on other jobs' pins, memory pressure
releases them, and their turns rebuild (70B traces at 0.5 sessions/min
without a tier: 6.8% slower mean JCT). The scheduler builds a
:class:`PrefillChunks` only under a KV connector by default
(``cut_long_prefills: with_tier``).

Invariants: the scheduler config's threshold is changed only inside one
``schedule()`` call (:meth:`PrefillChunks.apply` before it,
:meth:`PrefillChunks.restore` after, also when it raises); a threshold the
user set is never raised, only lowered; a step is never cut below one block
per request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sized
from typing import Any, Protocol

from vllm.v1.request import Request

from .request_record import request_meta

__all__ = ["NextTurnNeeds", "PrefillChunks", "chunk_share"]


class _Queue(Sized, Protocol):
    def peek_request(self) -> Request: ...


def chunk_share(budget: int, prefills: int, block_size: int) -> int:
    """The most tokens each of ``prefills`` running prefills may take in a
    step whose token ``budget`` must also leave one share to a waiting turn:
    ``budget // (prefills + 1)``, rounded down to whole blocks (a chunk that
    ends mid-block leaves that block unhashed until the next chunk), at
    least one block."""
    if budget <= 0 or prefills < 0 or block_size <= 0:
        raise ValueError(f"chunk_share needs budget > 0, prefills >= 0, block_size > 0; got "
                         f"budget={budget}, prefills={prefills}, block_size={block_size}")
    share = budget // (prefills + 1)
    return max(block_size, share // block_size * block_size)


class NextTurnNeeds:
    """The tokens a waiting request must compute when it is a later turn of
    a job under way whose context is held: its prompt beyond its job's pin,
    or, with a host tier, beyond the job's last context; None for a
    session's first turn, a request without a job, or a next turn whose
    context may be lost (it would be a long prefill itself)."""

    def __init__(self, jobs: Any, pins: Any, block_size: int, has_tier: bool) -> None:
        self._jobs = jobs  # the scheduler's JobTracker
        self._pins = pins  # its PinManager
        self._block_size = block_size
        self._has_tier = has_tier

    def __call__(self, request: Request) -> int | None:
        job_id = request_meta(request).job_id
        job = self._jobs.get(job_id) if job_id is not None else None
        if job is None or job.turns_finished == 0:
            return None
        pin = self._pins.held_for(job_id, request.block_hashes)
        if pin is not None:
            return max(0, request.num_tokens - len(pin.blocks_by_group[0]) * self._block_size)
        if self._has_tier and job.last_context_tokens > 0:
            return max(0, request.num_tokens - job.last_context_tokens)
        return None


def waiting_head(queues: Iterable[_Queue]) -> Request | None:
    """The request vLLM's waiting loop looks at first: the head of the first
    non-empty queue (those holding KV blocks are drained first)."""
    for queue in queues:
        if queue:
            return queue.peek_request()
    return None


class PrefillChunks:
    """Cuts long prefills for one step while a job's next turn waits (see
    module doc). ``new_tokens``: for a waiting request that is a later turn
    of a job under way whose context is held, the tokens it must compute;
    else None (the scheduler's job table and pins know)."""

    def __init__(self, scheduler_config: Any, budget: int, block_size: int,
                 new_tokens: Callable[[Request], int | None], on_cut: Callable[[], None] = lambda: None) -> None:
        self._config = scheduler_config
        self._budget = budget
        self._block_size = block_size
        self._new_tokens = new_tokens
        self._on_cut = on_cut  # the metrics' counter
        self._saved: int | None = None  # the threshold to restore; None: untouched this step
        # Steps in which a cut was applied.
        self.steps_cut = 0

    def cut_for(self, waiting_head: Request | None, running: Iterable[Request]) -> int | None:
        """This step's chunk cut, or None to leave the step as vLLM would
        schedule it: only when a running prefill has more left than its
        share and ``waiting_head`` is a job's next turn whose context is held
        and whose own new tokens fit in a share."""
        if waiting_head is None:
            return None
        prefills, longest = 0, 0  # running prefills, and the most any has left
        for r in running:
            left = r.num_prompt_tokens - r.num_computed_tokens
            if left > 0:
                prefills, longest = prefills + 1, max(longest, left)
        if not prefills:
            return None
        share = chunk_share(self._budget, prefills, self._block_size)
        current = int(self._config.long_prefill_token_threshold)
        if 0 < current <= share or longest <= share:
            return None  # the user's own cut is tighter, or no prefill is long
        needs = self._new_tokens(waiting_head)
        if needs is None or needs > share:
            return None  # not a next turn over a kept context: it would be a long prefill too
        return share

    def apply(self, queues: Iterable[_Queue], running: Iterable[Request]) -> None:
        """Before ``schedule()``: set this step's cut, if it needs one.
        ``queues``: the scheduler's waiting queues, in the order vLLM drains
        them."""
        cut = self.cut_for(waiting_head(queues), running)
        if cut is None:
            return
        self._saved = int(self._config.long_prefill_token_threshold)
        self._config.long_prefill_token_threshold = cut
        self.steps_cut += 1
        self._on_cut()

    def restore(self) -> None:
        """After ``schedule()``: the user's threshold again."""
        if self._saved is not None:
            self._config.long_prefill_token_threshold = self._saved
            self._saved = None
