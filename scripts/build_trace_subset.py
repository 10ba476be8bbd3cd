#!/usr/bin/env python3
"""Build the shipped subset of kv-cache-tester's Claude Code traces.

    python scripts/build_trace_subset.py /path/to/kv-cache-tester \\
        [--commit SHA] [--out benchmarks/data/claude_code_traces]

reads ``traces/*.json`` and ``LICENSE`` of an extracted checkout of
https://github.com/callanjfox/kv-cache-tester, copies the selected trace
files byte for byte into ``--out`` (after removing the ``trace_*.json``
files there), copies the upstream LICENSE, writes NOTICE, and writes
README.md with the selection rule and the statistics that
``python -m benchmarks.sim.trace_stats`` prints for the subset and for all the
checkout's files. The rule (constants below; deterministic):

1. A session is eligible when it loads (``benchmarks.sim.traces``), has at
   least ``MIN_MAIN_REQUESTS`` main-conversation requests, every request
   (main and sub-agent) has ``in + out <= MAX_CONTEXT_TOKENS`` (a
   128k-context model such as Llama-3.1 serves the whole session without
   truncation), every request after a conversation's first has a recorded
   ``think_time``, and the file is at most ``MAX_FILE_BYTES`` (a file's
   size grows with the sum of its prompts' lengths; the cap keeps the
   subset to a few MB).
2. The eligible sessions are split into ``STRATA`` strata at the quantiles
   of their main-request counts, so that short and long sessions keep
   their share of the eligible population.
3. From each stratum, ``PER_STRATUM`` sessions: those with sub-agents first
   (rare, and they exercise the nesting), then the rest in ascending order
   of ``sha256(file name)`` (a fixed pseudo-random order).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.sim.trace_stats import (  # noqa: E402
    TraceSetStats, stats_table, summarize_dir)
from benchmarks.sim.traces import (  # noqa: E402
    DEFAULT_TRACE_DIR, TraceSession, iter_trace_dir)

UPSTREAM_URL = "https://github.com/callanjfox/kv-cache-tester"
MIN_MAIN_REQUESTS = 2
MAX_CONTEXT_TOKENS = 131_072
MAX_FILE_BYTES = 400_000
STRATA = 5
PER_STRATUM = 10


@dataclass(frozen=True)
class Candidate:
    """An eligible session, as the selection sees it."""

    name: str
    size: int
    main_requests: int
    peak_context: int
    subagents: int


def is_eligible(session: TraceSession, size: int) -> bool:
    """Rule 1 of the module docstring."""
    if (len(session.main_requests()) < MIN_MAIN_REQUESTS
            or size > MAX_FILE_BYTES):
        return False
    if any(r.input_tokens + r.output_tokens > MAX_CONTEXT_TOKENS
           for r in session.requests):
        return False
    return all(r.think_time_s is not None
               for conv in session.conversations().values()
               for r in conv[1:])


def stratify(cands: list[Candidate]) -> tuple[list[list[Candidate]],
                                              list[float]]:
    """Rule 2: the strata (each in rule 3's order) and their inner edges;
    stratum i holds counts in ``[edges[i-1], edges[i])``."""
    counts = np.array([c.main_requests for c in cands])
    edges = [float(q) for q in np.quantile(
        counts, [i / STRATA for i in range(1, STRATA)])]
    strata: list[list[Candidate]] = [[] for _ in range(STRATA)]
    for c in cands:
        i = int(np.searchsorted(edges, c.main_requests, side="right"))
        strata[i].append(c)

    def order(c: Candidate) -> tuple[int, str]:
        return (0 if c.subagents else 1,
                hashlib.sha256(c.name.encode()).hexdigest())

    return [sorted(s, key=order) for s in strata], edges


def commit_of(checkout: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"],
            capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def render_readme(*, commit: str, strata: list[list[Candidate]],
                  chosen: list[list[Candidate]], edges: list[float],
                  n_files: int, table: str, source_note: str) -> str:
    flat = sorted((c for s in chosen for c in s), key=lambda c: c.name)
    total_mb = sum(c.size for c in flat) / 1e6
    bounds = [float(MIN_MAIN_REQUESTS)] + edges
    n_eligible = sum(len(s) for s in strata)
    out = [
        "# Claude Code sessions: a subset of kv-cache-tester's traces",
        "",
        f"{len(flat)} anonymised Claude Code sessions ({total_mb:.2f} MB): "
        "byte-identical copies of `traces/trace_NNNN.json` from "
        f"[callanjfox/kv-cache-tester]({UPSTREAM_URL}) at commit "
        f"`{commit}`, under the Apache License 2.0 (`LICENSE` is "
        "upstream's; attribution in `NOTICE`). Upstream generated them from "
        "real Claude Code sessions (captured with claude-code-proxy, as "
        "part of research at WEKA).",
        "",
        "`benchmarks/sim/traces.py` reads them (its docstring describes the "
        "format as found in these files) and "
        "`python -m benchmarks.sim.trace_stats` prints the statistics below. "
        "AIPerf reads the same files (`--custom-dataset-type weka-trace`).",
        "",
        "## Selection rule",
        "",
        "`scripts/build_trace_subset.py` applies it; run it on an extracted "
        "checkout to regenerate this directory.",
        "",
        f"1. Eligible: the file loads; at least {MIN_MAIN_REQUESTS} "
        "main-conversation requests; every request (main and sub-agent) "
        f"has `in + out <= {MAX_CONTEXT_TOKENS:,}`, so a 128k-context "
        "model serves the whole session; every request after a "
        "conversation's first has a `think_time`; the file is at most "
        f"{MAX_FILE_BYTES:,} bytes (a file grows with the sum of its "
        "prompts' lengths, so the cap keeps the subset to a few MB). "
        f"{n_eligible} of the {n_files} files are eligible.",
        f"2. {STRATA} strata at the quantiles of the eligible sessions' "
        "main-request counts.",
        f"3. {PER_STRATUM} sessions from each stratum: those with "
        "sub-agents first, then ascending `sha256(file name)`.",
        "",
        "| stratum: main requests | eligible | chosen |",
        "|---|---:|---:|",
    ]
    for i, (pool, picked) in enumerate(zip(strata, chosen)):
        hi = "..." if i == len(strata) - 1 else f"{bounds[i + 1]:g}"
        out.append(f"| [{bounds[i]:g}, {hi}) | {len(pool)} | {len(picked)} |")
    out += [
        "",
        "The subset is therefore shorter than the whole set: most upstream "
        "sessions outgrow a 128k context (see the table). Within what one "
        "GPU profile serves, it keeps the spread of session lengths.",
        "",
        "## Statistics",
        "",
        "From `python -m benchmarks.sim.trace_stats --markdown SUBSET ALL`: "
        "main-conversation requests unless named otherwise (definitions: "
        "`TraceSetStats` in `benchmarks/sim/trace_stats.py`). \"all files\" is "
        f"every file of the checkout's `traces/`. {source_note}".rstrip(),
        "",
        table,
        "",
        "## Files",
        "",
        "| file | main requests | largest prompt+output | sub-agents | "
        "bytes |",
        "|---|---:|---:|---:|---:|",
    ]
    for c in flat:
        out.append(f"| {c.name} | {c.main_requests} | {c.peak_context:,} | "
                   f"{c.subagents} | {c.size:,} |")
    return "\n".join(out) + "\n"


NOTICE = """\
This directory contains unmodified trace files (trace_*.json) from
kv-cache-tester, {url},
commit {commit}.
Copyright 2024 Callan Fox. Licensed under the Apache License, Version 2.0;
the LICENSE file here is kv-cache-tester's.

The traces are anonymised Claude Code sessions that kv-cache-tester's
authors generated (research at WEKA). The subset's selection rule:
README.md.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build the shipped subset of kv-cache-tester's traces "
        "(the rule: this script's docstring).")
    parser.add_argument("checkout", type=Path,
                        help="an extracted kv-cache-tester checkout, with "
                        "traces/ and LICENSE")
    parser.add_argument("--out", type=Path, default=DEFAULT_TRACE_DIR,
                        help="where to write the subset (default: "
                        "%(default)s)")
    parser.add_argument("--commit", help="the checkout's upstream commit "
                        "(default: git rev-parse HEAD in it)")
    parser.add_argument("--source-note", default="",
                        help="a sentence about the checkout for the README, "
                        "e.g. which upstream files it lacks")
    args = parser.parse_args(argv)
    traces_dir: Path = args.checkout / "traces"
    license_file: Path = args.checkout / "LICENSE"
    if not license_file.is_file():
        parser.error(f"no LICENSE in {args.checkout}")
    commit = args.commit or commit_of(args.checkout)
    if not commit:
        parser.error("cannot tell the checkout's commit: pass --commit")

    cands: list[Candidate] = []
    n_files = 0
    for file, loaded in iter_trace_dir(traces_dir):
        n_files += 1
        if isinstance(loaded, str):
            print(f"skipped {file.name}: {loaded}", file=sys.stderr)
            continue
        size = file.stat().st_size
        if is_eligible(loaded, size):
            cands.append(Candidate(
                name=file.name, size=size,
                main_requests=len(loaded.main_requests()),
                peak_context=max(r.input_tokens + r.output_tokens
                                 for r in loaded.requests),
                subagents=len(loaded.subagents)))
    if not cands:
        parser.error(f"no eligible session in {traces_dir}")
    strata, edges = stratify(cands)
    chosen = [s[:PER_STRATUM] for s in strata]

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("trace_*.json"):
        old.unlink()
    for c in (c for s in chosen for c in s):
        shutil.copyfile(traces_dir / c.name, out / c.name)
    shutil.copyfile(license_file, out / "LICENSE")
    (out / "NOTICE").write_text(NOTICE.format(url=UPSTREAM_URL,
                                              commit=commit))

    columns: list[tuple[str, TraceSetStats]] = []
    for name, d in (("subset", out), ("all files", traces_dir)):
        stats, _ = summarize_dir(d)
        columns.append((name, stats))
    table = stats_table(columns, markdown=True)
    (out / "README.md").write_text(render_readme(
        commit=commit, strata=strata, chosen=chosen, edges=edges,
        n_files=n_files, table=table, source_note=args.source_note))
    n = sum(len(s) for s in chosen)
    mb = sum(c.size for s in chosen for c in s) / 1e6
    print(f"wrote {n} sessions ({mb:.2f} MB) to {out}")
    print(stats_table(columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
