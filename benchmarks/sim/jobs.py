"""The simulator's jobs: what each turn sends, how long its tool runs, and
the token ids its prompt is made of.

A :class:`SimJob` is one agent session. Turn ``k`` is sent ``think_s``
seconds after turn ``k-1`` finished (turn 0 at the job's ``arrival_s``); its
prompt is a sequence of :class:`Segment` s -- content identified by a key and
a length -- so that two prompts share a prefix exactly where they share
segments. Token ids are made from the keys by :class:`TokenBook`, once per
segment, deterministically (a SHAKE-128 stream per key), so the same job
list always gives the same token ids in every process.

Two sources:

* :func:`jobs_from_traces` -- kv-cache-tester sessions (``traces``): a
  session's main-conversation requests become turns; each 64-token hash id
  is one segment (keys scoped to the session, as the trace's ``"local"``
  hash-id scope says), the prompt's remainder past its last full block is a
  segment of its own;
* :func:`jobs_from_workload` -- the synthetic presets of
  ``benchmarks.workload`` (system prompt, task, tool outputs and replies),
  optionally with a system prompt shared by every job.

A turn's reply is what the next turn re-sends: the engine scripts the model
to emit the tokens the next prompt holds right after this prompt
(:meth:`SimJob.reply_tokens`), so the retained output blocks are hit too, as
with a real agent.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..workload import Job
from ..workload_spec import _poisson_arrivals

__all__ = [
    "Segment",
    "SimJob",
    "SimTurn",
    "TokenBook",
    "jobs_from_traces",
    "jobs_from_workload",
    "poisson_arrivals",
    "stable_key",
]

# Token ids are drawn from [_TOKEN_LOW, _TOKEN_HIGH): clear of the special
# tokens at the bottom of a Llama-3 vocabulary, inside every model's range.
_TOKEN_LOW = 1000
_TOKEN_HIGH = 100_000


def stable_key(*parts: object) -> int:
    """A 63-bit key from ``parts`` that is the same in every process (Python's
    ``hash`` of a str is salted per process)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass(frozen=True)
class Segment:
    """``length`` tokens of content ``key``. Invariant: ``length >= 1``."""

    key: int
    length: int

    def __post_init__(self) -> None:
        if self.length < 1:
            raise ValueError(f"Segment length must be >= 1, got {self.length!r}")


@dataclass(frozen=True)
class SimTurn:
    """One request of a job and the tool gap after it.

    Invariants: ``prompt`` non-empty; ``output_tokens >= 1``; ``think_s``
    finite and >= 0 (the gap between the previous turn's finish and this
    turn's arrival; 0 on turn 0).
    """

    prompt: tuple[Segment, ...]
    output_tokens: int
    think_s: float
    tool_name: str = ""  # the tool the reply runs ("" when the reply runs none)

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("SimTurn.prompt must hold at least one segment")
        if self.output_tokens < 1:
            raise ValueError(f"SimTurn.output_tokens must be >= 1, got {self.output_tokens!r}")
        if not (math.isfinite(self.think_s) and self.think_s >= 0):
            raise ValueError(f"SimTurn.think_s must be finite and >= 0, got {self.think_s!r}")

    @cached_property
    def prompt_tokens(self) -> int:
        return sum(s.length for s in self.prompt)


@dataclass(frozen=True)
class SimJob:
    """One agent session. Invariants: ``turns`` non-empty; ``arrival_s >= 0``."""

    job_id: str
    arrival_s: float
    turns: tuple[SimTurn, ...]

    def __post_init__(self) -> None:
        if not self.turns:
            raise ValueError(f"SimJob {self.job_id!r} needs at least one turn")
        if not (math.isfinite(self.arrival_s) and self.arrival_s >= 0):
            raise ValueError(f"SimJob {self.job_id!r} arrival_s must be finite and >= 0, got {self.arrival_s!r}")

    def reusable_tokens(self, index: int) -> int:
        """Tokens of turn ``index``'s prompt that a pool which never evicts
        would still hold from turn ``index - 1`` (its prompt and reply): the
        common prefix, in tokens. 0 for turn 0."""
        if index == 0:
            return 0
        prev = self.turns[index - 1]
        prev_len = prev.prompt_tokens
        common = _common_segment_prefix(prev.prompt, self.turns[index].prompt)
        if common < prev_len:
            return common
        # The previous prompt is a prefix: its reply is re-sent too (the
        # engine scripts it so), up to the new prompt's length. The reply's
        # last token was sampled but never run through the model: no KV.
        return min(self.turns[index].prompt_tokens, prev_len + prev.output_tokens - 1)

    def reply_tokens(self, index: int, book: "TokenBook") -> list[int]:
        """The tokens turn ``index``'s reply consists of: what the next turn's
        prompt holds right after this prompt when it extends it, else (and
        past the next prompt's end) content unique to this reply."""
        turn = self.turns[index]
        n = turn.output_tokens
        reply: list[int] = []
        if index + 1 < len(self.turns):
            nxt = self.turns[index + 1]
            plen = turn.prompt_tokens
            if _common_segment_prefix(turn.prompt, nxt.prompt) == plen:
                reply = book.tokens_between(nxt.prompt, plen, plen + n)
        if len(reply) < n:
            reply += book.tokens(Segment(stable_key(self.job_id, index, "reply"), n - len(reply)))
        return reply


