"""kv-cache-tester Claude Code sessions scaled to what a CPU serves, as
weka-trace files AIPerf replays.

:func:`select_sessions` picks sessions from a trace directory,
:func:`scale_session` turns one into a small session (its docstring gives
the exact rule) and :func:`write_traces` writes the scaled sessions beside
byte-for-byte copies of their sources. Invariants: selecting and scaling are
pure functions of their arguments (the same files and arguments give the
same sessions, so every arm replays identical prompts); a scaled session
holds only fields AIPerf 0.13's weka-trace schema accepts, ``block_size`` is
always :data:`AIPERF_BLOCK` (AIPerf overrides a file's own), hash ids are
renumbered from 1 per session (``hash_id_scope`` ``local``) and every
request keeps at least one token after its hash blocks.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "AIPERF_BLOCK",
    "MAIN_TYPES",
    "load_trace",
    "main_requests",
    "peak_tokens",
    "scale_session",
    "select_sessions",
    "write_traces",
]

# AIPerf's weka_trace loader decodes every hash id into this many tokens,
# whatever the file's own ``block_size`` says (plugins.yaml metadata).
AIPERF_BLOCK = 64
MAIN_TYPES = ("n", "s")


def load_trace(path: str) -> dict[str, Any] | None:
    """One trace file, or ``None`` when it is not valid JSON (a few shipped
    files are not) or has no ``requests`` list."""
    try:
        with open(path) as f:
            trace = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(trace, dict) or not isinstance(trace.get("requests"), list):
        return None
    return trace


def main_requests(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The session's main-conversation requests: ``type`` ``n``/``s`` of the
    model of its first such request (side calls to another model and
    sub-agent entries are left out), in trace order."""
    mains = [r for r in trace.get("requests", []) if isinstance(r, dict) and r.get("type") in MAIN_TYPES]
    if not mains:
        return []
    model = mains[0].get("model")
    return [r for r in mains if r.get("model") == model]


def _think(req: Mapping[str, Any], prev: Mapping[str, Any] | None) -> float:
    """The recorded gap before ``req``: its ``think_time``, else the idle time
    since ``prev`` ended (``t - prev.t - prev.api_time``), else 0."""
    think = req.get("think_time")
    if isinstance(think, (int, float)) and math.isfinite(think):
        return max(0.0, float(think))
    if prev is None:
        return 0.0
    api = prev.get("api_time") or 0.0
    return max(0.0, float(req.get("t", 0.0)) - float(prev.get("t", 0.0)) - float(api))


