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

Modules (every name is re-exported here): ``workload_jobs`` (``Job``,
``Turn``), ``workload_tool_times`` (the tool-time distributions),
``workload_spec`` (``WorkloadSpec``, ``ToolSpec``, ``generate_jobs`` and the
Poisson arrivals), ``workload_presets`` (``PRESETS``), ``workload_traces``
(``read_trace``, ``write_trace``) and ``workload_checks`` (argument checks);
this module keeps ``describe`` and the command line.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable
from typing import Any

from .stats import percentile

# The parts, one module per concept (re-exported here: this module's names
# are the public surface used by the benchmarks, the simulator and the tests).
from .workload_jobs import Job, Turn
from .workload_presets import (
    PRESETS,
    coding_agent_workload,
    cpu_heavy_tail_workload,
    cpu_small_workload,
    field_report_workload,
    fixed_workload,
    heavy_tail_workload,
    spread_workload,
)
from .workload_spec import ToolSpec, WorkloadSpec, generate_jobs
from .workload_tool_times import Distribution, Fixed, LogNormal, Mixture, Uniform
from .workload_traces import read_trace, write_trace

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
    "cpu_heavy_tail_workload",
    "cpu_small_workload",
    "describe",
    "field_report_workload",
    "fixed_workload",
    "generate_jobs",
    "heavy_tail_workload",
    "spread_workload",
    "read_trace",
    "write_trace",
]


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
