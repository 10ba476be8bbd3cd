"""A synthetic workload's description (``WorkloadSpec``, ``ToolSpec``) and
its jobs (``generate_jobs``): a pure function of the spec and the seed.

Arrivals are a Poisson process (``_poisson_arrivals``, also used to give a
recorded trace fresh arrivals); each job's content comes from its own numpy
stream. The randomness contract is in ``benchmarks.workload``'s docstring.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .workload_checks import _check_int, _check_positive, _check_range, _check_seed, _draw_int
from .workload_jobs import Job, Turn
from .workload_tool_times import Distribution

__all__ = ["ToolSpec", "WorkloadSpec", "generate_jobs"]

# Second word of the numpy seed of each stream (see the module docstring).
# Neither may be 0: SeedSequence([s]) and SeedSequence([s, 0]) are the same.
_ARRIVAL_STREAM = 1
_JOB_STREAM = 2


@dataclass(frozen=True)
class ToolSpec:
    """One tool of a workload's mix.

    ``key`` is the history key the plugin's parser derives from ``command``
    (``estimators.parser.tool_key_for_command``), so per-tool statistics
    line up with the scheduler's. ``weight`` (> 0) is relative to the other
    tools of the mix. ``output_tokens`` is the uniform ``(min, max)`` range
    of the tokens the tool prints, before ``WorkloadSpec.tool_output_scale``.
    """

    key: str
    command: str
    weight: float
    distribution: Distribution
    output_tokens: tuple[int, int]

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValueError(f"ToolSpec.key must be a non-empty str, got {self.key!r}")
        if not isinstance(self.command, str) or not self.command:
            raise ValueError(f"ToolSpec {self.key!r} command must be a non-empty str, got {self.command!r}")
        _check_positive(f"ToolSpec {self.key!r} weight", self.weight)
        if not isinstance(self.distribution, Distribution):
            raise ValueError(f"ToolSpec {self.key!r} distribution must be a Distribution, got {self.distribution!r}")
        _check_range(f"ToolSpec {self.key!r} output_tokens", self.output_tokens, 0)


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything ``generate_jobs`` needs besides the seed.

    Ranges are ``(min, max)`` integer pairs drawn uniformly, both ends
    included -- or, for ``turns`` and ``task_tokens``, drawn from
    ``turns_distribution`` / ``task_distribution`` when given, rounded and
    clipped to the range (sessions whose sizes are spread, not uniform).
    Invariants: ``num_jobs >= 1``; ``jobs_per_s > 0``;
    ``1 <= turns[0]``; ``output_tokens[0] >= 1``; ``tools`` non-empty
    unless every job has a single turn; ``tool_output_scale > 0``.
    """

    name: str
    num_jobs: int
    jobs_per_s: float  # Poisson arrival rate
    turns: tuple[int, int]  # (min, max) turns per job
    system_tokens: int
    task_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    tools: tuple[ToolSpec, ...]
    tool_output_scale: float = 1.0  # multiplies every tool's output tokens
    turns_distribution: Distribution | None = None  # None: uniform over ``turns``
    task_distribution: Distribution | None = None  # None: uniform over ``task_tokens``

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"WorkloadSpec.name must be a non-empty str, got {self.name!r}")
        _check_int("WorkloadSpec.num_jobs", self.num_jobs, 1)
        _check_positive("WorkloadSpec.jobs_per_s", self.jobs_per_s)
        _check_range("WorkloadSpec.turns", self.turns, 1)
        _check_int("WorkloadSpec.system_tokens", self.system_tokens, 0)
        _check_range("WorkloadSpec.task_tokens", self.task_tokens, 0)
        _check_range("WorkloadSpec.output_tokens", self.output_tokens, 1)
        tools = tuple(self.tools)
        for i, tool in enumerate(tools):
            if not isinstance(tool, ToolSpec):
                raise ValueError(f"WorkloadSpec.tools[{i}] must be a ToolSpec, got {tool!r}")
        if not tools and self.turns[1] > 1:
            raise ValueError(f"WorkloadSpec.tools is empty but jobs may have up to {self.turns[1]} turns")
        object.__setattr__(self, "tools", tools)
        _check_positive("WorkloadSpec.tool_output_scale", self.tool_output_scale)
        for name in ("turns_distribution", "task_distribution"):
            dist = getattr(self, name)
            if dist is not None and not isinstance(dist, Distribution):
                raise ValueError(f"WorkloadSpec.{name} must be a Distribution or None, got {dist!r}")


