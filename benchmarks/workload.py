"""Synthetic and recorded multi-turn agent workloads for the A/B benchmark.

A *job* is one agent session. Turn ``k`` sends the whole conversation so far
(system prompt, every earlier user/assistant message) plus ``new_tokens`` new
tokens -- the task prompt on turn 0, the previous tool's output afterwards --
and gets a reply of ``output_tokens`` tokens. The reply names a shell command;
the tool "runs" for ``tool_seconds`` and its output becomes the next turn's
new tokens. The last turn runs no tool. Token counts are content tokens; the
chat template adds a few tokens per message on top.

Jobs come from a ``WorkloadSpec`` (``generate_jobs``; ``PRESETS`` holds the
named ones) or from a trace file that an agent loop wrote (``read_trace``).

Randomness. ``generate_jobs(spec, seed)`` is a pure function of its inputs.
It uses independent numpy streams:

* arrivals: ``default_rng([seed, 1])`` draws ``num_jobs`` standard
  exponential gaps; job ``i`` arrives at ``sum(gaps[:i+1]) / jobs_per_s``. So
  the first job arrives after its own gap, not at 0 (a Poisson process
  started at time 0), and changing ``jobs_per_s`` only rescales the time
  axis;
* job ``i``'s content: ``default_rng([seed, 2, i])``. Job contents therefore
  do not depend on ``jobs_per_s`` or ``num_jobs`` (the first ``n`` jobs are
  the same for any ``num_jobs >= n``), and ``tool_output_scale`` changes
  only the tool outputs' token counts.

Every policy arm of a benchmark thus replays exactly the same jobs.

Trace files are JSON lines, one object per turn::

    {"job": "job-0003", "turn": 0, "arrival_s": 1.25, "system_tokens": 120,
     "new_tokens": 180, "output_tokens": 24, "tool": "ls",
     "tool_command": "ls -la", "tool_seconds": 0.08}

``arrival_s`` and ``system_tokens`` repeat on every line of a job; a job's
lines appear in turn order (lines of different jobs may interleave); the last
turn has ``tool`` "" and ``tool_seconds`` 0. Other keys are ignored.

Run ``python -m vllm_continuum_plugin.benchmarks.workload --help`` to print a
preset's statistics or write it as a trace.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import numbers
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .stats import percentile

__all__ = [
    "PRESETS",
    "Distribution",
    "Fixed",
    "Job",
    "LogNormal",
    "Mixture",
    "ToolSpec",
    "Turn",
    "Uniform",
    "WorkloadSpec",
    "coding_agent_workload",
    "cpu_small_workload",
    "describe",
    "field_report_workload",
    "fixed_workload",
    "generate_jobs",
    "heavy_tail_workload",
    "read_trace",
    "write_trace",
]

# Second word of the numpy seed of each stream (see the module docstring).
# Neither may be 0: SeedSequence([s]) and SeedSequence([s, 0]) are the same.
_ARRIVAL_STREAM = 1
_JOB_STREAM = 2


# ----------------------------------------------------------------------
# Validation helpers
# ----------------------------------------------------------------------
def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_int(name: str, value: object, minimum: int) -> None:
    if not _is_int(value) or value < minimum:  # type: ignore[operator]
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_seconds(name: str, value: object) -> None:
    if not _is_real(value) or not math.isfinite(value) or value < 0:  # type: ignore[arg-type,operator]
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def _check_positive(name: str, value: object) -> None:
    if not _is_real(value) or not math.isfinite(value) or value <= 0:  # type: ignore[arg-type,operator]
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _check_range(name: str, value: object, minimum: int) -> None:
    """``value`` is a ``(low, high)`` pair of ints with ``minimum <= low <= high``."""
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or not all(_is_int(v) for v in value)
        or not minimum <= value[0] <= value[1]
    ):
        raise ValueError(f"{name} must be a (min, max) pair of integers with {minimum} <= min <= max, got {value!r}")


def _draw_int(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    """Uniform integer in ``[bounds[0], bounds[1]]``, both ends included."""
    return int(rng.integers(bounds[0], bounds[1] + 1))


# ----------------------------------------------------------------------
# Tool-time distributions
# ----------------------------------------------------------------------
@runtime_checkable
class Distribution(Protocol):
    """A distribution of non-negative durations in seconds."""

    def sample(self, rng: np.random.Generator) -> float:
        """One draw (>= 0) using ``rng``."""
        ...

    def mean(self) -> float:
        """The exact mean of ``sample``."""
        ...


@dataclass(frozen=True)
class Fixed:
    """Always ``seconds``. Consumes no randomness."""

    seconds: float

    def __post_init__(self) -> None:
        _check_seconds("Fixed.seconds", self.seconds)

    def sample(self, rng: np.random.Generator) -> float:
        return float(self.seconds)

    def mean(self) -> float:
        return float(self.seconds)


@dataclass(frozen=True)
class Uniform:
    """Uniform on ``[low, high)``, ``0 <= low <= high``."""

    low: float
    high: float

    def __post_init__(self) -> None:
        _check_seconds("Uniform.low", self.low)
        _check_seconds("Uniform.high", self.high)
        if self.low > self.high:
            raise ValueError(f"Uniform needs low <= high, got low={self.low!r}, high={self.high!r}")

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low, self.high))

    def mean(self) -> float:
        return (self.low + self.high) / 2.0


@dataclass(frozen=True)
class LogNormal:
    """Log-normal with the given ``median`` (> 0) and log-space ``sigma`` (>= 0).

    ``log(X) ~ Normal(log(median), sigma)``; mean is ``median * exp(sigma**2 / 2)``.
    """

    median: float
    sigma: float

    def __post_init__(self) -> None:
        _check_positive("LogNormal.median", self.median)
        _check_seconds("LogNormal.sigma", self.sigma)

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.lognormal(math.log(self.median), self.sigma))

    def mean(self) -> float:
        return self.median * math.exp(self.sigma**2 / 2.0)


@dataclass(frozen=True)
class Mixture:
    """Draws from component ``i`` with probability ``weight_i / sum(weights)``.

    ``components`` is a non-empty sequence of ``(weight, Distribution)`` with
    finite weights > 0 (stored as a tuple, so a ``Mixture`` is hashable). Used
    for heavy tails: ``Mixture([(0.97, body), (0.03, LogNormal(30, 0.5))])``.
    """

    components: tuple[tuple[float, Distribution], ...]
    _cumulative: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        components = tuple(tuple(c) for c in self.components)
        if not components:
            raise ValueError("Mixture needs at least one component, got none")
        for i, component in enumerate(components):
            if len(component) != 2:
                raise ValueError(f"Mixture.components[{i}] must be a (weight, Distribution) pair, got {component!r}")
            weight, distribution = component
            _check_positive(f"Mixture.components[{i}] weight", weight)
            if not isinstance(distribution, Distribution):
                raise ValueError(f"Mixture.components[{i}] must hold a Distribution, got {distribution!r}")
        object.__setattr__(self, "components", components)
        object.__setattr__(self, "_cumulative", tuple(np.cumsum([float(w) for w, _ in components]).tolist()))

    def sample(self, rng: np.random.Generator) -> float:
        u = rng.random() * self._cumulative[-1]
        index = min(bisect.bisect_right(self._cumulative, u), len(self.components) - 1)
        return self.components[index][1].sample(rng)

    def mean(self) -> float:
        return math.fsum(w * d.mean() for w, d in self.components) / self._cumulative[-1]


# ----------------------------------------------------------------------
# Jobs
# ----------------------------------------------------------------------
@dataclass(frozen=True)
class Turn:
    """One request of a job and the tool run that follows it.

    Invariants: ``index >= 0``; ``new_tokens >= 0``; ``output_tokens >= 1``;
    ``tool_seconds`` finite and >= 0.
    """

    index: int  # 0-based turn index within the job
    new_tokens: int  # tokens appended before this turn: task prompt on turn 0, previous tool's output after
    output_tokens: int  # reply length (max_tokens, generated with ignore_eos)
    tool: str  # tool key of the command this turn's reply runs ("" on the last turn)
    tool_command: str  # the command line, e.g. "python -m pytest -q" ("" on the last turn)
    tool_seconds: float  # how long the tool runs after this turn (0.0 on the last turn)

    def __post_init__(self) -> None:
        _check_int("Turn.index", self.index, 0)
        _check_int("Turn.new_tokens", self.new_tokens, 0)
        _check_int("Turn.output_tokens", self.output_tokens, 1)
        if not isinstance(self.tool, str):
            raise ValueError(f"Turn.tool must be a str, got {self.tool!r}")
        if not isinstance(self.tool_command, str):
            raise ValueError(f"Turn.tool_command must be a str, got {self.tool_command!r}")
        _check_seconds("Turn.tool_seconds", self.tool_seconds)


@dataclass(frozen=True)
class Job:
    """One agent session: its arrival and its turns.

    Invariants: ``job_id`` non-empty; ``arrival_s`` finite and >= 0;
    ``system_tokens >= 0``; ``turns`` is a non-empty tuple with
    ``turns[i].index == i``; the last turn runs no tool (``tool`` and
    ``tool_command`` are "" and ``tool_seconds`` is 0).
    """

    job_id: str
    arrival_s: float  # offset from the start of the run, seconds
    system_tokens: int
    turns: tuple[Turn, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.job_id, str) or not self.job_id:
            raise ValueError(f"Job.job_id must be a non-empty str, got {self.job_id!r}")
        _check_seconds(f"Job {self.job_id!r} arrival_s", self.arrival_s)
        _check_int(f"Job {self.job_id!r} system_tokens", self.system_tokens, 0)
        turns = tuple(self.turns)
        if not turns:
            raise ValueError(f"Job {self.job_id!r} needs at least one turn, got none")
        for i, turn in enumerate(turns):
            if not isinstance(turn, Turn):
                raise ValueError(f"Job {self.job_id!r} turns[{i}] must be a Turn, got {turn!r}")
            if turn.index != i:
                raise ValueError(f"Job {self.job_id!r} turns[{i}] has index {turn.index}; indices must be 0, 1, ...")
        last = turns[-1]
        if last.tool or last.tool_command or last.tool_seconds != 0:
            raise ValueError(
                f"Job {self.job_id!r}: the last turn ({last.index}) must run no tool, got tool={last.tool!r}, "
                f"tool_command={last.tool_command!r}, tool_seconds={last.tool_seconds!r}"
            )
        object.__setattr__(self, "turns", turns)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    def prompt_tokens(self, turn_index: int) -> int:
        """Content tokens of turn ``turn_index``'s prompt.

        System prompt, all new tokens up to and including that turn, and all
        earlier replies.
        """
        if not _is_int(turn_index) or not 0 <= turn_index < len(self.turns):
            raise ValueError(f"Job {self.job_id!r} has turns 0..{len(self.turns) - 1}, got turn_index {turn_index!r}")
        earlier = self.turns[:turn_index]
        return (
            self.system_tokens
            + sum(t.new_tokens for t in earlier)
            + self.turns[turn_index].new_tokens
            + sum(t.output_tokens for t in earlier)
        )

    def context_tokens(self) -> int:
        """Tokens of the final turn's prompt plus its reply: the job's full context.

        Equals ``system_tokens + sum(new_tokens) + sum(output_tokens)``.
        """
        return self.system_tokens + sum(t.new_tokens + t.output_tokens for t in self.turns)


# ----------------------------------------------------------------------
# Workload specs
# ----------------------------------------------------------------------
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
    included. Invariants: ``num_jobs >= 1``; ``jobs_per_s > 0``;
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
    num_turns = _draw_int(rng, spec.turns)
    new_tokens = _draw_int(rng, spec.task_tokens)
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


def _check_seed(seed: object) -> None:
    if not _is_int(seed) or seed < 0:  # type: ignore[operator]
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


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


# ----------------------------------------------------------------------
# Presets
# ----------------------------------------------------------------------
# Tool times measured in the field report: shell tools 50-200 ms, pytest 2-5 s.
_FAST_TOOL = Uniform(0.05, 0.2)
_PYTEST = Uniform(2.0, 5.0)

# (key, command, weight) of the field report's mix. pytest is picked on one
# tool call in eight; the fast tools share the rest, reads most often.
_SHELL_MIX: tuple[tuple[str, str, float], ...] = (
    ("ls", "ls -la", 0.25),
    ("cat", "cat main.py", 0.30),
    ("grep", "grep -rn TODO .", 0.20),
    ("git status", "git status", 0.125),
    ("python -m pytest", "python -m pytest -q", 0.125),
)

# Tool output token ranges sized so the field-report preset reproduces the
# report's prompt growth (weighted mean ~281 tokens per tool result).
_FIELD_REPORT_OUTPUTS: dict[str, tuple[int, int]] = {
    "ls": (20, 120),
    "cat": (200, 700),
    "grep": (50, 450),
    "git status": (20, 140),
    "python -m pytest": (300, 800),
}

# About two thirds of the above (weighted mean ~188 tokens), for cpu-small.
_CPU_SMALL_OUTPUTS: dict[str, tuple[int, int]] = {
    "ls": (15, 80),
    "cat": (130, 470),
    "grep": (35, 300),
    "git status": (15, 95),
    "python -m pytest": (200, 530),
}


def _shell_tools(outputs: dict[str, tuple[int, int]], time_of: Callable[[str], Distribution]) -> tuple[ToolSpec, ...]:
    return tuple(
        ToolSpec(key, command, weight, time_of(key), outputs[key]) for key, command, weight in _SHELL_MIX
    )


def _field_report_time(key: str) -> Distribution:
    return _PYTEST if key == "python -m pytest" else _FAST_TOOL


def field_report_workload(num_jobs: int, jobs_per_s: float, tool_output_scale: float = 1.0) -> WorkloadSpec:
    """The field report's agent, as measured.

    Field report table: 8 turns per job; prompt tokens grow from 92 on turn
    1 to 2,915 on turn 8; shell tools (ls, cat, grep, git status) take
    50-200 ms and ``python -m pytest`` 2-5 s.

    * 8 turns per job.
    * Turn-1 prompt of 92 tokens: system 60 + task 24-40 (mean 32).
    * Replies of 60-180 tokens (mean 120: a short thought plus a command).
    * Tool mix: ls 25 %, cat 30 %, grep 20 %, git status 12.5 %, pytest
      12.5 % (one tool call in eight); fast tools Uniform(0.05, 0.2) s,
      pytest Uniform(2, 5) s.
    * Tool outputs of tens to a few hundred tokens (ls 20-120, cat 200-700,
      grep 50-450, git status 20-140, pytest 300-800; weighted mean ~281),
      chosen so the turn-8 prompt averages 92 + 7 x (120 + 281) ~ 2,900
      tokens (report: 2,915) and the full context (plus the last reply)
      ~3,020.
    """
    return WorkloadSpec(
        name="field-report",
        num_jobs=num_jobs,
        jobs_per_s=jobs_per_s,
        turns=(8, 8),
        system_tokens=60,
        task_tokens=(24, 40),
        output_tokens=(60, 180),
        tools=_shell_tools(_FIELD_REPORT_OUTPUTS, _field_report_time),
        tool_output_scale=tool_output_scale,
    )


def cpu_small_workload(num_jobs: int, jobs_per_s: float, tool_output_scale: float = 1.0) -> WorkloadSpec:
    """The default for the CPU A/B (2 cores, a 135M model): field-report, scaled down.

    Same tool mix and tool times as ``field-report`` (field report: shell
    tools 50-200 ms, pytest 2-5 s, pytest on ~1 call in 8), so the KV cache
    is idle for the same gaps; fewer and smaller tokens so one arm of ~24
    jobs finishes in a few minutes on CPU:

    * 6 turns; system 120 tokens; task 150-250; replies 8-16 tokens, as
      measured in the field report (its bash-block replies were 7-12
      tokens), which also keeps CPU decode from dominating.
    * Tool outputs about two thirds of field-report's (ls 15-80, cat
      130-470, grep 35-300, git status 15-95, pytest 200-530; weighted mean
      ~188), so the final context averages 120 + 200 + 6 x 12 + 5 x 188 ~
      1,330 tokens (target 1,200-1,600): the field report's growth curve
      (92 -> 2,915 over 8 turns) at about half the size.
    """
    return WorkloadSpec(
        name="cpu-small",
        num_jobs=num_jobs,
        jobs_per_s=jobs_per_s,
        turns=(6, 6),
        system_tokens=120,
        task_tokens=(150, 250),
        output_tokens=(8, 16),
        tools=_shell_tools(_CPU_SMALL_OUTPUTS, _field_report_time),
        tool_output_scale=tool_output_scale,
    )


# Tail shared by every tool of heavy-tail: ~3 % of calls stall for tens of
# seconds (cold container, network filesystem, a command hitting a timeout).
_STALL = LogNormal(median=30.0, sigma=0.5)
_STALL_SHARE = 0.03

# (key, command, weight, body, output token range) of the heavy-tail mix.
_HEAVY_TAIL_MIX: tuple[tuple[str, str, float, LogNormal, tuple[int, int]], ...] = (
    ("ls", "ls -la", 0.20, LogNormal(0.1, 0.5), (20, 120)),
    ("cat", "cat main.py", 0.25, LogNormal(0.1, 0.5), (200, 700)),
    ("grep", "grep -rn TODO .", 0.15, LogNormal(0.2, 0.7), (50, 450)),
    ("git status", "git status", 0.10, LogNormal(0.15, 0.5), (20, 140)),
    ("python <script>", "python reproduce.py", 0.10, LogNormal(1.0, 0.8), (50, 400)),
    ("python -m pytest", "python -m pytest -q", 0.15, LogNormal(3.0, 0.6), (300, 800)),
    ("pip install", "pip install -e .", 0.05, LogNormal(8.0, 0.7), (100, 500)),
)


def heavy_tail_workload(num_jobs: int, jobs_per_s: float, tool_output_scale: float = 1.0) -> WorkloadSpec:
    """Long-tailed tool times: a stress case for TTL policies.

    Uniform times (``field-report``) have no tail, so a TTL that covers the
    observed maximum is always right. Real tool times are skewed, so here
    every tool is log-normal with medians in line with the field report
    (shell tools ~0.1-0.2 s, pytest ~3 s) plus slower tools agents also run:

    * ls 0.1 s / sigma 0.5, cat 0.1 / 0.5, grep 0.2 / 0.7, git status
      0.15 / 0.5, ``python reproduce.py`` 1.0 / 0.8, pytest 3.0 / 0.6,
      ``pip install -e .`` 8.0 / 0.7 (weights 20/25/15/10/10/15/5 %);
    * each mixed 97 % / 3 % with a stall ``LogNormal(30 s, 0.5)``, so the
      p99 tool time is tens of seconds, > 10x the median.
    * 4-12 turns per job (mean 8, as the field report; agent benchmarks
      report longer sessions, ~10-20 steps at the median, kept short here
      so the benchmark runs on CPU).
    * Tokens as ``field-report`` (system 60, task 24-40, replies 60-180,
      tool outputs of tens to a few hundred tokens), so a job of 8 turns
      again reaches ~2,900 prompt tokens.
    """
    return WorkloadSpec(
        name="heavy-tail",
        num_jobs=num_jobs,
        jobs_per_s=jobs_per_s,
        turns=(4, 12),
        system_tokens=60,
        task_tokens=(24, 40),
        output_tokens=(60, 180),
        tools=_heavy_tail_tools(),
        tool_output_scale=tool_output_scale,
    )


def _heavy_tail_tools(output_factor: float = 1.0) -> tuple[ToolSpec, ...]:
    return tuple(
        ToolSpec(
            key, command, weight, Mixture(((1.0 - _STALL_SHARE, body), (_STALL_SHARE, _STALL))),
            (round(outputs[0] * output_factor), round(outputs[1] * output_factor)),
        )
        for key, command, weight, body, outputs in _HEAVY_TAIL_MIX
    )


def cpu_heavy_tail_workload(num_jobs: int, jobs_per_s: float, tool_output_scale: float = 1.0) -> WorkloadSpec:
    """``heavy-tail``'s tool mix and times at ``cpu-small``'s sizes.

    The tool-time distribution is what separates the TTL policies and
    ContextServe's classes (fast shell tools, a slow ``pip install``, 3 %
    stalls of tens of seconds); the token sizes only set how long the CPU
    takes. 6 turns, system 120, task 150-250, replies 8-16 tokens (field
    report: 7-12), tool outputs at 0.4x heavy-tail's (final context ~1,000
    tokens), so an arm of ~16 jobs runs in a few minutes on this machine.
    """
    return WorkloadSpec(
        name="cpu-heavy-tail",
        num_jobs=num_jobs,
        jobs_per_s=jobs_per_s,
        turns=(6, 6),
        system_tokens=120,
        task_tokens=(150, 250),
        output_tokens=(8, 16),
        tools=_heavy_tail_tools(output_factor=0.4),
        tool_output_scale=tool_output_scale,
    )


def fixed_workload(
    num_jobs: int, jobs_per_s: float, tool_output_scale: float = 1.0, tool_seconds: float = 1.0
) -> WorkloadSpec:
    """Controlled experiments: everything fixed but arrivals and tool names.

    Every tool takes exactly ``tool_seconds`` (default 1.0 s); every job has
    6 turns, a 120-token system prompt, a 200-token task, 24-token replies
    and 188-token tool outputs, i.e. ``cpu-small``'s mean sizes (final
    context 1,404 tokens). The tool names still follow the field report's
    mix, so per-tool histories are exercised, but any difference between
    arms comes from scheduling and arrivals alone.
    """
    duration = Fixed(tool_seconds)
    fixed_outputs = {key: (188, 188) for key, _, _ in _SHELL_MIX}
    return WorkloadSpec(
        name="fixed",
        num_jobs=num_jobs,
        jobs_per_s=jobs_per_s,
        turns=(6, 6),
        system_tokens=120,
        task_tokens=(200, 200),
        output_tokens=(24, 24),
        tools=_shell_tools(fixed_outputs, lambda _key: duration),
        tool_output_scale=tool_output_scale,
    )


# (key, command, weight, median s, sigma, output tokens) of a coding agent
# at GPU scale: reads and searches most of the time, runs tests and scripts
# often, installs now and then.
_CODING_AGENT_MIX: tuple[tuple[str, str, float, float, float, tuple[int, int]], ...] = (
    ("ls", "ls -la", 0.15, 0.2, 0.5, (100, 500)),
    ("cat", "cat src/module.py", 0.30, 0.3, 0.5, (300, 1000)),
    ("grep", "grep -rn pattern .", 0.20, 0.5, 0.6, (200, 800)),
    ("python <script>", "python reproduce.py", 0.15, 2.0, 0.7, (200, 700)),
    ("python -m pytest", "python -m pytest -q", 0.15, 6.0, 0.6, (300, 1000)),
    ("pip install", "pip install -e .", 0.05, 20.0, 0.5, (200, 600)),
)


def coding_agent_workload(num_jobs: int, jobs_per_s: float, tool_output_scale: float = 1.0) -> WorkloadSpec:
    """A Claude-Code-like coding agent at GPU scale (H100 simulations).

    * A 6,000-token system prompt (tool schemas; with the simulator's
      ``--shared-system`` every job shares it) and a 7,000-9,000-token task
      (files the user attached), so the first context is ~14k tokens
      (Claude Code traces: p50 first context ~20k).
    * 16-24 turns (mean 20); replies of 100-200 tokens (mean 150).
    * Tools log-normal between ~0.2 s and ~20 s at their medians: ls 0.2 s,
      cat 0.3, grep 0.5, ``python reproduce.py`` 2, pytest 6,
      ``pip install -e .`` 20 (weights 15/30/20/15/15/5 %); tool outputs of
      a few hundred tokens (weighted mean ~550), so each turn adds ~700
      tokens and a job ends near 28k.
    """
    tools = tuple(
        ToolSpec(key, command, weight, LogNormal(median, sigma), outputs)
        for key, command, weight, median, sigma, outputs in _CODING_AGENT_MIX
    )
    return WorkloadSpec(
        name="coding-agent",
        num_jobs=num_jobs,
        jobs_per_s=jobs_per_s,
        turns=(16, 24),
        system_tokens=6000,
        task_tokens=(7000, 9000),
        output_tokens=(100, 200),
        tools=tools,
        tool_output_scale=tool_output_scale,
    )


# name -> factory(num_jobs, jobs_per_s, tool_output_scale=1.0) -> WorkloadSpec
PRESETS: dict[str, Callable[..., WorkloadSpec]] = {
    "cpu-small": cpu_small_workload,
    "coding-agent": coding_agent_workload,
    "field-report": field_report_workload,
    "fixed": fixed_workload,
    "heavy-tail": heavy_tail_workload,
    "cpu-heavy-tail": cpu_heavy_tail_workload,
}


# ----------------------------------------------------------------------
# Trace files
# ----------------------------------------------------------------------
def write_trace(path: str, jobs: Sequence[Job]) -> None:
    """Write ``jobs`` to ``path`` as JSON lines, one line per turn.

    Jobs are written in the given order, each job's turns in turn order,
    with the keys in the documented order. Floats are written with
    ``repr`` precision, so ``read_trace(path)`` returns equal jobs.

    Raises:
        ValueError: ``jobs`` is empty, holds a non-``Job``, or repeats a
            job id (the reader would merge the two).
    """
    if not jobs:
        raise ValueError(f"write_trace({path!r}) needs at least one job, got none")
    seen: set[str] = set()
    for i, job in enumerate(jobs):
        if not isinstance(job, Job):
            raise ValueError(f"write_trace({path!r}): jobs[{i}] must be a Job, got {job!r}")
        if job.job_id in seen:
            raise ValueError(f"write_trace({path!r}): job id {job.job_id!r} appears twice")
        seen.add(job.job_id)
    with open(path, "w", encoding="utf-8") as f:
        for job in jobs:
            for turn in job.turns:
                record = {
                    "job": job.job_id,
                    "turn": turn.index,
                    "arrival_s": job.arrival_s,
                    "system_tokens": job.system_tokens,
                    "new_tokens": turn.new_tokens,
                    "output_tokens": turn.output_tokens,
                    "tool": turn.tool,
                    "tool_command": turn.tool_command,
                    "tool_seconds": turn.tool_seconds,
                }
                f.write(json.dumps(record) + "\n")


@dataclass
class _PendingJob:
    """A job being read: its first line's job-level fields and its turns so far."""

    job_id: str
    first_line: int
    arrival_s: float
    system_tokens: int
    turns: list[Turn] = field(default_factory=list)
    last_line: int = 0


