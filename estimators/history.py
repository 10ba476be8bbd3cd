"""Bounded histories the TTL rule learns from.

* ``ToolDurationHistory``: measured tool durations per tool key, kept sorted so
  the empirical CDF is a binary search away. LRU over tool keys, FIFO over each
  tool's samples.
* ``JobTracker``: per-job timing (first arrival, last finish, last tool key,
  turns done, requests in flight), LRU over jobs. It turns "next turn arrived"
  into a tool-duration sample: arrival of turn k+1 minus finish of turn k.
* ``SlidingMean`` and ``TurnCountCorrelation``: the paper's T (queueing delay of
  requests whose KV was evicted) and eta (-Corr(k, N-k) over finished jobs).

Everything here is pure Python + numpy, touched only from the scheduler thread.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from .scopes import DEFAULT_SCOPE

__all__ = [
    "JobState",
    "JobTracker",
    "SlidingMean",
    "ToolDurationHistory",
    "TurnCountCorrelation",
]


class _SortedSamples:
    """FIFO-bounded multiset of floats that is always available sorted.

    Invariant: ``_sorted[:_n]`` holds exactly the values of ``fifo``, in
    ascending order. Inserts and evictions shift the array in place
    (memmove), so the CDF rule reads a ready numpy array after every new
    sample instead of rebuilding one.
    """

    __slots__ = ("fifo", "_sorted", "_n", "_sum", "max_samples", "version", "_view")

    def __init__(self, max_samples: int) -> None:
        self.max_samples = max_samples
        self.fifo: deque[float] = deque()
        self._sorted = np.empty(min(max_samples, 64), dtype=np.float64)
        self._n = 0
        self._sum = 0.0
        # Bumped by every add: decisions derived from the samples are cached
        # against it (``CDFTTLPolicy``).
        self.version = 0
        self._view: np.ndarray | None = None

    def add(self, value: float) -> None:
        if self._n >= self.max_samples:
            oldest = self.fifo.popleft()
            self._sum -= oldest
            i = int(np.searchsorted(self._sorted[: self._n], oldest))
            self._sorted[i : self._n - 1] = self._sorted[i + 1 : self._n]
            self._n -= 1
        if self._n == self._sorted.shape[0]:
            grown = np.empty(min(self.max_samples, 2 * self._n), dtype=np.float64)
            grown[: self._n] = self._sorted[: self._n]
            self._sorted = grown
        i = int(np.searchsorted(self._sorted[: self._n], value, side="right"))
        self._sorted[i + 1 : self._n + 1] = self._sorted[i : self._n]
        self._sorted[i] = value
        self._n += 1
        self.fifo.append(value)
        self._sum += value
        self.version += 1
        self._view = None

    def as_array(self) -> np.ndarray:
        """Sorted samples (a read-only view, valid until the next add)."""
        view = self._view
        if view is None:
            view = self._view = self._sorted[: self._n]
            view.flags.writeable = False
        return view

    def __len__(self) -> int:
        return self._n

    def mean(self) -> float:
        return self._sum / self._n if self._n else 0.0


class ToolDurationHistory:
    """Measured tool durations, per tool key and globally.

    Bounded memory: at most ``max_tools`` tool keys (least recently updated
    is dropped) and ``max_samples`` samples per key and in the global pool.
    """

    def __init__(self, max_samples: int = 4096, max_tools: int = 1024) -> None:
        if max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {max_samples}")
        if max_tools < 1:
            raise ValueError(f"max_tools must be >= 1, got {max_tools}")
        self.max_samples = max_samples
        self.max_tools = max_tools
        self._per_tool: OrderedDict[str, _SortedSamples] = OrderedDict()
        self._global = _SortedSamples(max_samples)
        # Samples held in all (per tool and global): what the history's
        # memory grows with (``ScopedToolHistory`` bounds it over scopes).
        self._stored = 0

    def record(self, tool_key: str, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return  # clock skew between API server and engine: ignore
        samples = self._per_tool.get(tool_key)
        if samples is None:
            if len(self._per_tool) >= self.max_tools:
                _, dropped = self._per_tool.popitem(last=False)
                self._stored -= len(dropped)
            samples = self._per_tool[tool_key] = _SortedSamples(self.max_samples)
        else:
            self._per_tool.move_to_end(tool_key)
        before = len(samples) + len(self._global)
        samples.add(seconds)
        self._global.add(seconds)
        self._stored += len(samples) + len(self._global) - before

    def stored_samples(self) -> int:
        """Samples held per tool and globally (O(1)): at most
        ``(max_tools + 1) * max_samples``."""
        return self._stored

    def samples(self, tool_key: str | None = None) -> _SortedSamples | None:
        """The sorted samples of one tool (all tools when key is None)."""
        return self._global if tool_key is None else self._per_tool.get(tool_key)

    def num_samples(self, tool_key: str | None = None) -> int:
        if tool_key is None:
            return len(self._global)
        samples = self._per_tool.get(tool_key)
        return len(samples) if samples is not None else 0

    def sorted_samples(self, tool_key: str | None = None) -> np.ndarray:
        """Sorted durations of one tool (or all tools when key is None)."""
        if tool_key is None:
            return self._global.as_array()
        samples = self._per_tool.get(tool_key)
        return samples.as_array() if samples is not None else np.empty(0)

    def mean(self, tool_key: str) -> float | None:
        samples = self._per_tool.get(tool_key)
        return samples.mean() if samples else None

    def tool_keys(self) -> list[str]:
        return list(self._per_tool)


@dataclass
class JobState:
    """What the scheduler knows about one agent job."""

    job_id: str
    # Arrival of the turn that started the job's current activity period:
    # its first turn, or the first turn after it was idle longer than
    # ``JobTracker.idle_reset_s`` (job-level ordering counts from here).
    first_arrival: float
    turns_finished: int = 0
    in_flight: int = 0
    last_finish_time: float | None = None
    last_tool_key: str | None = None
    # Tool call of the last finished turn and the decider's predicted
    # duration for it, compared with the measured time at the next arrival.
    last_call: object | None = None
    last_predicted_s: float | None = None
    # The tool's own expected run time when the last turn's TTL came from
    # one (hint, rule, classifier): the next gap minus it is client overhead.
    last_tool_s: float | None = None
    # Tokens of the last finished turn's context (prompt + reply): what a
    # second tier may hold of the job when its next turn arrives.
    last_context_tokens: int = 0
    # Prefix-cache hit of the job's first turn, in tokens: the context it
    # shares with earlier traffic (a system prompt). When the job ends, its
    # blocks past this go first out of the prefix cache (eviction_order).
    first_hit_tokens: int | None = None
    # Some finished turn of this job called a tool: the job's next reply
    # without one is its final answer (unless the client flags its turns).
    had_tool_call: bool = False
    # Whether the last finished turn's request offered the model tools
    # (None: not known): a one-turn conversation that offered none beside
    # an agent's is a side request (a title), ended when the agent arrives.
    tools_offered: bool | None = None
    # Recent client-overhead samples (``RoundTripOverhead``), or None.
    overhead_samples: deque[float] | None = None
    # The client scope that started the job (``estimators.scopes``): its
    # measured tool times and round trips teach that scope only.
    scope: str = DEFAULT_SCOPE


class JobTracker:
    """Per-job timing with LRU eviction of idle jobs.

    A job is "touched" on every arrival and finish; when more than ``max_jobs``
    jobs are tracked the least recently touched job with nothing in flight is
    forgotten (a job that never returns must not leak memory). A turn that
    arrives more than ``idle_reset_s`` after the job's last finish starts a
    new activity period: ``first_arrival`` becomes its arrival, so a job id
    reused after a long pause does not keep an old place in the queue.
    """

    def __init__(self, max_jobs: int = 65536, idle_reset_s: float = math.inf) -> None:
        if max_jobs < 1:
            raise ValueError(f"max_jobs must be >= 1, got {max_jobs}")
        if not idle_reset_s >= 0:
            raise ValueError(f"idle_reset_s must be >= 0, got {idle_reset_s!r}")
        self.max_jobs = max_jobs
        self.idle_reset_s = idle_reset_s
        self._jobs: OrderedDict[str, JobState] = OrderedDict()

    def get(self, job_id: str) -> JobState | None:
        return self._jobs.get(job_id)

    def __len__(self) -> int:
        return len(self._jobs)

    def on_arrival(
        self, job_id: str, arrival_time: float, scope: str = DEFAULT_SCOPE
    ) -> tuple[JobState, float | None, str | None]:
        """Register a turn's arrival.

        Returns (job state, measured tool seconds or None, tool key or None).
        A tool duration is measured only when the job had a finished turn and
        nothing in flight: overlapping turns of one job are not tool gaps.
        ``scope`` is the arriving request's client scope; a new job keeps it
        for good (``JobState.scope``).
        """
        job = self._jobs.get(job_id)
        measured: float | None = None
        tool_key: str | None = None
        if job is None:
            job = JobState(job_id=job_id, first_arrival=arrival_time, scope=scope)
            self._jobs[job_id] = job
            self._evict_if_needed()
        else:
            self._jobs.move_to_end(job_id)
            if job.in_flight == 0 and job.last_finish_time is not None:
                measured = max(0.0, arrival_time - job.last_finish_time)
                tool_key = job.last_tool_key
                if measured > self.idle_reset_s:
                    job.first_arrival = arrival_time
        job.in_flight += 1
        return job, measured, tool_key

    def on_finish(self, job_id: str, finish_time: float, tool_key: str | None, counted: bool) -> JobState | None:
        """Register a turn's end. ``counted`` is False for aborted turns."""
        job = self._jobs.get(job_id)
        if job is None:
            return None
        self._jobs.move_to_end(job_id)
        job.in_flight = max(0, job.in_flight - 1)
        if counted:
            job.turns_finished += 1
            job.last_finish_time = finish_time
            job.last_tool_key = tool_key
        return job

    def forget(self, job_id: str) -> JobState | None:
        return self._jobs.pop(job_id, None)

    def forget_if_idle(self, job_id: str) -> None:
        """Forget ``job_id`` unless a turn of it is in flight."""
        job = self._jobs.get(job_id)
        if job is not None and job.in_flight == 0:
            del self._jobs[job_id]

    def _evict_if_needed(self) -> None:
        if len(self._jobs) <= self.max_jobs:
            return
        for job_id, job in self._jobs.items():
            if job.in_flight == 0:
                del self._jobs[job_id]
                return
        # Every tracked job has a request in flight: drop the oldest anyway;
        # it only loses its tool-time sample, never correctness.
        self._jobs.popitem(last=False)


