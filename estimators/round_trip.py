"""The client's share of an agent's tool gap, measured online.

The scheduler measures a "tool time" as the next turn's arrival minus the
previous turn's finish. That gap holds much more than the tool's own run:
the client parses the reply, litellm and the agent framework run, the
environment steps (``docker exec``), the request is built and crosses the
network. Real harnesses spend 0.2-2 s there. A TTL derived from the tool's
own expected duration (a client hint, a rule, the classifier) must cover
this overhead too, or a FAST pin lapses just before its next turn arrives.

``RoundTripOverhead`` learns it from turns whose tool duration was
estimated: one sample per measured gap, ``gap - estimated tool seconds``.

* Per job (``JobState.overhead_samples``, the last ``job_samples``): once a
  job has ``min_job_samples``, its margin is the largest of them. An agent's
  own overhead is steady, and an expired pin costs a full re-prefill while
  a pin held a little longer costs nothing once the next turn takes it over.
* Per client scope (the last ``window`` samples of the scope's jobs,
  ``JobState.scope``): the ``quantile`` of them once there are
  ``min_global_samples``, for jobs without enough data. With one scope this
  is the server-wide window it always was.
* A cold scope: the shared prior (``estimators.scopes``), the low median of
  the margins of at least ``PRIOR_QUORUM`` other warm scopes, one vote each:
  one client's round trips never set another's margin.
* Cold start: ``default_s`` (``is_measured`` tells it apart).

A sample above ``max_sample_s`` is not client overhead but a tool that was
not fast after all; it is dropped. Memory: ``window`` floats per scope
(at most ``max_scopes`` scopes, least recently active dropped) plus
``job_samples`` per tracked job (jobs are bounded by ``JobTracker``).

TTLs learned from measured gaps (Continuum's CDF rule, the Bayesian layer)
already contain the overhead and do not add it again.
"""

from __future__ import annotations

import math
from collections import deque

from .history import JobState, _SortedSamples
from .scopes import DEFAULT_SCOPE, ScopeTable, shared_prior

__all__ = ["RoundTripOverhead"]


class _ScopeWindow:
    """One scope's recent overhead samples and their cached quantile."""

    __slots__ = ("samples", "margin")

    def __init__(self, window: int) -> None:
        self.samples = _SortedSamples(window)
        # The quantile changes only when a sample arrives: cached.
        self.margin: float | None = None


class RoundTripOverhead:
    """Online estimate of the client overhead in a tool gap (see module doc)."""

    def __init__(
        self,
        default_s: float = 2.0,
        window: int = 512,
        job_samples: int = 8,
        min_job_samples: int = 3,
        min_global_samples: int = 20,
        quantile: float = 0.9,
        max_sample_s: float = 10.0,
        max_scopes: int = 256,
    ) -> None:
        if not (math.isfinite(default_s) and default_s >= 0):
            raise ValueError(f"default_s must be a finite number >= 0, got {default_s!r}")
        if not 0.0 < quantile <= 1.0:
            raise ValueError(f"quantile must be in (0, 1], got {quantile!r}")
        if min(window, job_samples, min_job_samples, min_global_samples) < 1 or min_job_samples > job_samples:
            raise ValueError(
                f"window={window}, job_samples={job_samples}, min_job_samples={min_job_samples}, "
                f"min_global_samples={min_global_samples}: expected counts >= 1 and "
                "min_job_samples <= job_samples"
            )
        self.default_s = default_s
        self.job_samples = job_samples
        self.min_job_samples = min_job_samples
        self.min_global_samples = min_global_samples
        self.quantile = quantile
        self.max_sample_s = max_sample_s
        self._scopes: ScopeTable[_ScopeWindow] = ScopeTable(lambda: _ScopeWindow(window), max_scopes)

    def observe(self, job: JobState, gap_s: float, tool_s: float) -> None:
        """A measured ``gap_s`` after a turn whose tool was expected to take
        ``tool_s`` (its own run time, not a round trip)."""
        sample = gap_s - tool_s
        if not math.isfinite(sample) or sample > self.max_sample_s:
            return
        sample = max(0.0, sample)
        if job.overhead_samples is None:
            job.overhead_samples = deque(maxlen=self.job_samples)
        job.overhead_samples.append(sample)
        scope_window = self._scopes.touch(_scope_of(job))
        scope_window.samples.add(sample)
        scope_window.margin = None

    def margin(self, job: JobState | None) -> float:
        """Seconds a TTL from a tool-duration estimate must add for ``job``."""
        samples = job.overhead_samples if job is not None else None
        if samples is not None and len(samples) >= self.min_job_samples:
            return max(samples)
        return self.global_margin(_scope_of(job))

    def is_measured(self, job: JobState | None) -> bool:
        """Is ``margin(job)`` a measurement (``job``'s own samples, its
        scope's quantile, or the shared prior) rather than ``default_s``?
        Cold-start TTLs add the margin only then
        (``TTLContext.round_trip_measured``)."""
        samples = job.overhead_samples if job is not None else None
        if samples is not None and len(samples) >= self.min_job_samples:
            return True
        return self._scope_margin(_scope_of(job)) is not None

    def global_margin(self, scope: str = DEFAULT_SCOPE) -> float:
        """The margin of a job of ``scope`` without enough samples of its
        own: the scope's quantile, else the shared prior, else the default."""
        margin = self._scope_margin(scope)
        return self.default_s if margin is None else margin

    def _is_warm(self, scope_window: _ScopeWindow) -> bool:
        return len(scope_window.samples) >= self.min_global_samples

    def _scope_margin(self, scope: str) -> float | None:
        """The scope's own quantile when warm, else the shared prior over
        other warm scopes' quantiles, else None."""
        own = self._scopes.get(scope)
        if own is not None and self._is_warm(own):
            return self._quantile(own)
        voters = self._scopes.voters(scope, self._is_warm)
        return shared_prior([self._quantile(w) for _, w in voters]) if voters else None

    def _quantile(self, scope_window: _ScopeWindow) -> float:
        if scope_window.margin is None:
            n = len(scope_window.samples)
            index = min(n - 1, max(0, math.ceil(self.quantile * n) - 1))
            scope_window.margin = float(scope_window.samples.as_array()[index])
        return scope_window.margin


def _scope_of(job: JobState | None) -> str:
    return job.scope if job is not None else DEFAULT_SCOPE