def scale_session(
    trace: Mapping[str, Any],
    *,
    turns: int,
    merge: int,
    max_out: int,
    max_think: float,
    think_scale: float = 1.0,
) -> dict[str, Any]:
    """A weka-trace session AIPerf can replay, scaled down (pure function).

    Takes the first ``turns`` main requests (:func:`main_requests`); merges
    every ``merge`` consecutive 64-token hash blocks into one 64-token block
    (new ids, one per distinct run of ``merge`` original ids, numbered from 1
    in order of first appearance, so turns that shared a prefix of whole
    runs still share it), which divides prompt tokens by ``merge``:
    ``in = merged_blocks * 64 + max(1, (in - merged_blocks * merge * 64) // merge)``
    (the ``max(1, ...)`` keeps a fresh user tail on every turn); output
    tokens become ``min(max_out, ceil(out / merge))`` (>= 1); think times
    ``min(max_think, think * think_scale)`` (the first request's is 0);
    ``t`` is rebuilt as ``previous t + previous api_time + think``.
    ``tool_tokens``/``system_tokens`` are divided by ``merge`` and clamped so
    that their blocks fit the first prompt's merged blocks.

    Raises ``ValueError`` if the session has no main request or an argument
    is out of range.
    """
    if turns < 1 or merge < 1 or max_out < 1 or max_think < 0 or think_scale < 0:
        raise ValueError("turns, merge and max_out must be >= 1; max_think and think_scale >= 0")
    mains = main_requests(trace)[:turns]
    if not mains:
        raise ValueError(f"session {trace.get('id')!r} has no main request")
    ids: dict[tuple[int, ...], int] = {}
    out_reqs: list[dict[str, Any]] = []
    prev: Mapping[str, Any] | None = None
    t = 0.0
    for k, req in enumerate(mains):
        hashes = list(req.get("hash_ids") or [])
        full = len(hashes) // merge
        merged = [ids.setdefault(tuple(hashes[i * merge:(i + 1) * merge]), len(ids) + 1) for i in range(full)]
        rest = max(0, int(req["in"]) - full * merge * AIPERF_BLOCK)
        new_in = full * AIPERF_BLOCK + max(1, rest // merge)
        new_out = max(1, min(max_out, math.ceil(int(req.get("out") or 0) / merge)))
        think = 0.0 if k == 0 else min(max_think, _think(req, prev) * think_scale)
        if k > 0:
            t += float(prev.get("api_time") or 0.0) + think
        api = req.get("api_time")
        out_reqs.append({
            "t": round(t, 3),
            "type": "n",
            "model": req.get("model") or "model",
            "in": new_in,
            "out": new_out,
            "hash_ids": merged,
            "input_types": list(req.get("input_types") or []),
            "output_types": list(req.get("output_types") or []),
            "stop": req.get("stop") or "",
            "api_time": float(api) if isinstance(api, (int, float)) and math.isfinite(api) else None,
            "think_time": round(think, 3),
        })
        prev = req
    first_blocks = len(out_reqs[0]["hash_ids"])
    tool = int(trace.get("tool_tokens") or 0) // merge
    system = int(trace.get("system_tokens") or 0) // merge
    # AIPerf takes the system segment from the first prompt's hash blocks
    # (ceil((tool + system) / 64) of them) and refuses a trace without enough.
    budget = first_blocks * AIPERF_BLOCK
    if tool + system > budget:
        tool = min(tool, budget)
        system = budget - tool
    return {
        "id": str(trace.get("id") or "session"),
        "models": [out_reqs[0]["model"]],
        "block_size": AIPERF_BLOCK,
        "hash_id_scope": "local",
        "tool_tokens": tool,
        "system_tokens": system,
        "requests": out_reqs,
    }


def peak_tokens(session: Mapping[str, Any]) -> int:
    """Largest prompt + output of a (scaled) session, in tokens."""
    return max(int(r["in"]) + int(r["out"]) for r in session["requests"])


def select_sessions(
    trace_dir: str,
    *,
    sessions: int,
    turns: int,
    min_turns: int = 2,
    max_input: int | None = None,
    ids: Sequence[str] = (),
) -> list[tuple[str, dict[str, Any]]]:
    """``(path, trace)`` of the sessions to replay, in file-name order: the
    named ``ids`` (file stem or trace id), else the first ``sessions``
    parseable traces with at least ``min_turns`` main requests whose first
    ``turns`` main prompts stay within ``max_input`` recorded tokens."""
    names = sorted(n for n in os.listdir(trace_dir) if n.endswith(".json"))
    chosen: list[tuple[str, dict[str, Any]]] = []
    wanted = set(ids)
    for name in names:
        path = os.path.join(trace_dir, name)
        if wanted and name[:-5] not in wanted:
            # Cheap filter first; the trace id is checked after loading.
            trace = load_trace(path)
            if trace is None or trace.get("id") not in wanted:
                continue
        else:
            trace = load_trace(path)
            if trace is None:
                continue
        mains = main_requests(trace)[:turns]
        if not wanted:
            if len(mains) < min_turns:
                continue
            if max_input is not None and max(int(r["in"]) for r in mains) > max_input:
                continue
        elif not mains:
            continue
        chosen.append((path, trace))
        if not wanted and len(chosen) >= sessions:
            break
    return chosen


def write_traces(sessions: Sequence[Mapping[str, Any]], sources: Sequence[str],
                 run_dir: str) -> tuple[str, str]:
    """The scaled ``sessions`` as weka-trace files (``RUN/traces/ID.json``,
    what the arms replay) and byte-for-byte copies of their ``sources``
    (``RUN/unscaled_traces``, for a GPU); returns both directories.
    ``sessions[i]`` is the scaled form of the file ``sources[i]``."""
    scaled = os.path.join(run_dir, "traces")
    unscaled = os.path.join(run_dir, "unscaled_traces")
    os.makedirs(scaled, exist_ok=True)
    os.makedirs(unscaled, exist_ok=True)
    for session, src in zip(sessions, sources):
        with open(os.path.join(scaled, f"{session['id']}.json"), "w") as f:
            json.dump(session, f)
        with open(src, "rb") as fin, open(os.path.join(unscaled, os.path.basename(src)), "wb") as fout:
            fout.write(fin.read())
    return scaled, unscaled
