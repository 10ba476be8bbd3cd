"""AIPerf's per-request records of one replay arm, reduced to per-request
and per-session figures and a one-line summary.

:func:`read_records` reads ``profile_export.jsonl``; :func:`request_rows`
gives one row per record, :func:`jct_by_session` each session's job
completion time (first request start to last request end, sessions keyed
by :func:`session_key`: the ``conversation_id`` up to ``::``, so sub-agent
children count in their root session); :func:`summarize_arm` and
:func:`format_summary` make an arm's summary and its printed line;
:func:`cache_hit_share` and :func:`counter_deltas` turn two ``/metrics``
scrapes of the server into the arm's deltas. Invariants: every function
is pure except :func:`read_records` (reads a file) and
:func:`summarize_paths` (reads and prints); times are in seconds (AIPerf's
``ns``/``us``/``ms`` metrics are converted), timestamps in ns; every record
is a row (one with an ``error``, or cancelled, is a failed request).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CONTINUUM_COUNTERS",
    "SessionStats",
    "cache_hit_share",
    "counter_deltas",
    "format_summary",
    "jct_by_session",
    "read_records",
    "request_rows",
    "session_key",
    "summarize_arm",
    "summarize_paths",
]


def read_records(path: str) -> list[dict[str, Any]]:
    """AIPerf's ``profile_export.jsonl`` (one JSON record per line)."""
    records = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                records.append(json.loads(line))
    return records


def _metric(record: Mapping[str, Any], name: str) -> float | None:
    """A per-record metric in its unit (``{"value": v, "unit": u}``), ms -> s."""
    m = (record.get("metrics") or {}).get(name)
    if m is None:
        return None
    value = m.get("value") if isinstance(m, dict) else m
    if value is None:
        return None
    unit = m.get("unit", "ms") if isinstance(m, dict) else "ms"
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}.get(unit)
    return float(value) * scale if scale is not None else float(value)


def _count(record: Mapping[str, Any], *names: str) -> int | None:
    """The first of ``names`` present among the record's metrics, as an int
    (token counts: ``{"value": n, "unit": "tokens"}``)."""
    metrics = record.get("metrics") or {}
    for name in names:
        m = metrics.get(name)
        value = m.get("value") if isinstance(m, dict) else m
        if isinstance(value, (int, float)):
            return int(value)
    return None


def session_key(record: Mapping[str, Any]) -> str:
    """The session a record belongs to: its ``conversation_id`` up to ``::``
    (AIPerf names sub-agent children ``TRACE::sa:...``), else its
    ``x_correlation_id``."""
    meta = record.get("metadata") or {}
    conv = meta.get("conversation_id")
    if conv:
        return str(conv).split("::", 1)[0]
    return str(meta.get("x_correlation_id") or "?")


@dataclass
class SessionStats:
    session: str
    requests: int
    failed: int
    start_ns: int
    end_ns: int
    jct_s: float
    ttft_s: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)


def request_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per request: session, turn, start/end (ns), TTFT and latency
    (s), ok (no error)."""
    rows = []
    for rec in records:
        meta = rec.get("metadata") or {}
        start = meta.get("request_start_ns")
        end = meta.get("request_end_ns")
        rows.append({
            "session": session_key(rec),
            "conversation_id": meta.get("conversation_id"),
            "x_correlation_id": meta.get("x_correlation_id"),
            "turn_index": meta.get("turn_index"),
            "start_ns": int(start) if start is not None else None,
            "end_ns": int(end) if end is not None else None,
            "ttft_s": _metric(rec, "time_to_first_token"),
            "latency_s": _metric(rec, "request_latency"),
            "prompt_tokens": _count(rec, "usage_prompt_tokens", "input_sequence_length"),
            "cached_tokens": _count(rec, "usage_prompt_cache_read_tokens"),
            "output_tokens": _count(rec, "usage_completion_tokens", "output_sequence_length"),
            "ok": not rec.get("error") and meta.get("was_cancelled") is not True,
            "error": rec.get("error"),
        })
    return rows


def jct_by_session(records: Iterable[Mapping[str, Any]]) -> dict[str, SessionStats]:
    """Per session (:func:`session_key`): first request start to last request
    end, in seconds, with its requests' TTFTs and latencies."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in request_rows(records):
        groups[row["session"]].append(row)
    stats = {}
    for key, rows in groups.items():
        starts = [r["start_ns"] for r in rows if r["start_ns"] is not None]
        ends = [r["end_ns"] for r in rows if r["end_ns"] is not None]
        if not starts or not ends:
            continue
        stats[key] = SessionStats(
            session=key,
            requests=len(rows),
            failed=sum(not r["ok"] for r in rows),
            start_ns=min(starts),
            end_ns=max(ends),
            jct_s=(max(ends) - min(starts)) / 1e9,
            ttft_s=[r["ttft_s"] for r in rows if r["ttft_s"] is not None],
            latency_s=[r["latency_s"] for r in rows if r["latency_s"] is not None],
        )
    return stats


