"""What an agent job produced: its turns (``TurnLog``, ``JobResult``), the
trace file written from them (``TRACE_KEYS``, ``TraceRecord``,
``build_trace_records``, ``TraceWriter``; the format is in ``agent_loop``'s
docstring and ``workload_traces`` reads it back) and the summary table.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import IO, Protocol

from .agent_task import SYSTEM_PROMPT

__all__ = [
    "TRACE_KEYS",
    "JobResult",
    "TokenCounter",
    "TraceRecord",
    "TraceWriter",
    "TurnLog",
    "build_trace_records",
    "format_summary",
]

# Keys of a trace line, in order. Another component reads this format.
TRACE_KEYS: tuple[str, ...] = (
    "job", "turn", "arrival_s", "system_tokens", "new_tokens",
    "output_tokens", "tool", "tool_command", "tool_seconds",
)


@dataclass
class TurnLog:
    """What happened on one request of a job (times are run-relative)."""

    turn: int
    new_message: str
    is_last_step: bool
    sent_s: float
    latency_s: float
    reply: str
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    tool: str = ""
    tool_command: str = ""
    refused: str | None = None
    returncode: int | None = None
    timed_out: bool = False
    exec_seconds: float = 0.0
    tool_seconds: float = 0.0


@dataclass
class JobResult:
    job: str
    workspace: str
    arrival_s: float = 0.0
    turns: list[TurnLog] = field(default_factory=list)
    submitted: bool = False
    error: str | None = None


@dataclass(frozen=True)
class TraceRecord:
    """One trace line; field order is the file's key order (``TRACE_KEYS``)."""

    job: str
    turn: int
    arrival_s: float
    system_tokens: int
    new_tokens: int
    output_tokens: int
    tool: str
    tool_command: str
    tool_seconds: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)


class TokenCounter(Protocol):
    def count(self, text: str) -> int:
        ...


def build_trace_records(result: JobResult, counter: TokenCounter) -> list[TraceRecord]:
    """Trace lines of a finished job, one per request, in turn order.

    The last turn always has tool ``""``, command ``""`` and 0.0 seconds
    (nothing runs after it). ``output_tokens`` falls back to counting the
    reply when the server sent no usage.
    """
    system_tokens = counter.count(SYSTEM_PROMPT)
    records: list[TraceRecord] = []
    for i, turn in enumerate(result.turns):
        final = i == len(result.turns) - 1
        output_tokens = (turn.completion_tokens if turn.completion_tokens is not None
                         else counter.count(turn.reply))
        records.append(TraceRecord(
            job=result.job,
            turn=turn.turn,
            arrival_s=round(result.arrival_s, 3),
            system_tokens=system_tokens,
            new_tokens=counter.count(turn.new_message),
            output_tokens=output_tokens,
            tool="" if final else turn.tool,
            tool_command="" if final else turn.tool_command,
            tool_seconds=0.0 if final else round(max(0.0, turn.tool_seconds), 4),
        ))
    return records


class TraceWriter:
    """Appends trace lines to a file; thread-safe, flushed per job."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, records: Iterable[TraceRecord]) -> None:
        lines = "".join(r.to_json() + "\n" for r in records)
        with self._lock:
            self._stream.write(lines)
            self._stream.flush()


def format_summary(results: Sequence[JobResult]) -> str:
    """The per-job table printed at the end of a run."""
    header = (f"{'job':<12} {'steps':>5} {'submitted':>9} {'refused':>7} {'tool_s':>7} "
              f"{'mean_lat_s':>10} {'prompt_tok':>10} {'cached_tok':>10}  error")
    lines = [header]
    for r in results:
        turns = r.turns
        tool_s = sum(t.tool_seconds for t in turns[:-1])
        mean_latency = sum(t.latency_s for t in turns) / len(turns) if turns else 0.0
        prompt = sum(t.prompt_tokens or 0 for t in turns)
        cached_values = [t.cached_tokens for t in turns if t.cached_tokens is not None]
        cached = str(sum(cached_values)) if cached_values else "-"
        refused = sum(1 for t in turns if t.refused is not None)
        lines.append(
            f"{r.job:<12} {len(turns):>5} {'yes' if r.submitted else 'no':>9} {refused:>7} "
            f"{tool_s:>7.2f} {mean_latency:>10.2f} {prompt:>10} {cached:>10}  {r.error or ''}"
        )
    return "\n".join(lines)
