"""A job (one agent session) and its turns: what the benchmarks replay,
whether generated (``workload_spec``) or read from a trace
(``workload_traces``). See ``benchmarks.workload`` for the model."""

from __future__ import annotations

from dataclasses import dataclass

from .workload_checks import _check_int, _check_seconds, _is_int

__all__ = ["Job", "Turn"]


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
