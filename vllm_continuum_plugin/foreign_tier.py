"""The scheduler's view of a KV tier it does not drive.

With vLLM's native ``OffloadingConnector`` or LMCache configured (and not the
plugin's own connector), a context dropped from the GPU is usually still in
that connector's tier, and a returning turn waits in
``WAITING_FOR_REMOTE_KVS`` while it is loaded. :class:`ForeignTier` watches
those loads from the scheduler's events and feeds
:class:`~.estimators.tier_reload.TierReloadModel`, so the TTL rule prices a
dropped context as the reload it costs and soft pins know when holding an
older job's context is not worth keeping a newer request out.

Events (each an O(1) call from the scheduler, except :meth:`after_step`,
which looks at the waiting turns of jobs):

* :meth:`after_step` -- a later turn of a job that the step put into
  ``WAITING_FOR_REMOTE_KVS`` starts a load timer (the tokens the tier will
  supply are in the request's prefill stats, set at that lookup);
* :meth:`load_finished` -- vLLM found the load done (or failed);
* :meth:`admitted` -- a returning turn was scheduled: how much of its
  earlier context, missing on the GPU, the tier supplied;
* :meth:`forget` -- the request finished or went away.

Invariant: the timer holds at most one entry per waiting request, and none
for a request the scheduler no longer has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from vllm.v1.request import Request, RequestStatus

from .estimators.history import JobState
from .estimators.tier_reload import TierLoadTimer, TierReloadModel

__all__ = ["ForeignTier"]

# Context length at which a reload and a prefill are compared to call pins
# cheap: both costs are affine in tokens with small intercepts, plus an
# attention term for the prefill that grows with the context, so the answer
# at 16k (a typical agent context) holds for longer ones as long as a reload
# costs less per token than a prefill (what a tier is for).
_COMPARE_AT_TOKENS = 16 * 1024


class ForeignTier:
    """Learns a foreign connector's reload cost for one scheduler."""

    def __init__(self, block_size: int, prefill_seconds: Callable[[int, int], float]) -> None:
        self.model = TierReloadModel()
        self._timer = TierLoadTimer(self.model)
        self._block_size = block_size
        self._prefill_seconds = prefill_seconds

    def after_step(self, waiting_turns: Iterable[Iterable[Request]], now: float) -> None:
        """Start timing the loads the step began (``waiting_turns``: the
        waiting requests of jobs, grouped by job)."""
        timer = self._timer
        for turns in waiting_turns:
            for request in turns:
                if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS and request.request_id not in timer:
                    stats = getattr(request, "prefill_stats", None)
                    timer.start(request.request_id, now, getattr(stats, "num_external_cached_tokens", 0))

    def load_finished(self, request_id: str, now: float, failed: bool) -> None:
        self._timer.finish(request_id, now, failed)

    def admitted(self, request: Request, job: JobState | None) -> None:
        """A turn of ``job`` was scheduled: record how much of the job's
        earlier context, missing on the GPU, the tier supplied (the turn's
        new tokens were never stored anywhere, so they do not count)."""
        stats: Any = getattr(request, "prefill_stats", None)
        if job is None or job.turns_finished == 0 or stats is None or not stats.num_prompt_tokens:
            return
        earlier = min(stats.num_prompt_tokens, job.last_context_tokens)
        missing = earlier - stats.num_local_cached_tokens
        if missing >= self._block_size:
            self.model.observe_return(missing, stats.num_external_cached_tokens)

    def forget(self, request_id: str) -> None:
        self._timer.forget(request_id)

    def rebuild_seconds(self, tokens: int) -> float | None:
        """What dropping ``tokens`` of context costs, or None while unknown."""
        return self.model.rebuild_seconds(tokens, self._prefill_seconds)

    def pins_are_cheap(self) -> bool:
        """The tier reloads a context faster than a prefill rebuilds it
        (measured): dropping a pin then costs a reload."""
        reload = self.rebuild_seconds(_COMPARE_AT_TOKENS)
        return reload is not None and reload < self._prefill_seconds(_COMPARE_AT_TOKENS, 0)

    @property
    def timed_loads(self) -> int:
        """Loads being timed now."""
        return len(self._timer)