class SlidingMean:
    """Mean of the last ``window`` observations (O(1) per update)."""

    def __init__(self, window: int = 256) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._values: deque[float] = deque(maxlen=window)
        self._sum = 0.0

    def add(self, value: float) -> None:
        if len(self._values) == self._values.maxlen:
            self._sum -= self._values[0]
        self._values.append(value)
        self._sum += value

    def mean(self, default: float = 0.0) -> float:
        return self._sum / len(self._values) if self._values else default

    def __len__(self) -> int:
        return len(self._values)


class TurnCountCorrelation:
    """eta = -Corr(k, N - k) over the turns of recently finished jobs.

    For each finished job with N turns, the points (k, N - k) for k = 1..N
    enter a sliding window of at most ``window`` points; running sums make
    each update O(1). eta is clamped to [0, 1]: 1 for fixed-length jobs
    (keeping job order pays fully), 0 when remaining work is memoryless.
    """

    def __init__(self, window: int = 4096, default: float = 1.0) -> None:
        self._points: deque[tuple[int, int]] = deque()
        self._window = window
        self._default = default
        self._sx = self._sy = self._sxx = self._syy = self._sxy = 0.0

    def _push(self, x: int, y: int) -> None:
        self._points.append((x, y))
        self._sx += x
        self._sy += y
        self._sxx += x * x
        self._syy += y * y
        self._sxy += x * y
        if len(self._points) > self._window:
            ox, oy = self._points.popleft()
            self._sx -= ox
            self._sy -= oy
            self._sxx -= ox * ox
            self._syy -= oy * oy
            self._sxy -= ox * oy

    def add_job(self, num_turns: int) -> None:
        for k in range(1, max(1, num_turns) + 1):
            self._push(k, num_turns - k)

    def eta(self) -> float:
        n = len(self._points)
        if n < 2:
            return self._default
        var_x = self._sxx - self._sx * self._sx / n
        var_y = self._syy - self._sy * self._sy / n
        if var_x <= 1e-12 or var_y <= 1e-12:
            # All jobs have one turn, or identical k: no evidence either way.
            return self._default if var_x <= 1e-12 else 0.0
        cov = self._sxy - self._sx * self._sy / n
        corr = cov / math.sqrt(var_x * var_y)
        return min(1.0, max(0.0, -corr))