def _shared_segments(a: Sequence[Segment], b: Sequence[Segment]) -> tuple[int, int]:
    """The whole segments ``a`` and ``b`` share from the start: how many, and
    their tokens."""
    count = tokens = 0
    for x, y in zip(a, b):
        if x is not y and x != y:  # turns of a trace share Segment objects
            break
        count += 1
        tokens += x.length
    return count, tokens


def _common_segment_prefix(a: Sequence[Segment], b: Sequence[Segment]) -> int:
    """Tokens that ``a`` and ``b`` share from the start: the whole segments,
    then, of the first pair that differs, the shorter length if both have one
    key (segments with one key share content up to the shorter one)."""
    count, tokens = _shared_segments(a, b)
    if count < min(len(a), len(b)) and a[count].key == b[count].key:
        tokens += min(a[count].length, b[count].length)
    return tokens


def _token_stream(key: int, n: int) -> list[int]:
    """The first ``n`` token ids of key ``key``'s stream: SHAKE-128 of the key
    read as 32-bit words (an extendable output, so a shorter stream is a
    prefix of a longer one), folded into the token range. Five times cheaper
    than seeding a numpy generator per segment, which a replay does for every
    64-token block of a trace."""
    words = np.frombuffer(hashlib.shake_128(key.to_bytes(8, "little")).digest(4 * n), dtype=np.uint32)
    return (words % (_TOKEN_HIGH - _TOKEN_LOW) + _TOKEN_LOW).tolist()


class TokenBook:
    """Token ids of segments, made once per key and cached.

    Invariant: ``tokens(Segment(k, n))`` is the first ``n`` ids of key ``k``'s
    stream, whatever else was asked before (so segments with one key and
    different lengths share a prefix).
    """

    def __init__(self) -> None:
        self._cache: dict[int, list[int]] = {}

    def tokens(self, segment: Segment) -> list[int]:
        have = self._cache.get(segment.key)
        if have is None or len(have) < segment.length:
            have = _token_stream(segment.key, segment.length)
            self._cache[segment.key] = have
        return have[: segment.length]

    def prompt(
        self, segments: Sequence[Segment], after: tuple[Sequence[Segment], list[int]] | None = None
    ) -> list[int]:
        """The token ids of ``segments``. ``after``: an earlier prompt's
        segments and the ids this book gave them; the whole segments the two
        share from the start are copied from its ids in one slice (a turn
        re-sends its job's history). The result does not depend on
        ``after``."""
        out: list[int] = []
        skip = 0
        if after is not None:
            skip, shared = _shared_segments(after[0], segments)
            out = after[1][:shared]
        cache = self._cache
        for seg in segments[skip:]:
            have = cache.get(seg.key)
            # A whole cached stream is appended without the copy tokens() makes.
            out += have if have is not None and len(have) == seg.length else self.tokens(seg)
        return out

    def tokens_between(self, segments: Sequence[Segment], start: int, end: int) -> list[int]:
        """Token ids at positions ``[start, end)`` of the prompt ``segments``
        (shorter if the prompt ends first)."""
        out: list[int] = []
        pos = 0
        for seg in segments:
            if pos >= end:
                break
            lo, hi = max(start, pos), min(end, pos + seg.length)
            if lo < hi:
                out += self.tokens(seg)[lo - pos : hi - pos]
            pos += seg.length
        return out

    def forget(self, keys: Iterable[int]) -> None:
        """Drop cached keys (a finished job's content)."""
        for key in keys:
            self._cache.pop(key, None)


def poisson_arrivals(n: int, per_s: float, seed: int) -> list[float]:
    """``n`` arrival offsets of a Poisson process at ``per_s`` per second: the
    A/B runner's own (``workload._poisson_arrivals``), so a trace replay and a
    synthetic preset with one seed and rate arrive alike."""
    if not (per_s > 0 and math.isfinite(per_s)):
        raise ValueError(f"arrival rate must be a positive number, got {per_s!r}")
    return _poisson_arrivals(n, per_s, seed)


