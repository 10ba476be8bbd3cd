"""Trace files: a workload as JSON lines, one per turn (the format is in
``benchmarks.workload``'s docstring; ``agent_loop --trace`` writes the same
keys). ``write_trace`` and ``read_trace`` round-trip ``Job`` lists."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .workload_checks import _check_positive, _check_seed, _is_int, _is_real
from .workload_jobs import Job, Turn
from .workload_spec import _poisson_arrivals

__all__ = ["read_trace", "write_trace"]


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