class _ToolPicker:
    """Chooses a tool of a mix with probability proportional to its weight."""

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        self._tools = tuple(tools)
        self._cumulative = np.cumsum([t.weight for t in self._tools]).tolist()

    def pick(self, rng: np.random.Generator) -> ToolSpec:
        u = rng.random() * self._cumulative[-1]
        return self._tools[min(bisect.bisect_right(self._cumulative, u), len(self._tools) - 1)]


def _poisson_arrivals(num_jobs: int, jobs_per_s: float, seed: int) -> list[float]:
    """Arrival offsets of a Poisson process of rate ``jobs_per_s`` started at 0.

    Nondecreasing; the first arrival is the first exponential gap (> 0 with
    probability 1). For a fixed ``seed`` the result is proportional to
    ``1 / jobs_per_s`` and its first ``n`` entries do not depend on
    ``num_jobs``.
    """
    gaps = np.random.default_rng([seed, _ARRIVAL_STREAM]).standard_exponential(num_jobs)
    return (np.cumsum(gaps) / jobs_per_s).tolist()


def _draw_spread(rng: np.random.Generator, bounds: tuple[int, int], dist: Distribution | None) -> int:
    """An integer in ``bounds``: uniform without ``dist``, else ``dist``'s
    sample rounded half up and clipped to ``bounds`` (one draw either way)."""
    if dist is None:
        return _draw_int(rng, bounds)
    return min(bounds[1], max(bounds[0], int(math.floor(dist.sample(rng) + 0.5))))


def _scaled(tokens: int, scale: float) -> int:
    """``tokens * scale`` rounded half up (deterministic, unlike ``round``)."""
    return int(math.floor(tokens * scale + 0.5))


def _sample_job(spec: WorkloadSpec, picker: _ToolPicker | None, seed: int, index: int, arrival_s: float) -> Job:
    """Job ``index`` of ``spec``; its content depends only on (spec minus rate, seed, index).

    Draw order (part of the reproducibility contract): number of turns, task
    tokens, then per turn: reply tokens and, unless last, tool, tool seconds,
    tool output tokens.
    """
    rng = np.random.default_rng([seed, _JOB_STREAM, index])
    num_turns = _draw_spread(rng, spec.turns, spec.turns_distribution)
    new_tokens = _draw_spread(rng, spec.task_tokens, spec.task_distribution)
    turns: list[Turn] = []
    for k in range(num_turns):
        output_tokens = _draw_int(rng, spec.output_tokens)
        if k == num_turns - 1:
            turns.append(Turn(k, new_tokens, output_tokens, "", "", 0.0))
            break
        assert picker is not None  # WorkloadSpec guarantees tools when turns > 1
        tool = picker.pick(rng)
        tool_seconds = tool.distribution.sample(rng)
        turns.append(Turn(k, new_tokens, output_tokens, tool.key, tool.command, tool_seconds))
        new_tokens = _scaled(_draw_int(rng, tool.output_tokens), spec.tool_output_scale)
    return Job(f"job-{index:04d}", arrival_s, spec.system_tokens, tuple(turns))


def generate_jobs(spec: WorkloadSpec, seed: int) -> list[Job]:
    """The ``spec.num_jobs`` jobs of ``spec``, in arrival order.

    Deterministic for ``(spec, seed)``. Arrivals are a Poisson process of
    rate ``spec.jobs_per_s`` started at time 0: the first job arrives after
    one exponential gap, not at 0. Job ids are ``job-0000``, ``job-0001``, ...
    in arrival order. Each non-last turn's tool is drawn by weight; the last
    turn runs no tool. See the module docstring for the independent streams
    that keep job contents identical across arrival rates.
    """
    if not isinstance(spec, WorkloadSpec):
        raise ValueError(f"spec must be a WorkloadSpec, got {spec!r}")
    _check_seed(seed)
    picker = _ToolPicker(spec.tools) if spec.tools else None
    arrivals = _poisson_arrivals(spec.num_jobs, spec.jobs_per_s, seed)
    return [_sample_job(spec, picker, seed, i, arrival) for i, arrival in enumerate(arrivals)]
