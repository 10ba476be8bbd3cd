"""The kv-cache-tester trace format: anonymised Claude Code sessions.

GitHub ``callanjfox/kv-cache-tester`` (Apache-2.0) ships one session per
``traces/trace_NNNN.json``. A subset is shipped here (``DEFAULT_TRACE_DIR``,
see its README for the selection rule). The facts below were checked against
all 710 files of that repository's commit ``94f6046`` that a snapshot held
(29 of its 739 blobs were absent; every file present parsed as JSON).

File::

    {"id": "trace_0277", "models": [...], "block_size": 64,
     "hash_id_scope": "local", "system_tokens": 2875, "tool_tokens": 12166,
     "totals": {...}, "requests": [REQUEST | SUBAGENT, ...]}

REQUEST (an API call of the main conversation; ``type`` is ``"n"``,
non-streaming, or ``"s"``, streaming -- both are the same conversation, and
182 of the 710 sessions hold only ``"s"`` requests)::

    {"t": 228.0, "type": "n", "model": "...", "in": 32182, "out": 498,
     "hash_ids": [1, 2, 3, ...], "input_types": ["tool_result"],
     "output_types": ["text", "thinking", "tool_use"], "stop": "tool_use",
     "api_time": 12.24, "think_time": 209.0, "ttft": 4.07}

* ``t``: whole seconds from the session start; non-decreasing in file order.
* ``hash_ids``: one id per *full* ``block_size``-token block of the prompt,
  so ``len(hash_ids) == in // block_size`` (held by all 48,658 requests);
  the ``in % block_size`` tail tokens (0..63, about uniform) have no id.
* Ids are chain hashes: an id always follows the same id (or always starts
  the prompt), so equal ids mean equal prefixes, and no id repeats inside a
  prompt. Every prompt is a prefix already sent earlier in the session
  (empty for 44 requests) followed by ids never seen before (see
  :meth:`TraceSession.check_hash_chain`).
  Ids are numbered per session (``hash_id_scope: "local"``): sessions share
  nothing, whatever their ids.
* ``think_time``: the client's delay before this request, i.e.
  ``t[k] ~= t[k-1] + api_time[k-1] + think_time[k]`` within the 1 s rounding
  of ``t``; 0.0 for the first request. Missing from 116 (streaming)
  requests. ``api_time`` (the reply's duration) is missing from 4,312
  streaming requests, and ``ttft`` is present only on 4,153 of them.
* ``stop`` is ``""`` for 4,330 streaming requests (not recorded).

SUBAGENT (19 sessions, 63 sub-agents, no nesting)::

    {"t": 79.224, "type": "subagent", "agent_id": "agent_001",
     "subagent_type": "Explore", "status": "completed",
     "duration_ms": 59750, "total_tokens": 59256, "tool_use_count": 9,
     "models": [...], "system_tokens": 1022, "tool_tokens": 7401,
     "requests": [REQUEST, ...]}

* For ``status == "completed"`` the marker's ``t`` is when the sub-agent
  *finished*: it started at ``t - duration_ms / 1000``, which lands within
  ~1 s of the end of the parent request that launched it. For
  ``"async_launched"`` (``duration_ms`` null) ``t`` is the launch time and
  the parent goes on at once. (kv-cache-tester's own replay offsets the
  nested requests by ``t``; this reader uses the start.)
* Nested requests' ``t`` counts from the sub-agent's start. Their hash ids
  share the session's numbering: sub-agents share their own system/tool
  prefix with one another but no block with the parent.
* A parent request that follows a completed sub-agent has the sub-agent's
  run time inside its ``think_time``.

Run ``python -m benchmarks.sim.trace_stats [DIR ...]`` for a set's statistics
(:mod:`benchmarks.sim.trace_stats`). Only the standard library is needed.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_TRACE_DIR",
    "MAIN_KINDS",
    "SUBAGENT_KIND",
    "TraceFormatError",
    "TraceRequest",
    "TraceSession",
    "TraceSubagent",
    "iter_trace_dir",
    "load_trace_dir",
    "load_trace_file",
]

#: The subset shipped with the repository (see its README.md).
DEFAULT_TRACE_DIR: Path = (Path(__file__).resolve().parent.parent / "data" /
                           "claude_code_traces")

#: ``type`` values of API requests: non-streaming and streaming calls.
MAIN_KINDS: frozenset[str] = frozenset({"n", "s"})
#: ``type`` value of a sub-agent entry (which holds its own requests).
SUBAGENT_KIND = "subagent"

_TRACE_SUFFIXES = (".json", ".json.gz")


class TraceFormatError(ValueError):
    """A trace file that does not follow the format.

    ``path`` is the file and ``field`` the JSON path of the bad value
    (``"requests[3].hash_ids"``); both are part of the message.
    """

    def __init__(self, path: str | Path, field: str, message: str) -> None:
        self.path = str(path)
        self.field = field
        self.message = message
        super().__init__(f"{self.path}: {field}: {message}")

    def __reduce__(self) -> tuple[type[TraceFormatError], tuple[str, str,
                                                                str]]:
        return (type(self), (self.path, self.field, self.message))


@dataclass(frozen=True)
class TraceRequest:
    """One API request of a session.

    Invariants (checked when loaded):

    * ``t >= 0`` is in seconds from the *session's* start, also for a
      sub-agent's requests (whose file ``t`` counts from the sub-agent's
      start);
    * ``kind in MAIN_KINDS``;
    * ``input_tokens >= 0``, ``output_tokens >= 0``;
    * ``len(hash_ids) == input_tokens // block_size`` of the session: one id
      per full block of the prompt; the remaining
      ``input_tokens % block_size`` tokens have no id;
    * ``think_time_s``, ``api_time_s``, ``ttft_s`` are ``>= 0`` or ``None``
      where the file lacks them;
    * ``agent_id`` is ``None`` for the main conversation, else the
      :class:`TraceSubagent` whose request this is.
    """

    t: float
    kind: str
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    stop: str
    think_time_s: float | None
    api_time_s: float | None
    model: str = ""
    input_types: tuple[str, ...] = ()
    output_types: tuple[str, ...] = ()
    ttft_s: float | None = None
    agent_id: str | None = None

    @property
    def is_main(self) -> bool:
        """Whether the request belongs to the main conversation."""
        return self.agent_id is None


@dataclass(frozen=True)
class TraceSubagent:
    """A sub-agent the main conversation launched, with its own requests.

    Invariants: ``start_s <= end_s``; ``start_s == end_s - duration_ms /
    1000`` when ``duration_ms`` is known (a completed sub-agent), else
    ``start_s == end_s`` is the launch time (``status ==
    "async_launched"``); every request has ``agent_id == self.agent_id``, a
    ``t`` counted from the session start, and the requests are in time
    order.
    """

    agent_id: str
    subagent_type: str
    status: str
    start_s: float
    end_s: float
    duration_ms: int | None
    total_tokens: int | None
    tool_use_count: int | None
    models: tuple[str, ...]
    system_tokens: int
    tool_tokens: int
    requests: tuple[TraceRequest, ...]


@dataclass(frozen=True)
class TraceSession:
    """One recorded session: a main conversation and its sub-agents.

    ``requests`` holds every API request of the session, main conversation
    and sub-agents alike, ordered by ``t`` (ties keep file order; a
    completed sub-agent's requests come before its marker in the file but
    sort by their own times). A request's ``agent_id`` tells which
    conversation it belongs to; ``subagents`` holds each sub-agent's
    metadata and the same request objects. :meth:`main_requests` is the main
    conversation alone.

    Invariants (checked when loaded): ``block_size > 0``; at least one main
    request; main requests have non-decreasing ``t`` in file order (the
    first is at ``t == 0`` in every file seen, not checked); sub-agent ids
    are unique; every request's ``len(hash_ids) == input_tokens //
    block_size``.
    ``system_tokens`` and ``tool_tokens`` are the sizes of the main
    conversation's system prompt and tool definitions (inside each prompt's
    ``input_tokens``, not extra).
    """

    session_id: str
    block_size: int
    hash_id_scope: str
    system_tokens: int
    tool_tokens: int
    requests: tuple[TraceRequest, ...]
    models: tuple[str, ...] = ()
    subagents: tuple[TraceSubagent, ...] = ()
    source: str = ""

    def main_requests(self) -> tuple[TraceRequest, ...]:
        """The main conversation's requests (``"n"`` and ``"s"``), in time
        order. Sub-agent requests are left out (see ``subagents``)."""
        return tuple(r for r in self.requests if r.agent_id is None)

    def conversations(self) -> dict[str | None, tuple[TraceRequest, ...]]:
        """Each conversation's requests in time order, keyed by ``agent_id``
        (``None`` for the main conversation)."""
        out: dict[str | None, tuple[TraceRequest, ...]] = {
            None: self.main_requests()
        }
        for sub in self.subagents:
            out[sub.agent_id] = sub.requests
        return out

    def check_hash_chain(self) -> None:
        """Check that the hash ids are prefix-chain ids, as in every file
        seen.

        That is: no id repeats inside one prompt, and each id is always
        preceded by the same id (or always starts a prompt), across all of
        the session's requests. Then equal ids at a position imply equal
        prompts up to there, which is what lets a replay materialise one
        token block per id. Raises :class:`TraceFormatError` naming the
        first request that breaks it.
        """
        predecessor: dict[int, int | None] = {}
        for i, req in enumerate(self.requests):
            ids = req.hash_ids
            if len(set(ids)) != len(ids):
                raise TraceFormatError(
                    self.source or self.session_id, _req_field(req, i),
                    "a hash id repeats inside one prompt")
            prev: int | None = None
            for pos, hid in enumerate(ids):
                seen = predecessor.setdefault(hid, prev)
                if seen != prev:
                    raise TraceFormatError(
                        self.source or self.session_id, _req_field(req, i),
                        f"hash id {hid} at position {pos} follows {prev}, "
                        f"elsewhere {seen}: ids are not prefix-chain ids")
                prev = hid


def _req_field(req: TraceRequest, index: int) -> str:
    who = "main" if req.agent_id is None else req.agent_id
    return f"requests (time order)[{index}] ({who}, t={req.t:g})"


# --------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------


class _Parser:
    """Validates one decoded file; errors name the file and the field."""

    def __init__(self, path: str) -> None:
        self.path = path
        # Ids repeat across a session's prompts; one int object per value
        # keeps a long session's tuples from holding millions of copies.
        self._ids: dict[int, int] = {}

    def fail(self, field: str, message: str) -> TraceFormatError:
        return TraceFormatError(self.path, field, message)

    def get(self, obj: dict[str, Any], key: str, field: str) -> Any:
        if key not in obj:
            raise self.fail(f"{field}.{key}" if field else key,
                            "missing required field")
        return obj[key]

    def int_(self, value: Any, field: str, *, minimum: int = 0) -> int:
        if type(value) is not int or value < minimum:
            raise self.fail(field,
                            f"expected an integer >= {minimum}, got {value!r}")
        return value

    def opt_int(self, value: Any, field: str) -> int | None:
        return None if value is None else self.int_(value, field)

    def num(self, value: Any, field: str) -> float:
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value < 0):
            raise self.fail(field,
                            f"expected a finite number >= 0, got {value!r}")
        return float(value)

    def opt_num(self, obj: dict[str, Any], key: str,
                field: str) -> float | None:
        value = obj.get(key)
        return None if value is None else self.num(value, f"{field}.{key}")

    def str_(self, value: Any, field: str) -> str:
        if not isinstance(value, str):
            raise self.fail(field, f"expected a string, got {value!r}")
        return value

    def strs(self, value: Any, field: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(
                isinstance(v, str) for v in value):
            raise self.fail(field, f"expected a list of strings, got "
                            f"{_short(value)}")
        return tuple(value)

    def obj(self, value: Any, field: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(field, f"expected an object, got {_short(value)}")
        return value

    def hash_ids(self, value: Any, field: str, input_tokens: int,
                 block_size: int) -> tuple[int, ...]:
        if not isinstance(value, list):
            raise self.fail(field, f"expected a list of integers, got "
                            f"{_short(value)}")
        for pos, hid in enumerate(value):
            if type(hid) is not int:
                raise self.fail(f"{field}[{pos}]",
                                f"expected an integer, got {hid!r}")
        expected = input_tokens // block_size
        if len(value) != expected:
            raise self.fail(
                field, f"{len(value)} ids for in={input_tokens}: expected "
                f"in // block_size = {input_tokens} // {block_size} = "
                f"{expected}")
        intern = self._ids.setdefault
        return tuple([intern(hid, hid) for hid in value])

    def request(self, raw: Any, field: str, block_size: int, offset: float,
                agent_id: str | None) -> TraceRequest:
        r = self.obj(raw, field)
        kind = self.str_(self.get(r, "type", field), f"{field}.type")
        if kind not in MAIN_KINDS:
            raise self.fail(
                f"{field}.type", f"unknown request type {kind!r} (known: "
                f"{sorted(MAIN_KINDS)}; {SUBAGENT_KIND!r} only at top level)")
        input_tokens = self.int_(self.get(r, "in", field), f"{field}.in")
        return TraceRequest(
            t=offset + self.num(self.get(r, "t", field), f"{field}.t"),
            kind=kind,
            input_tokens=input_tokens,
            output_tokens=self.int_(self.get(r, "out", field),
                                    f"{field}.out"),
            hash_ids=self.hash_ids(self.get(r, "hash_ids", field),
                                   f"{field}.hash_ids", input_tokens,
                                   block_size),
            stop=self.str_(r.get("stop", ""), f"{field}.stop"),
            think_time_s=self.opt_num(r, "think_time", field),
            api_time_s=self.opt_num(r, "api_time", field),
            model=self.str_(r.get("model", ""), f"{field}.model"),
            input_types=self.strs(r.get("input_types", []),
                                  f"{field}.input_types"),
            output_types=self.strs(r.get("output_types", []),
                                   f"{field}.output_types"),
            ttft_s=self.opt_num(r, "ttft", field),
            agent_id=agent_id,
        )

    def check_order(self, reqs: Sequence[TraceRequest], field: str,
                    indices: Sequence[int]) -> None:
        for a, b, i in zip(reqs, reqs[1:], indices[1:]):
            if b.t < a.t:
                raise self.fail(
                    f"{field}[{i}].t", f"t={b.t:g} before the previous "
                    f"request's t={a.t:g}: requests must be in time order")

    def subagent(self, raw: dict[str, Any], field: str,
                 block_size: int) -> TraceSubagent:
        agent_id = self.str_(self.get(raw, "agent_id", field),
                             f"{field}.agent_id")
        end_s = self.num(self.get(raw, "t", field), f"{field}.t")
        duration_ms = self.opt_int(raw.get("duration_ms"),
                                   f"{field}.duration_ms")
        start_s = end_s - duration_ms / 1000 if duration_ms is not None \
            else end_s
        if start_s < 0:
            raise self.fail(
                f"{field}.duration_ms", f"duration_ms={duration_ms} is longer "
                f"than t={end_s:g}: the sub-agent would start before the "
                "session")
        raw_reqs = self.get(raw, "requests", field)
        if not isinstance(raw_reqs, list):
            raise self.fail(f"{field}.requests",
                            f"expected a list, got {_short(raw_reqs)}")
        reqs = [
            self.request(r, f"{field}.requests[{j}]", block_size, start_s,
                         agent_id) for j, r in enumerate(raw_reqs)
        ]
        self.check_order(reqs, f"{field}.requests", range(len(reqs)))
        return TraceSubagent(
            agent_id=agent_id,
            subagent_type=self.str_(raw.get("subagent_type", ""),
                                    f"{field}.subagent_type"),
            status=self.str_(raw.get("status", ""), f"{field}.status"),
            start_s=start_s,
            end_s=end_s,
            duration_ms=duration_ms,
            total_tokens=self.opt_int(raw.get("total_tokens"),
                                      f"{field}.total_tokens"),
            tool_use_count=self.opt_int(raw.get("tool_use_count"),
                                        f"{field}.tool_use_count"),
            models=self.strs(raw.get("models", []), f"{field}.models"),
            system_tokens=self.int_(raw.get("system_tokens", 0),
                                    f"{field}.system_tokens"),
            tool_tokens=self.int_(raw.get("tool_tokens", 0),
                                  f"{field}.tool_tokens"),
            requests=tuple(reqs),
        )

    def session(self, raw: Any) -> TraceSession:
        top = self.obj(raw, "(top level)")
        block_size = self.int_(self.get(top, "block_size", ""), "block_size",
                               minimum=1)
        raw_reqs = self.get(top, "requests", "")
        if not isinstance(raw_reqs, list):
            raise self.fail("requests",
                            f"expected a list, got {_short(raw_reqs)}")
        main: list[TraceRequest] = []
        main_idx: list[int] = []
        subs: list[TraceSubagent] = []
        for i, r in enumerate(raw_reqs):
            field = f"requests[{i}]"
            if isinstance(r, dict) and r.get("type") == SUBAGENT_KIND:
                subs.append(self.subagent(r, field, block_size))
            else:
                main.append(self.request(r, field, block_size, 0.0, None))
                main_idx.append(i)
        if not main:
            raise self.fail("requests", "no main-conversation request")
        self.check_order(main, "requests", main_idx)
        agent_ids = [s.agent_id for s in subs]
        for a in agent_ids:
            if agent_ids.count(a) > 1:
                raise self.fail("requests", f"sub-agent id {a!r} appears "
                                f"{agent_ids.count(a)} times")
        everything = main + [r for s in subs for r in s.requests]
        # Stable: the main requests first on a tie.
        everything.sort(key=lambda r: r.t)
        return TraceSession(
            session_id=self.str_(self.get(top, "id", ""), "id"),
            block_size=block_size,
            hash_id_scope=self.str_(self.get(top, "hash_id_scope", ""),
                                    "hash_id_scope"),
            system_tokens=self.int_(self.get(top, "system_tokens", ""),
                                    "system_tokens"),
            tool_tokens=self.int_(self.get(top, "tool_tokens", ""),
                                  "tool_tokens"),
            requests=tuple(everything),
            models=self.strs(top.get("models", []), "models"),
            subagents=tuple(subs),
            source=self.path,
        )


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _read_json(path: Path) -> Any:
    """Decode ``path`` (gzip when it ends in ``.gz``). Raises ``OSError``,
    ``UnicodeDecodeError`` or ``json.JSONDecodeError``."""
    if path.name.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_trace_file(path: str | Path) -> TraceSession:
    """Load and validate one session (``.json`` or ``.json.gz``).

    Raises :class:`TraceFormatError` (a ``ValueError``) naming the file and
    the field when the file is not JSON or breaks the format, and
    ``OSError`` when it cannot be read.
    """
    path = Path(path)
    try:
        raw = _read_json(path)
    except (json.JSONDecodeError, UnicodeDecodeError, EOFError,
            gzip.BadGzipFile) as e:
        raise TraceFormatError(path, "(file)", f"not valid JSON: {e}") from e
    return _Parser(str(path)).session(raw)


def _trace_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise FileNotFoundError(f"trace directory not found: {directory}")
    return sorted(p for p in directory.iterdir()
                  if p.is_file() and p.name.endswith(_TRACE_SUFFIXES))


def iter_trace_dir(
    path: str | Path,
    *,
    strict: bool = False,
) -> Iterator[tuple[Path, TraceSession | str]]:
    """Yield ``(file, session)`` for each ``*.json`` / ``*.json.gz`` file of
    ``path`` in file-name order, or ``(file, reason)`` for a file that does
    not load (with ``strict``, its :class:`TraceFormatError` is raised
    instead). Other files are ignored. One session is held at a time."""
    for file in _trace_files(Path(path)):
        try:
            yield file, load_trace_file(file)
        except TraceFormatError as e:
            if strict:
                raise
            yield file, str(e)


def load_trace_dir(
    path: str | Path,
    *,
    limit: int | None = None,
    strict: bool = False,
) -> tuple[list[TraceSession], list[tuple[str, str]]]:
    """Load the sessions of a directory.

    Returns the sessions sorted by file name (at most ``limit`` of them: the
    first ones by file name that load) and ``(file name, reason)`` for each
    file skipped because it is not JSON or breaks the format (raised
    instead with ``strict``). Only ``*.json`` and ``*.json.gz`` files are
    read; a README or LICENSE beside them is ignored.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    sessions: list[TraceSession] = []
    skipped: list[tuple[str, str]] = []
    if limit == 0:
        return sessions, skipped
    for file, loaded in iter_trace_dir(path, strict=strict):
        if isinstance(loaded, str):
            skipped.append((file.name, loaded))
            continue
        sessions.append(loaded)
        if limit is not None and len(sessions) >= limit:
            break
    return sessions, skipped
