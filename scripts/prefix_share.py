"""How much of the previous prompt does a real client's next prompt hold?

The data behind ``prompt_prefix.CONTINUE_SHARE``: on the shipped real Claude
Code traces (``benchmarks/data/claude_code_traces``, 64-token hash blocks),
for every main-conversation request after the first, the share of the
previous main request's blocks it holds as a prefix; for every side request
(``type`` ``s``: titles, summaries, other models), the share of the latest
main request it holds. Prints a table and, with ``--doc``, writes it as a
Markdown page.

    python scripts/prefix_share.py --doc docs/prefix_share.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "benchmarks" / "data" / "claude_code_traces"
# Shares a continuation rule could draw the line at.
THRESHOLDS = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)
# Histogram bins of the share (left-closed; the last holds exactly 1).
BINS = ((0.0, 0.1), (0.1, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 0.9), (0.9, 0.99), (0.99, 1.0), (1.0, 1.0))


def common_prefix(a: list[int], b: list[int]) -> int:
    """Leading hash ids ``a`` and ``b`` share."""
    return len(os.path.commonprefix([a, b]))


def shares(trace_dir: Path) -> tuple[list[float], list[float], int]:
    """(main -> next main shares, side request shares, sessions read)."""
    main: list[float] = []
    side: list[float] = []
    sessions = 0
    for path in sorted(trace_dir.glob("trace_*.json")):
        trace = json.loads(path.read_text())
        sessions += 1
        first_model = trace["requests"][0]["model"]
        previous: list[int] | None = None
        for request in trace["requests"]:
            hashes = request.get("hash_ids")
            if hashes is None:  # a sub-agent summary entry: no prompt of its own here
                continue
            if request["type"] == "n" and request["model"] == first_model:
                if previous:
                    main.append(common_prefix(previous, hashes) / len(previous))
                previous = hashes
            elif previous:
                side.append(common_prefix(previous, hashes) / len(previous))
    return main, side, sessions


def histogram(values: list[float]) -> list[int]:
    counts = []
    for lo, hi in BINS:
        if lo == hi:
            counts.append(sum(1 for v in values if v == hi))
        else:
            counts.append(sum(1 for v in values if lo <= v < hi))
    return counts


def render(main: list[float], side: list[float], sessions: int) -> str:
    def pct(k: int, n: int) -> str:
        return f"{100.0 * k / n:.1f}%" if n else "-"

    lines = [
        "# Which turn continues which: the prefix real clients keep",
        "",
        "Written by `python scripts/prefix_share.py --doc docs/prefix_share.md` from the shipped real",
        f"Claude Code traces ({sessions} sessions, `benchmarks/data/claude_code_traces`, 64-token hash blocks).",
        "For each main-conversation request after the first: the share of the previous main request's",
        "blocks it holds as a prefix. For each side request (titles, summaries, other models): the",
        "share of the latest main request it holds. This is the data behind",
        "`prompt_prefix.CONTINUE_SHARE` (one half): a request continues a conversation when it holds",
        "at least half of its last prompt beyond the prefix shared with other traffic.",
        "",
        f"| share of the previous prompt held | main -> next main ({len(main)}) | side requests ({len(side)}) |",
        "|---|---|---|",
    ]
    for (lo, hi), m, s in zip(BINS, histogram(main), histogram(side)):
        label = f"exactly {hi:g}" if lo == hi else f"[{lo:g}, {hi:g})"
        lines.append(f"| {label} | {m} ({pct(m, len(main))}) | {s} ({pct(s, len(side))}) |")
    lines += [
        "",
        "| a rule continuing at >= | main requests continued | side requests continued |",
        "|---|---|---|",
    ]
    for t in THRESHOLDS:
        m = sum(1 for v in main if v >= t)
        s = sum(1 for v in side if v >= t)
        lines.append(f"| {t:g} | {pct(m, len(main))} | {pct(s, len(side))} |")
    exact = sum(1 for v in main if v == 1.0)
    lines += [
        "",
        f"The old rule (the previous prompt's last block unchanged: share exactly 1) continues "
        f"{pct(exact, len(main))} of the main conversation's requests and, with AIPerf's hash-block prompts",
        "(the previous prompt's partial tail block is never carried over), none. Requests holding less",
        "than half are rewrites of the history (a compaction's summary): a new context. A side request",
        "holds all of the conversation (a summary of it, which may as well continue it) or none of it.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=Path, default=TRACES, help="folder of weka-trace JSON sessions")
    parser.add_argument("--doc", type=Path, help="write the table as a Markdown page here")
    args = parser.parse_args(argv)
    main_shares, side_shares, sessions = shares(args.traces)
    if not main_shares:
        print(f"no main-conversation requests in {args.traces}", file=sys.stderr)
        return 1
    text = render(main_shares, side_shares, sessions)
    print(text)
    if args.doc is not None:
        args.doc.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
