"""The named synthetic workloads (``PRESETS``: name -> factory of
``WorkloadSpec(num_jobs, jobs_per_s, tool_output_scale)``)."""

from __future__ import annotations

from collections.abc import Callable

from .workload_spec import ToolSpec, WorkloadSpec
from .workload_tool_times import Distribution, Fixed, LogNormal, Mixture, Uniform

__all__ = [
    "PRESETS",
    "coding_agent_workload",
    "cpu_heavy_tail_workload",
    "cpu_small_workload",
    "field_report_workload",
    "fixed_workload",
    "heavy_tail_workload",
    "spread_workload",
]


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


def _coding_agent_tools() -> tuple[ToolSpec, ...]:
    return tuple(
        ToolSpec(key, command, weight, LogNormal(median, sigma), outputs)
        for key, command, weight, median, sigma, outputs in _CODING_AGENT_MIX
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
    tools = _coding_agent_tools()
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


# spread: the task (first context past the system prompt) and the turn count
# per session, log-normal and clipped. Sigma 0.5 on the task gives a 5-95%
# range of ~6k-32k; the turn count's median 12 and sigma 0.6 a 5-95% range
# of ~4.5-32, clipped to 3-40.
_SPREAD_TASK = LogNormal(median=14_000, sigma=0.5)
_SPREAD_TASK_BOUNDS = (1_000, 100_000)
_SPREAD_TURNS = LogNormal(median=12.0, sigma=0.6)
_SPREAD_TURN_BOUNDS = (3, 40)


def spread_workload(num_jobs: int, jobs_per_s: float, tool_output_scale: float = 1.0) -> WorkloadSpec:
    """``coding-agent`` with session sizes and lengths spread as in the field.

    ``coding-agent`` draws every session alike (a 7-9k task, 16-24 turns);
    recorded agent sessions are skewed -- a few long sessions with big first
    contexts hold most of the KV. Here:

    * the same 6,000-token system prompt (shared with ``--shared-system``);
    * a task (the first context past the system prompt) log-normal around
      14,000 tokens, sigma 0.5 (5-95%: ~6k-32k; clipped to 1k-100k), so the
      first prompt's median is ~20k, as in the Claude Code traces;
    * 3-40 turns, log-normal with median 12 and sigma 0.6 (mean ~14);
    * ``coding-agent``'s replies (100-200 tokens) and tool mix: outputs of a
      few hundred tokens (~700 tokens a turn with the reply), tools
      log-normal with medians from 0.2 s (ls) to 20 s (pip install).
    """
    return WorkloadSpec(
        name="spread",
        num_jobs=num_jobs,
        jobs_per_s=jobs_per_s,
        turns=_SPREAD_TURN_BOUNDS,
        system_tokens=6000,
        task_tokens=_SPREAD_TASK_BOUNDS,
        output_tokens=(100, 200),
        tools=_coding_agent_tools(),
        tool_output_scale=tool_output_scale,
        turns_distribution=_SPREAD_TURNS,
        task_distribution=_SPREAD_TASK,
    )


# name -> factory(num_jobs, jobs_per_s, tool_output_scale=1.0) -> WorkloadSpec
PRESETS: dict[str, Callable[..., WorkloadSpec]] = {
    "cpu-small": cpu_small_workload,
    "coding-agent": coding_agent_workload,
    "field-report": field_report_workload,
    "fixed": fixed_workload,
    "heavy-tail": heavy_tail_workload,
    "cpu-heavy-tail": cpu_heavy_tail_workload,
    "spread": spread_workload,
}