def cache_hit_share(before: Mapping[str, float], after: Mapping[str, float]) -> float | None:
    """Share of prompt tokens served from the prefix cache over an arm, from
    ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``
    deltas (``None`` when nothing was queried)."""
    from .server import metric_sum

    hits = metric_sum(after, "vllm:prefix_cache_hits_total") - metric_sum(before, "vllm:prefix_cache_hits_total")
    queries = metric_sum(after, "vllm:prefix_cache_queries_total") - metric_sum(before, "vllm:prefix_cache_queries_total")
    return hits / queries if queries > 0 else None


def summarize_arm(policy: str, records: Sequence[Mapping[str, Any]],
                  hit_share: float | None = None) -> dict[str, Any]:
    """The arm's summary: sessions, requests, failures, JCT / TTFT / latency
    statistics (s) and the prefix-cache hit share."""
    from .stats import summarize

    sessions = jct_by_session(records)
    rows = request_rows(records)
    jcts = [s.jct_s for s in sessions.values()]
    prompt = sum(r["prompt_tokens"] or 0 for r in rows)
    cached = sum(r["cached_tokens"] or 0 for r in rows)
    ttfts = [r["ttft_s"] for r in rows if r["ttft_s"] is not None and r["ok"]]
    lats = [r["latency_s"] for r in rows if r["latency_s"] is not None and r["ok"]]
    return {
        "policy": policy,
        "sessions": len(sessions),
        "requests": len(rows),
        "failed": sum(not r["ok"] for r in rows),
        "jct_s": summarize(jcts) if jcts else None,
        "ttft_s": summarize(ttfts) if ttfts else None,
        "latency_s": summarize(lats) if lats else None,
        "prefix_cache_hit_share": hit_share,
        # The same from the replies' usage (vLLM --enable-prompt-tokens-details).
        "cached_token_share": cached / prompt if prompt and any(r["cached_tokens"] is not None for r in rows) else None,
        "per_session": {k: {"requests": s.requests, "failed": s.failed, "jct_s": s.jct_s}
                        for k, s in sorted(sessions.items())},
    }


def format_summary(s: Mapping[str, Any]) -> str:
    """The one line printed per arm."""
    def f(stat: Mapping[str, Any] | None, key: str) -> str:
        return f"{stat[key]:.2f}s" if stat else "n/a"

    hit = s.get("prefix_cache_hit_share")
    counters = s.get("server_counters")
    return (f"{s['policy']:<14} sessions={s['sessions']} requests={s['requests']} failed={s['failed']} "
            f"JCT mean={f(s['jct_s'], 'mean')} p90={f(s['jct_s'], 'p90')} "
            f"TTFT mean={f(s['ttft_s'], 'mean')} latency mean={f(s['latency_s'], 'mean')} "
            f"prefix-cache hits={'n/a' if hit is None else f'{hit:.1%}'}"
            + ("" if not counters else
               f" preemptions={counters.get('preemptions', 0):.0f} pins={counters.get('pins_created', 0):.0f}"
               f" pin-hit-tokens={counters.get('pin_hit_tokens', 0):.0f}"))


CONTINUUM_COUNTERS: dict[str, str] = {
    "pins_created": "vllm_continuum:pins_created_total",
    "pin_hit_tokens": "vllm_continuum:pin_hit_tokens_total",
    "preemptions": "vllm:num_preemptions_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    # How the plugin read the sessions: jobs ended (an answered task
    # included) and conversations beside a session's first.
    "jobs_ended": "vllm_continuum:jobs_ended_total",
    "session_conversations": "vllm_continuum:session_conversations_total",
}


def counter_deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    from .server import metric_sum

    out = {k: metric_sum(after, name) - metric_sum(before, name) for k, name in CONTINUUM_COUNTERS.items()}
    for reason in ("ttl", "pressure", "handoff", "cap", "abort"):
        name = "vllm_continuum:pins_released_total"
        out[f"pins_released_{reason}"] = (metric_sum(after, name, reason=reason)
                                          - metric_sum(before, name, reason=reason))
    return out


def summarize_paths(paths: Sequence[str]) -> int:
    """``--summarize``: one summary line per AIPerf run. Without the server's
    counters the prefix-cache share is the replies' ``cached_tokens`` share
    (``n/a`` unless vLLM ran with ``--enable-prompt-tokens-details``)."""
    for path in paths:
        jsonl = os.path.join(path, "profile_export.jsonl") if os.path.isdir(path) else path
        summary = summarize_arm(path.rstrip("/"), read_records(jsonl))
        summary["prefix_cache_hit_share"] = summary["cached_token_share"]
        print(format_summary(summary))
    return 0
