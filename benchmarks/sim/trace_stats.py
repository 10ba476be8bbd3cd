"""Statistics of kv-cache-tester trace sets (Claude Code sessions).

:func:`summarize` reduces sessions read by :mod:`benchmarks.sim.traces` to
one :class:`TraceSetStats`; :func:`stats_table` prints named sets side by
side, one column each. Invariants: every function here is pure apart from
reading trace files (:func:`summarize_dir`) and printing (:func:`main`);
sessions are consumed once, so a generator keeps at most one session in
memory; a statistic with nothing to summarise is ``nan`` (shown as ``-``).

Run ``python -m benchmarks.sim.trace_stats [DIR ...]`` for a set's
statistics (``python -m benchmarks.sim.traces`` is the same command).
Only numpy and the standard library are needed.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from .traces import DEFAULT_TRACE_DIR, TraceSession, iter_trace_dir

__all__ = [
    "TraceSetStats",
    "main",
    "stats_table",
    "summarize",
    "summarize_dir",
]


@dataclass(frozen=True)
class TraceSetStats:
    """Summary of a set of sessions, over main-conversation requests unless
    named otherwise. Percentiles are numpy's (linear); ``nan`` when there
    is nothing to summarise.

    * ``*_input_p50/p90``: over sessions, the first, last and largest
      main-request ``input_tokens``;
    * ``growth_per_turn_mean``: mean ``input_tokens[k+1] - input_tokens[k]``
      over all consecutive main-request pairs (compactions count negative);
    * ``think_p50/p90_s``: ``think_time`` of main requests after the first,
      where recorded;
    * ``tool_use_share`` / ``unknown_stop_share``: main requests whose
      ``stop`` is ``"tool_use"`` / ``""``;
    * ``prefix_extends_share``: consecutive main pairs where the next
      prompt's hash ids start with all of the previous prompt's;
      ``prefix_all_but_last_share``: with all but its last id;
      ``shrink_share``: where ``input_tokens`` went down.
    """

    sessions: int
    skipped: int
    main_turns: int
    turns_p50: float
    turns_p90: float
    first_input_p50: float
    first_input_p90: float
    last_input_p50: float
    last_input_p90: float
    peak_input_p50: float
    peak_input_p90: float
    growth_per_turn_mean: float
    output_p50: float
    output_p90: float
    think_p50_s: float
    think_p90_s: float
    tool_use_share: float
    unknown_stop_share: float
    prefix_extends_share: float
    prefix_all_but_last_share: float
    shrink_share: float
    sessions_with_subagents: int
    subagents: int
    subagent_requests: int


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


def _share(count: int, total: int) -> float:
    return count / total if total else math.nan


def summarize(sessions: Iterable[TraceSession],
              skipped: int = 0) -> TraceSetStats:
    """Summarise ``sessions`` (consumed once, so a generator keeps memory
    to one session); ``skipped`` is recorded as given."""
    n_sessions = 0
    turns: list[int] = []
    first: list[int] = []
    last: list[int] = []
    peak: list[int] = []
    outputs: list[int] = []
    thinks: list[float] = []
    growth_sum = pairs = extends = all_but_last = shrinks = 0
    tool_use = unknown_stop = 0
    with_subs = n_subs = sub_reqs = 0
    for s in sessions:
        n_sessions += 1
        main_reqs = s.main_requests()
        turns.append(len(main_reqs))
        first.append(main_reqs[0].input_tokens)
        last.append(main_reqs[-1].input_tokens)
        peak.append(max(r.input_tokens for r in main_reqs))
        for i, r in enumerate(main_reqs):
            outputs.append(r.output_tokens)
            tool_use += r.stop == "tool_use"
            unknown_stop += r.stop == ""
            if i and r.think_time_s is not None:
                thinks.append(r.think_time_s)
        for a, b in zip(main_reqs, main_reqs[1:]):
            pairs += 1
            growth_sum += b.input_tokens - a.input_tokens
            shrinks += b.input_tokens < a.input_tokens
            n = len(a.hash_ids)
            if b.hash_ids[:n] == a.hash_ids:
                extends += 1
            elif n and b.hash_ids[:n - 1] == a.hash_ids[:n - 1]:
                all_but_last += 1
        with_subs += bool(s.subagents)
        n_subs += len(s.subagents)
        sub_reqs += sum(len(sub.requests) for sub in s.subagents)
    n_main = sum(turns)
    return TraceSetStats(
        sessions=n_sessions,
        skipped=skipped,
        main_turns=n_main,
        turns_p50=_pct(turns, 50),
        turns_p90=_pct(turns, 90),
        first_input_p50=_pct(first, 50),
        first_input_p90=_pct(first, 90),
        last_input_p50=_pct(last, 50),
        last_input_p90=_pct(last, 90),
        peak_input_p50=_pct(peak, 50),
        peak_input_p90=_pct(peak, 90),
        growth_per_turn_mean=growth_sum / pairs if pairs else math.nan,
        output_p50=_pct(outputs, 50),
        output_p90=_pct(outputs, 90),
        think_p50_s=_pct(thinks, 50),
        think_p90_s=_pct(thinks, 90),
        tool_use_share=_share(tool_use, n_main),
        unknown_stop_share=_share(unknown_stop, n_main),
        prefix_extends_share=_share(extends, pairs),
        prefix_all_but_last_share=_share(all_but_last, pairs),
        shrink_share=_share(shrinks, pairs),
        sessions_with_subagents=with_subs,
        subagents=n_subs,
        subagent_requests=sub_reqs,
    )


_LABELS: dict[str, str] = {
    "sessions": "sessions",
    "skipped": "files skipped (not loadable)",
    "main_turns": "main-conversation requests",
    "turns_p50": "main requests per session p50",
    "turns_p90": "main requests per session p90",
    "first_input_p50": "first-request input tokens p50",
    "first_input_p90": "first-request input tokens p90",
    "last_input_p50": "last-request input tokens p50",
    "last_input_p90": "last-request input tokens p90",
    "peak_input_p50": "largest input tokens p50",
    "peak_input_p90": "largest input tokens p90",
    "growth_per_turn_mean": "input growth per request, mean",
    "output_p50": "output tokens p50",
    "output_p90": "output tokens p90",
    "think_p50_s": "think time p50 (s)",
    "think_p90_s": "think time p90 (s)",
    "tool_use_share": "stop == tool_use",
    "unknown_stop_share": "stop not recorded",
    "prefix_extends_share": "next prompt extends previous",
    "prefix_all_but_last_share": "... all but its last block",
    "shrink_share": "input shrinks (compaction)",
    "sessions_with_subagents": "sessions with sub-agents",
    "subagents": "sub-agents",
    "subagent_requests": "sub-agent requests",
}


def _fmt(name: str, value: float) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    if math.isnan(value):
        return "-"
    if name.endswith("_share"):
        return f"{100 * value:.1f}%"
    if name.endswith("_s"):
        return f"{value:,.1f}"
    return f"{value:,.0f}"


def stats_table(columns: Sequence[tuple[str, TraceSetStats]], *,
                markdown: bool = False) -> str:
    """One row per statistic, one column per named set."""
    rows = [["statistic"] + [name for name, _ in columns]]
    for f in fields(TraceSetStats):
        rows.append([_LABELS[f.name]] +
                    [_fmt(f.name, getattr(st, f.name)) for _, st in columns])
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |",
                 "|" + "---|" + "---:|" * len(columns)]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                  for i, (c, w) in enumerate(zip(r, widths))) for r in rows)


def summarize_dir(path: str | Path) -> tuple[TraceSetStats,
                                             list[tuple[str, str]]]:
    """:func:`summarize` a directory, one session in memory at a time;
    also returns the skipped ``(file name, reason)`` pairs."""
    skipped: list[tuple[str, str]] = []

    def sessions() -> Iterator[TraceSession]:
        for file, loaded in iter_trace_dir(path):
            if isinstance(loaded, str):
                skipped.append((file.name, loaded))
            else:
                yield loaded

    stats = summarize(sessions())
    return replace(stats, skipped=len(skipped)), skipped


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sim.trace_stats",
        description="Statistics of kv-cache-tester trace sets (Claude Code "
        "sessions), one column per directory.")
    parser.add_argument(
        "dirs", nargs="*", metavar="DIR", type=Path,
        help=f"directories of trace_*.json files (default: the shipped "
        f"subset, {DEFAULT_TRACE_DIR})")
    parser.add_argument("--markdown", action="store_true",
                        help="print a Markdown table")
    parser.add_argument("--show-skipped", action="store_true",
                        help="list the files that did not load and why")
    args = parser.parse_args(argv)
    dirs: list[Path] = args.dirs or [DEFAULT_TRACE_DIR]
    columns: list[tuple[str, TraceSetStats]] = []
    for d in dirs:
        try:
            stats, skipped = summarize_dir(d)
        except FileNotFoundError as e:
            parser.error(str(e))
        columns.append((str(d), stats))
        if args.show_skipped:
            for name, reason in skipped:
                print(f"skipped {d / name}: {reason}", file=sys.stderr)
    print(stats_table(columns, markdown=args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
