"""The simulator's jobs: what each turn sends, how long its tool runs, and
the token ids its prompt is made of.

A :class:`SimJob` is one agent conversation. Turn ``k`` is sent ``think_s``
seconds after turn ``k-1`` finished (turn 0 at the job's ``arrival_s``); its
prompt is a sequence of :class:`Segment` s -- content identified by a key and
a length, or explicit token ids (reply text) -- so that two prompts share a
prefix exactly where they share segments. Token ids are made from the keys by
:class:`TokenBook`, once per segment, deterministically (a SHAKE-128 stream
per key), so the same job list always gives the same token ids in every
process. A sub-agent is a job of its own that its parent's turn launches
(``SimJob.parent``).

Two sources:

* ``trace_jobs.jobs_from_traces`` -- kv-cache-tester sessions (``traces``):
  a session's main-conversation requests become turns; each 64-token hash
  id is one segment (keys scoped to the session, as the trace's ``"local"``
  hash-id scope says), the prompt's remainder past its last full block is a
  segment of its own; optionally sub-agents and a system prompt shared by
  every session;
* :func:`jobs_from_workload` -- the synthetic presets of
  ``benchmarks.workload`` (system prompt, task, tool outputs and replies),
  optionally with a system prompt shared by every job.

A turn's reply is what the next turn re-sends: the engine scripts the model
to emit the tokens the next prompt holds right after this prompt
(:meth:`SimJob.reply_tokens`), so the retained output blocks are hit too, as
with a real agent -- unless a client profile (``clients``) gives the turn
its own reply (``SimTurn.reply``: text with a tool call, reasoning the next
prompt drops, a reply AIPerf never re-sends).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..workload import Job
from ..workload_spec import _poisson_arrivals
from .clients import AIPERF_BLOCK_TOKENS, TAGGED, ClientProfile, ReplyText, reply_segments

__all__ = [
    "Segment",
    "SimJob",
    "SimTurn",
    "TokenBook",
    "jobs_from_workload",
    "poisson_arrivals",
    "stable_key",
    "truncate",
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
    """``length`` tokens of content ``key``.

    Content is key ``key``'s token stream, or with ``tokens`` those exact
    ids (text a tokenizer made: a reply's tool call the plugin decodes).

    Invariants: ``length >= 1``; ``tokens`` is None or holds ``length`` ids;
    two segments with one key have one content (a shorter one is a prefix of
    the longer), so keys of explicit segments are never stream keys.
    """

    key: int
    length: int
    tokens: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.length < 1:
            raise ValueError(f"Segment length must be >= 1, got {self.length!r}")
        if self.tokens is not None and len(self.tokens) != self.length:
            raise ValueError(f"Segment {self.key}: {len(self.tokens)} explicit tokens for length {self.length}")

    @classmethod
    def text(cls, key: int, tokens: Sequence[int]) -> Segment:
        """A segment of exactly ``tokens`` (non-empty)."""
        return cls(key, len(tokens), tuple(tokens))

    def head(self, n: int) -> Segment:
        """The first ``n`` tokens (``1 <= n <= length``): the same key, so
        the two share their content up to ``n``."""
        if not 1 <= n <= self.length:
            raise ValueError(f"Segment.head({n!r}) of a segment of {self.length} tokens")
        return Segment(self.key, n, None if self.tokens is None else self.tokens[:n])


def truncate(segments: Sequence[Segment], n: int) -> list[Segment]:
    """The first ``n`` tokens of the prompt ``segments`` (all of it when
    shorter), as segments sharing content with it."""
    out: list[Segment] = []
    for seg in segments:
        if n <= 0:
            break
        out.append(seg if seg.length <= n else seg.head(n))
        n -= seg.length
    return out


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
    # The reply's content, when a client profile decides it (text with a
    # tool call, reasoning the next prompt drops); () -- the reply is what
    # the next prompt re-sends (``SimJob.reply_tokens``).
    reply: tuple[Segment, ...] = ()

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("SimTurn.prompt must hold at least one segment")
        if self.output_tokens < 1:
            raise ValueError(f"SimTurn.output_tokens must be >= 1, got {self.output_tokens!r}")
        if not (math.isfinite(self.think_s) and self.think_s >= 0):
            raise ValueError(f"SimTurn.think_s must be finite and >= 0, got {self.think_s!r}")
        if self.reply and sum(s.length for s in self.reply) != self.output_tokens:
            raise ValueError(f"SimTurn.reply holds {sum(s.length for s in self.reply)} tokens, "
                             f"output_tokens is {self.output_tokens}")

    @cached_property
    def prompt_tokens(self) -> int:
        return sum(s.length for s in self.prompt)


@dataclass(frozen=True)
class SimJob:
    """One agent conversation: a session's main conversation, or a sub-agent.

    A top-level job (``parent == ""``) arrives at ``arrival_s``. A sub-agent
    is launched by its parent's turn ``launch_after`` and arrives
    ``arrival_s`` seconds after that turn finishes; while a ``blocking``
    sub-agent runs, the parent's next turn waits for it, and comes
    ``resume_s`` after the last such sub-agent finishes (a synchronous
    ``Task`` call). ``session_id``: the session its requests name under a
    session-header client ("" means ``job_id``; a sub-agent carries its
    parent's).

    Invariants: ``turns`` non-empty; ``arrival_s`` and ``resume_s`` finite
    and >= 0; a top-level job is not ``blocking``.
    """

    job_id: str
    arrival_s: float
    turns: tuple[SimTurn, ...]
    parent: str = ""
    launch_after: int = 0
    blocking: bool = False
    resume_s: float = 0.0
    session_id: str = ""

    def __post_init__(self) -> None:
        if not self.turns:
            raise ValueError(f"SimJob {self.job_id!r} needs at least one turn")
        for name in ("arrival_s", "resume_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"SimJob {self.job_id!r} {name} must be finite and >= 0, got {value!r}")
        if self.blocking and not self.parent:
            raise ValueError(f"SimJob {self.job_id!r} is blocking but has no parent")

    @property
    def session(self) -> str:
        """The session id its requests carry under a session-header client."""
        return self.session_id or self.job_id

    def reusable_tokens(self, index: int) -> int:
        """Tokens of turn ``index``'s prompt that a pool which never evicts
        would still hold from turn ``index - 1`` (its prompt and reply): the
        common prefix, in tokens. 0 for turn 0."""
        if index == 0:
            return 0
        prev = self.turns[index - 1]
        prev_len = prev.prompt_tokens
        if prev.reply:
            # The reply is known: what the new prompt re-sends of it is
            # reusable, up to its last token (sampled, never run: no KV).
            common = _common_segment_prefix(prev.prompt + prev.reply, self.turns[index].prompt)
            return common if common <= prev_len else min(common, prev_len + prev.output_tokens - 1)
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
        if turn.reply:
            return book.prompt(turn.reply)
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
        if segment.tokens is not None:
            return list(segment.tokens)
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
            if seg.tokens is not None:
                out += seg.tokens
            else:
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
def jobs_from_workload(
    jobs: Sequence[Job], shared_system: bool = False, client: ClientProfile = TAGGED, text: ReplyText | None = None,
) -> list[SimJob]:
    """The synthetic presets' jobs (``benchmarks.workload.Job``) as SimJobs.

    Turn ``k``'s prompt: the system prompt, then for each earlier turn its
    new tokens and its reply, then this turn's new tokens. With
    ``shared_system`` every job's system prompt is one content (the common
    tool schemas of one agent harness), so jobs share a prefix.

    ``client`` (``clients``) decides how a turn re-sends the last: with text
    replies (``text`` required) a turn that runs a tool replies with prose
    and a ``bash`` call of its command, the last turn with prose; the
    ``reasoning`` history re-sends a reply's answer, not its reasoning; the
    ``aiperf`` history re-sends the previous prompt's full hash blocks and
    fills the rest of this turn's length (as ``exact`` would have it) with
    fresh content. New tokens and tool times do not depend on ``client``.
    """
    if client.needs_tokenizer and text is None:
        raise ValueError(f"client {client.name!r} has text replies: jobs_from_workload needs a ReplyText")
    out: list[SimJob] = []
    for job in jobs:
        system_key = stable_key("system") if shared_system else stable_key(job.job_id, "system")
        history: list[Segment] = [Segment(system_key, job.system_tokens)] if job.system_tokens else []
        turns: list[SimTurn] = []
        prev_tool_s = 0.0
        for turn in job.turns:
            canonical = list(history)
            if turn.new_tokens:
                canonical.append(Segment(stable_key(job.job_id, turn.index, "new"), turn.new_tokens))
            prompt = canonical
            if client.history == "aiperf" and turns:
                prompt = _aiperf_prompt(turns[-1].prompt, sum(s.length for s in canonical),
                                        stable_key(job.job_id, turn.index, "aiperf"))
            think = prev_tool_s if turn.index else 0.0
            reply_key = stable_key(job.job_id, turn.index, "reply")
            if client.replies == "scripted":
                turns.append(SimTurn(tuple(prompt), turn.output_tokens, think, turn.tool))
                kept: Sequence[Segment] = [Segment(reply_key, turn.output_tokens)]
            else:
                call = ("bash", {"command": turn.tool_command}) if turn.tool_command else None
                reply, kept = reply_segments(_text_segments(job.job_id, turn.index), client, text, reply_key,
                                             turn.output_tokens, call)
                turns.append(SimTurn(tuple(prompt), sum(s.length for s in reply), think, turn.tool, reply))
            history = canonical + list(kept)
            prev_tool_s = turn.tool_seconds
        out.append(SimJob(job.job_id, job.arrival_s, tuple(turns)))
    return out


def _text_segments(job_id: str, index: int) -> Callable[[str, Sequence[int]], Segment]:
    """Explicit segments of turn ``index``'s reply text, one key per part
    (never a stream key: the tag tuple is unlike any stream's)."""
    return lambda tag, ids: Segment.text(stable_key(job_id, index, "text", tag), ids)


def _aiperf_prompt(prev: Sequence[Segment], length: int, key: int,
                   block: int = AIPERF_BLOCK_TOKENS) -> list[Segment]:
    """A prompt of ``length`` tokens as AIPerf rebuilds it from hash ids:
    the full ``block``-token blocks of the previous prompt ``prev`` (its
    partial last block has another hash id once the prompt grows past it),
    then fresh content of key ``key``."""
    cut = min(sum(s.length for s in prev) // block * block, length)
    out = truncate(prev, cut)
    if length > cut:
        out.append(Segment(key, length - cut))
    return out
