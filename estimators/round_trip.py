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
* Globally (the last ``window`` samples of all jobs): the ``quantile`` of
  them once there are ``min_global_samples``, for jobs without enough data.
* Cold start: ``default_s`` (``is_measured`` tells it apart).

A sample above ``max_sample_s`` is not client overhead but a tool that was
not fast after all; it is dropped. Memory: ``window`` floats plus
``job_samples`` per tracked job (jobs are bounded by ``JobTracker``).

TTLs learned from measured gaps (Continuum's CDF rule, the Bayesian layer)
already contain the overhead and do not add it again.
"""

from __future__ import annotations

import math
from collections import deque

from .history import JobState, _SortedSamples

__all__ = ["RoundTripOverhead"]


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
        self._global = _SortedSamples(window)
        # The global margin changes only when a sample arrives: cached.
        self._global_margin: float | None = None

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
        self._global.add(sample)
        self._global_margin = None

    def margin(self, job: JobState | None) -> float:
        """Seconds a TTL from a tool-duration estimate must add for ``job``."""
        samples = job.overhead_samples if job is not None else None
        if samples is not None and len(samples) >= self.min_job_samples:
            return max(samples)
        return self.global_margin()

    def is_measured(self, job: JobState | None) -> bool:
        """Is ``margin(job)`` a measurement (``job``'s own samples, or the
        server's quantile) rather than ``default_s``? Cold-start TTLs add the
        margin only then (``TTLContext.round_trip_measured``)."""
        samples = job.overhead_samples if job is not None else None
        if samples is not None and len(samples) >= self.min_job_samples:
            return True
        return len(self._global) >= self.min_global_samples

    def global_margin(self) -> float:
        if self._global_margin is None:
            n = len(self._global)
            if n < self.min_global_samples:
                self._global_margin = self.default_s
            else:
                index = min(n - 1, max(0, math.ceil(self.quantile * n) - 1))
                self._global_margin = float(self._global.as_array()[index])
        return self._global_margin