# ----------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------
def jobs_from_workload(jobs: Sequence[Job], shared_system: bool = False) -> list[SimJob]:
    """The synthetic presets' jobs (``benchmarks.workload.Job``) as SimJobs.

    Turn ``k``'s prompt: the system prompt, then for each earlier turn its
    new tokens and its reply, then this turn's new tokens. With
    ``shared_system`` every job's system prompt is one content (the common
    tool schemas of one agent harness), so jobs share a prefix.
    """
    out: list[SimJob] = []
    for job in jobs:
        system_key = stable_key("system") if shared_system else stable_key(job.job_id, "system")
        history: list[Segment] = [Segment(system_key, job.system_tokens)] if job.system_tokens else []
        turns: list[SimTurn] = []
        prev_tool_s = 0.0
        for turn in job.turns:
            prompt = list(history)
            if turn.new_tokens:
                prompt.append(Segment(stable_key(job.job_id, turn.index, "new"), turn.new_tokens))
            turns.append(SimTurn(tuple(prompt), turn.output_tokens, prev_tool_s if turn.index else 0.0, turn.tool))
            history = prompt + [Segment(stable_key(job.job_id, turn.index, "reply"), turn.output_tokens)]
            prev_tool_s = turn.tool_seconds
        out.append(SimJob(job.job_id, job.arrival_s, tuple(turns)))
    return out


def jobs_from_traces(
    sessions: Sequence["TraceSession"],  # noqa: F821 -- benchmarks.sim.traces
    arrivals: Sequence[float],
    *,
    unit_tokens: int | None = None,
    max_turns: int | None = None,
    max_context_tokens: int | None = None,
    max_think_s: float = 120.0,
    max_output_tokens: int | None = None,
) -> list[SimJob]:
    """kv-cache-tester sessions as jobs, session ``i`` arriving at ``arrivals[i]``.

    * Each main-conversation request is a turn; sub-agent requests are left
      out (their contexts are separate and short).
    * ``unit_tokens``: tokens per trace hash block (default: the trace's own
      ``block_size``, 64); a smaller unit scales every prompt down by the same
      factor while keeping its prefix structure (for a CPU replay).
    * A turn's tool is ``"user"`` after an ``end_turn`` (a person's reply)
      and ``"tool_use"`` otherwise (a tool stop, or a streamed request whose
      stop the trace did not record); its gap is
      the trace's ``think_time``, capped at ``max_think_s`` (idle users come
      back after hours; such a gap frees any pin under every policy).
    * A session ends at its first turn whose prompt plus reply would exceed
      ``max_context_tokens`` (the model's length limit), or after ``max_turns``.
    """
    if len(arrivals) < len(sessions):
        raise ValueError(f"{len(sessions)} sessions need as many arrivals, got {len(arrivals)}")
    out: list[SimJob] = []
    for session, arrival in zip(sessions, arrivals):
        unit = unit_tokens or session.block_size
        scale = unit / session.block_size
        requests = session.main_requests()
        # One Segment per hash id, shared by every turn that re-sends it: a
        # session re-sends its history each turn (~1M block references in the
        # shipped subset, ~60k distinct).
        blocks: dict[int, Segment] = {}
        turns: list[SimTurn] = []
        prev_stop = ""
        for i, req in enumerate(requests):
            if max_turns is not None and len(turns) >= max_turns:
                break
            full = len(req.hash_ids)
            rest = max(0, round((req.input_tokens - full * session.block_size) * scale))
            prompt = []
            for h in req.hash_ids:
                seg = blocks.get(h)
                if seg is None:
                    seg = blocks[h] = Segment(stable_key(session.session_id, h), unit)
                prompt.append(seg)
            if rest:
                prompt.append(Segment(stable_key(session.session_id, i, "tail"), rest))
            if not prompt:
                continue
            output = max(1, round(req.output_tokens * scale))
            if max_output_tokens is not None:
                output = min(output, max_output_tokens)
            tokens = sum(s.length for s in prompt)
            if max_context_tokens is not None and tokens + output > max_context_tokens:
                break
            think = 0.0 if not turns else min(max(0.0, _think_s(requests, i)), max_think_s)
            if turns:  # the previous turn's tool is known now
                turns[-1] = _with_tool(turns[-1], "user" if prev_stop == "end_turn" else "tool_use")
            turns.append(SimTurn(tuple(prompt), output, think, ""))
            prev_stop = req.stop
        if turns:
            out.append(SimJob(session.session_id, float(arrival), tuple(turns)))
    return out


def _think_s(requests: Sequence[Any], i: int) -> float:
    """The gap before request ``i``: the trace's ``think_time``, or where a
    file lacks it, the time between the previous request's end and this one's
    start (``t`` is whole seconds, so this fallback is coarse)."""
    req = requests[i]
    if req.think_time_s is not None:
        return float(req.think_time_s)
    prev = requests[i - 1]
    return float(req.t - prev.t - (prev.api_time_s or 0.0))


def _with_tool(turn: SimTurn, tool: str) -> SimTurn:
    return SimTurn(turn.prompt, turn.output_tokens, turn.think_s, tool)