class _TraceReader:
    """Parses one trace file into jobs; every error names the file, line and field."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._jobs: dict[str, _PendingJob] = {}  # in order of first appearance

    def _error(self, line: int, message: str) -> ValueError:
        return ValueError(f"{self.path}:{line}: {message}")

    def _field(self, record: dict[str, Any], line: int, name: str) -> Any:
        if name not in record:
            raise self._error(line, f"field {name!r} is missing")
        return record[name]

    def _int_field(self, record: dict[str, Any], line: int, name: str, minimum: int) -> int:
        value = self._field(record, line, name)
        if not _is_int(value) or value < minimum:
            raise self._error(line, f"field {name!r} must be an integer >= {minimum}, got {value!r}")
        return int(value)

    def _seconds_field(self, record: dict[str, Any], line: int, name: str) -> float:
        value = self._field(record, line, name)
        if not _is_real(value) or not math.isfinite(value) or value < 0:
            raise self._error(line, f"field {name!r} must be a finite number >= 0, got {value!r}")
        return float(value)

    def _str_field(self, record: dict[str, Any], line: int, name: str, non_empty: bool = False) -> str:
        value = self._field(record, line, name)
        if not isinstance(value, str) or (non_empty and not value):
            kind = "a non-empty string" if non_empty else "a string"
            raise self._error(line, f"field {name!r} must be {kind}, got {value!r}")
        return value

    def _add_line(self, text: str, line: int) -> None:
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            raise self._error(line, f"invalid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(record, dict):
            raise self._error(line, f"expected a JSON object, got {type(record).__name__}")
        job_id = self._str_field(record, line, "job", non_empty=True)
        index = self._int_field(record, line, "turn", 0)
        arrival_s = self._seconds_field(record, line, "arrival_s")
        system_tokens = self._int_field(record, line, "system_tokens", 0)
        new_tokens = self._int_field(record, line, "new_tokens", 0)
        output_tokens = self._int_field(record, line, "output_tokens", 1)
        tool = self._str_field(record, line, "tool")
        tool_command = self._str_field(record, line, "tool_command")
        tool_seconds = self._seconds_field(record, line, "tool_seconds")

        pending = self._jobs.get(job_id)
        if pending is None:
            pending = self._jobs[job_id] = _PendingJob(job_id, line, arrival_s, system_tokens)
        for name, value, first in (("arrival_s", arrival_s, pending.arrival_s),
                                   ("system_tokens", system_tokens, pending.system_tokens)):
            if value != first:
                raise self._error(
                    line, f"field {name!r} of job {job_id!r} is {value!r}, but line {pending.first_line} says {first!r}"
                )
        expected = len(pending.turns)
        if index != expected:
            raise self._error(
                line,
                f"field 'turn' of job {job_id!r} must be {expected} (turns are contiguous from 0, "
                f"in order), got {index}",
            )
        pending.turns.append(Turn(index, new_tokens, output_tokens, tool, tool_command, tool_seconds))
        pending.last_line = line

    def _finish(self, pending: _PendingJob) -> Job:
        last = pending.turns[-1]
        for name, value, empty in (("tool", last.tool, ""), ("tool_command", last.tool_command, ""),
                                   ("tool_seconds", last.tool_seconds, 0.0)):
            if value != empty:
                raise self._error(
                    pending.last_line,
                    f"field {name!r} of the last turn ({last.index}) of job {pending.job_id!r} must be "
                    f"{empty!r}, got {value!r} (is the job's trace incomplete?)",
                )
        return Job(pending.job_id, pending.arrival_s, pending.system_tokens, tuple(pending.turns))

    def read(self) -> list[Job]:
        with open(self.path, encoding="utf-8") as f:
            for line, text in enumerate(f, start=1):
                if text.strip():
                    self._add_line(text, line)
        if not self._jobs:
            raise ValueError(f"{self.path}: no turns found (empty trace)")
        return [self._finish(p) for p in self._jobs.values()]


def read_trace(path: str, jobs_per_s: float | None = None, seed: int = 0) -> list[Job]:
    """Jobs recorded in the trace file ``path``, sorted by arrival.

    With ``jobs_per_s`` None the recorded ``arrival_s`` are kept (ties keep
    file order). Otherwise the jobs, in recorded arrival order, get fresh
    Poisson arrivals of that rate drawn exactly as ``generate_jobs`` draws
    them for ``seed``; contents and job ids are kept.

    Raises:
        ValueError: malformed input -- invalid JSON, a missing or mistyped
            field, a negative number, turns of a job not contiguous from 0,
            job-level fields that change between a job's lines, or a last
            turn that runs a tool. The message starts with ``path:line:``
            and names the field. Also for a bad ``jobs_per_s`` or ``seed``.
        OSError: the file cannot be read.
    """
    if jobs_per_s is not None:
        _check_positive("read_trace jobs_per_s", jobs_per_s)
    _check_seed(seed)
    jobs = sorted(_TraceReader(path).read(), key=lambda j: j.arrival_s)
    if jobs_per_s is None:
        return jobs
    arrivals = _poisson_arrivals(len(jobs), jobs_per_s, seed)
    return [Job(j.job_id, a, j.system_tokens, j.turns) for j, a in zip(jobs, arrivals)]


# ----------------------------------------------------------------------
# Summaries
# ----------------------------------------------------------------------
_NO_TOOL_LABEL = "(none)"


def describe(jobs: Iterable[Job]) -> dict[str, Any]:
    """Summary statistics of ``jobs`` for printing.

    Keys: ``num_jobs``, ``num_turns`` (total), ``mean_turns``,
    ``mean_context_tokens`` / ``p95_context_tokens`` / ``max_context_tokens``
    (``Job.context_tokens``), ``mean_output_tokens`` (per turn),
    ``arrival_span_s`` (first to last arrival), ``tool_calls`` (non-last
    turns, i.e. tool gaps), ``tool_seconds_mean`` / ``_p50`` / ``_p95`` /
    ``_p99`` over those gaps (NaN when there are none), and ``tool_share``:
    tool key -> share of the gaps, largest first (shares sum to 1; a gap
    without a tool key is counted as "(none)").

    Raises:
        ValueError: ``jobs`` is empty.
    """
    jobs = list(jobs)
    if not jobs:
        raise ValueError("describe() needs at least one job, got none")
    contexts = [float(j.context_tokens()) for j in jobs]
    turns = [t for j in jobs for t in j.turns]
    gaps = [t for j in jobs for t in j.turns[:-1]]
    gap_seconds = [t.tool_seconds for t in gaps]
    counts: dict[str, int] = {}
    for t in gaps:
        key = t.tool or _NO_TOOL_LABEL
        counts[key] = counts.get(key, 0) + 1
    nan = float("nan")
    arrivals = [j.arrival_s for j in jobs]
    return {
        "num_jobs": len(jobs),
        "num_turns": len(turns),
        "mean_turns": len(turns) / len(jobs),
        "mean_context_tokens": math.fsum(contexts) / len(contexts),
        "p95_context_tokens": percentile(contexts, 95),
        "max_context_tokens": int(max(contexts)),
        "mean_output_tokens": math.fsum(t.output_tokens for t in turns) / len(turns),
        "arrival_span_s": max(arrivals) - min(arrivals),
        "tool_calls": len(gaps),
        "tool_seconds_mean": math.fsum(gap_seconds) / len(gap_seconds) if gaps else nan,
        "tool_seconds_p50": percentile(gap_seconds, 50) if gaps else nan,
        "tool_seconds_p95": percentile(gap_seconds, 95) if gaps else nan,
        "tool_seconds_p99": percentile(gap_seconds, 99) if gaps else nan,
        "tool_share": {
            key: n / len(gaps) for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        },
    }


def main(argv: list[str] | None = None) -> int:
    """Print a preset's (or trace's) statistics; optionally write it as a trace."""
    p = argparse.ArgumentParser(description="Describe a workload preset or trace, or write a preset as a trace.")
    p.add_argument("--workload", default="cpu-small", choices=sorted(PRESETS), help="preset (default: cpu-small)")
    p.add_argument("--trace", help="describe this trace file instead of a preset")
    p.add_argument("--jobs", type=int, default=24, help="number of jobs (default: 24)")
    p.add_argument("--jobs-per-s", type=float, default=0.25, help="Poisson arrival rate (default: 0.25)")
    p.add_argument("--tool-output-scale", type=float, default=1.0, help="multiplies tool output tokens (default: 1.0)")
    p.add_argument("--seed", type=int, default=0, help="(default: 0)")
    p.add_argument("--write-trace", metavar="PATH", help="write the jobs to PATH as a trace")
    args = p.parse_args(argv)
    try:
        if args.trace:
            jobs = read_trace(args.trace)
        else:
            spec = PRESETS[args.workload](args.jobs, args.jobs_per_s, args.tool_output_scale)
            jobs = generate_jobs(spec, args.seed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for key, value in describe(jobs).items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v:.1%}" for k, v in value.items())
        elif isinstance(value, float):
            value = f"{value:.3f}"
        print(f"{key:>20}: {value}")
    if args.write_trace:
        write_trace(args.write_trace, jobs)
        print(f"wrote {sum(j.num_turns for j in jobs)} turns of {len(jobs)} jobs to {args.write_trace}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
