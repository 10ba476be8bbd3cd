"""Live AIPerf replays, several runs, written up: docs/aiperf.md and its plot.

Runs ``python -m benchmarks.aiperf_replay`` ``--runs`` times with the same
arguments (each run starts one fresh ``vllm serve`` per arm, so every arm of
a run sees the same machine state and the runs show the spread), then reads
each run's ``results.json`` and writes a Markdown page: per arm and run the
mean session JCT, the prefix-cache hit share and how the plugin read the
sessions (jobs ended, extra conversations, pins), and the share of the
FCFS -> oracle gap each arm closes, per run and pooled over the runs
(``(sum fcfs - sum arm) / (sum fcfs - sum oracle)`` of the runs' means).

    python scripts/aiperf_report.py --runs 3 --doc docs/aiperf.md --plot docs/aiperf.png \\
        -- --sessions 24 --turns 15 --min-turns 15 --max-input 0 --num-blocks 600

Arguments after ``--`` go to the replay (``--policies`` is set from
``--arms``). ``--only-report`` re-renders the page from the run directories
already under ``--out-root``; ``--resume`` runs in each run directory only
the arms its ``results.json`` lacks (or that failed there), keeping the
others (the replay refuses a directory of another workload). Run ``i``
runs the arms in ``--arms`` order rotated to start at its ``i``-th arm
(:func:`run_order`): an arm's place in a run moves its JCT. The page names
the commits its arms ran and the order they ran in, and pools each arm over
the runs it has.

The default ``--out-root`` is ``docs/aiperf_runs``: its ``.gitignore`` keeps
each run's ``results.json`` (all the page reads) and drops the rest (AIPerf's
exports, server logs), so the runs travel with the repository and the page
can be rendered again on another machine. (docs/aiperf.md's five runs predate
this: they lived under the old default, ``results/``, and are not in git.)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from scripts.sim_report import replace_readme_block  # noqa: E402
DEFAULT_ARMS = "fcfs,continuum,context_serve,continuum-paper,oracle,continuum-no-header"
# README.md's block this script owns (the summary of the page it writes).
README_BEGIN = "<!-- aiperf-report: written by scripts/aiperf_report.py -->"
README_END = "<!-- /aiperf-report -->"


def run_dirs(root: Path, runs: int) -> list[Path]:
    return [root / f"run{i + 1}" for i in range(runs)]


def replay(run_dir: Path, arms: str, replay_args: list[str]) -> int:
    cmd = [sys.executable, "-m", "benchmarks.aiperf_replay", *replay_args, "--policies", arms, "--out", str(run_dir)]
    print(f"[aiperf-report] {shlex.join(cmd)}", file=sys.stderr, flush=True)
    return subprocess.run(cmd, cwd=REPO).returncode


def run_order(arms: list[str], run_index: int) -> list[str]:
    """The order run ``run_index`` (0-based) runs ``arms`` in: the list
    rotated to start at arm ``run_index`` (mod its length). A run's arms
    share one machine one after another, and an arm's place moved its JCT
    by ~10% live (docs/aiperf_affinity.md: the arm after FCFS was the slower
    of two equal arms in runs 1-2, the faster in run 3); rotating keeps any
    arm from always running first, or always right after the same one."""
    if not arms:
        return []
    k = run_index % len(arms)
    return arms[k:] + arms[:k]


def load(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "results.json"
    if not path.exists():
        raise SystemExit(f"{path} not found: run the replay first (without --only-report)")
    return json.loads(path.read_text())


def missing_arms(run_dir: Path, arms: list[str]) -> list[str]:
    """The arms of ``arms`` that ``run_dir`` has no result for (or a failed one)."""
    path = run_dir / "results.json"
    if not path.exists():
        return list(arms)
    done = {a["policy"] for a in json.loads(path.read_text()).get("arms", []) if "error" not in a}
    return [a for a in arms if a not in done]


def commits(results: list[dict[str, Any]]) -> list[str]:
    """Every commit an arm of these runs ran, oldest run first."""
    seen: list[str] = []
    for r in results:
        for c in [a.get("commit", r.get("commit")) for a in r["arms"]] or [r.get("commit")]:
            if str(c) not in seen:
                seen.append(str(c))
    return seen


def commit_note(results: list[dict[str, Any]]) -> str:
    """Which runs' arms ran which commit, when they are not all one."""
    by_commit: dict[str, list[str]] = {}
    for i, r in enumerate(results):
        for a in r["arms"]:
            by_commit.setdefault(str(a.get("commit", r.get("commit"))), []).append(f"{a['policy']} (run {i + 1})")
    if len(by_commit) < 2:
        return ""
    return "Arms by commit: " + "; ".join(f"{c}: {', '.join(arms)}" for c, arms in by_commit.items()) + "."


K = TypeVar("K", bound=Hashable)


def runs_by(results: list[dict[str, Any]], key: Callable[[dict[str, Any]], K]) -> dict[K, str]:
    """The runs grouped by ``key(run's results)``, in first-seen order:
    each key with its runs as text (``run 1``, ``runs 2-3``)."""
    groups: dict[K, list[int]] = {}
    for i, r in enumerate(results):
        groups.setdefault(key(r), []).append(i + 1)
    return {k: _runs_text(runs) for k, runs in groups.items()}


def machines(results: list[dict[str, Any]]) -> str:
    """The CPU and dtype the runs ran on: one when all runs share it, else
    each with its runs (``Intel Xeon, bfloat16 (run 1); AMD EPYC, bfloat16
    (runs 2-3)``): runs of one page may come from several sessions'
    machines, and each run's arms compare on its own."""
    by_machine = runs_by(results, lambda r: f"{r['cpu']}, {r['dtype']}")
    if len(by_machine) == 1:
        return next(iter(by_machine))
    return "; ".join(f"{m} ({runs})" for m, runs in by_machine.items())


def _runs_text(runs: list[int]) -> str:
    """``run 1``, ``runs 2-3``, ``runs 1, 3``."""
    if len(runs) == 1:
        return f"run {runs[0]}"
    if runs == list(range(runs[0], runs[-1] + 1)):
        return f"runs {runs[0]}-{runs[-1]}"
    return "runs " + ", ".join(str(r) for r in runs)


def mean_jct(arm: dict[str, Any]) -> float | None:
    return arm["jct_s"]["mean"] if arm.get("jct_s") else None


def gap_share(fcfs: float, oracle: float, value: float) -> float | None:
    return (fcfs - value) / (fcfs - oracle) if fcfs > oracle else None


def pooled_share(totals: dict[str, list[float | None]], arm: str) -> tuple[list[float | None], float | None]:
    """The arm's gap share per run and pooled, over the runs in which it,
    fcfs and the oracle all have a result (an arm added to some runs only
    is pooled over those)."""
    fc, orc, values = totals.get("fcfs") or [], totals.get("oracle") or [], totals[arm]
    runs = [(f, o, v) for f, o, v in zip(fc, orc, values) if None not in (f, o, v)]
    if not runs:
        return [], None
    shares = [gap_share(f, o, v) for f, o, v in runs]
    return shares, gap_share(sum(r[0] for r in runs), sum(r[1] for r in runs), sum(r[2] for r in runs))


def host_tier_note(results: list[dict[str, Any]]) -> list[str]:
    """A line on the offload arms' host tier, when a run has them."""
    for r in results:
        for a in r["arms"]:
            blocks = (a.get("arm") or {}).get("host_tier_blocks") or 0
            if blocks:
                share = r["config"].get("host_tier")
                return [f"The `*native-offload` arms run vLLM's own CPU offloading (its `OffloadingConnector`), "
                        "`continuum-offload-explicit` the plugin's connector storing what leaves a pin (`store_mode: "
                        "explicit`), `*offload-victim` the same connector storing what the GPU evicts (`store_mode: "
                        f"victim`), with a host tier of {blocks} blocks"
                        + (f" ({share:g} x the sessions' peak working set)" if share else "")
                        + ": pool and tier together keep less than the sessions need."]
    return []


def session_text(arm: dict[str, Any]) -> str:
    """How AIPerf named the arm's sessions (its results' ``arm`` entry).
    Runs before the runner recorded ``affinity_header`` had AIPerf 0.13's
    default ``X-Session-Affinity`` on, and a plugin that did not read it."""
    header, affinity = arm.get("session_header"), arm.get("affinity_header")
    if header:
        return f"`--session-header {header}`"
    if affinity is None:
        return ("no session id read (AIPerf's default `X-Session-Affinity` was sent; "
                "the plugin of the time did not read it)")
    if affinity:
        return "AIPerf's default `X-Session-Affinity` only (no `--session-header`)"
    return "none (AIPerf's `X-Session-Affinity` off)"


def session_note(results: list[dict[str, Any]], arms: list[str]) -> list[str]:
    """A line saying how each arm named its sessions (arms with the same
    way grouped, in ``arms`` order), from the first run that has the arm."""
    groups: dict[str, list[str]] = {}
    for name in arms:
        entry = next((a for r in results for a in r["arms"] if a["policy"] == name and "arm" in a), None)
        if entry is not None:
            groups.setdefault(session_text(entry["arm"]), []).append(f"`{name}`")
    if not groups:
        return []
    return ["Session ids: " + "; ".join(f"{', '.join(names)}: {text}" for text, names in groups.items()) + "."]


def pacing_text(rate: float | None) -> str:
    """How AIPerf issued turns in a run (its results' ``aiperf_request_rate``;
    runs recorded before it existed ran AIPerf's concurrency mode)."""
    if rate:
        return (f"AIPerf issued due turns on a {rate:g}-per-second clock (`--request-rate {rate:g} "
                f"--arrival-pattern constant`)")
    return "AIPerf in its concurrency mode (its timing loop keeps a CPU core busy all run)"


def pacing_note(results: list[dict[str, Any]]) -> list[str]:
    """A line saying how AIPerf paced each run, runs paced alike grouped."""
    by_rate = runs_by(results, lambda r: r.get("aiperf_request_rate"))
    if not by_rate:
        return []
    if len(by_rate) == 1:
        return [pacing_text(next(iter(by_rate))) + "."]
    return ["; ".join(f"{pacing_text(rate)} ({runs})" for rate, runs in by_rate.items()) + "."]


def order_note(results: list[dict[str, Any]]) -> list[str]:
    """A line saying in which order each run's arms ran (its results list
    them in that order: an arm run again with ``--resume`` goes last), runs
    with the same order grouped. The arms of a run share one machine one
    after another, so an arm's speed may depend on its place."""
    by_order = runs_by(results, lambda r: tuple(a["policy"] for a in r["arms"]))
    if not by_order:
        return []
    head = "Arms ran one after another, each on a fresh server, in this order: "
    orders = {", ".join(f"`{a}`" for a in order): runs for order, runs in by_order.items()}
    if len(orders) == 1:
        return [head + next(iter(orders)) + "."]
    return [head + "; ".join(f"{runs}: {order}" for order, runs in orders.items()) + "."]


def render(results: list[dict[str, Any]], arms: list[str], command: str, plot_name: str = "aiperf.png") -> str:
    first = results[0]
    by_run = [{a["policy"]: a for a in r["arms"] if "error" not in a} for r in results]
    n = len(results)
    sessions = len(first["sessions"])
    turns = sum(s["turns"] for s in first["sessions"])
    lines = [
        "# Live replay of real Claude Code sessions through AIPerf",
        "",
        f"Written by `{command}`.",
        "",
        f"Machine: {machines(results)}; NVIDIA AIPerf {first['aiperf_version']}; "
        f"commit {', '.join(commits(results))}; "
        f"the embedded SmolLM2-135M served by `vllm serve`, one fresh server per arm and run.",
        f"{sessions} sessions of the shipped kv-cache-tester Claude Code traces, {turns} requests in all "
        f"(prompts / {first['config']['merge']}, think times capped at {first['config']['max_think']:g} s), "
        f"`--custom-dataset-type weka_trace --no-fixed-schedule --use-think-time-only`; "
        f"a KV pool of {first['num_blocks']} x {first['block_size']}-token blocks "
        f"(the oracle's never evicts). {n} run{'s' if n != 1 else ''}.",
        *host_tier_note(results),
        *session_note(results, arms),
        *pacing_note(results),
        *order_note(results),
        "",
        "Mean session JCT (s), per run; the share of the FCFS -> oracle gap each arm closes",
        "(per run, and pooled over the runs: `(sum fcfs - sum arm) / (sum fcfs - sum oracle)`):",
        "",
        "| arm | " + " | ".join(f"run {i + 1}" for i in range(n)) + " | gap closed per run | pooled | prefix hits |",
        "|---|" + "---|" * n + "---|---|---|",
    ]
    totals = {arm: [mean_jct(run[arm]) if arm in run else None for run in by_run] for arm in arms}
    for arm in arms:
        values = totals[arm]
        cells = [f"{v:.1f}" if v is not None else ("failed" if arm in run else "-")
                 for v, run in zip(values, by_run)]
        shares, pooled = pooled_share(totals, arm)
        per_run = ", ".join(f"{s:+.0%}" for s in shares if s is not None) or "-"
        pooled = f"{pooled:+.0%}" if pooled is not None else "-"
        hits = [run[arm].get("prefix_cache_hit_share") for run in by_run if arm in run]
        hit_text = ", ".join(f"{h:.0%}" for h in hits if h is not None) or "-"
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {per_run} | {pooled} | {hit_text} |")
    note = commit_note(results)
    if note:
        lines += ["", note]
    lines += [
        "",
        "How the plugin read the sessions (server counters over the arm, run 1; requests"
        f" {turns}): jobs ended (an answered task included), conversations beside a session's first,"
        " pins made, pins handed to the next turn, pins lapsed:",
        "",
        "| arm | jobs ended | extra conversations | pins | handed over | lapsed (TTL) | failed requests |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        a = by_run[0].get(arm)
        if a is None:
            continue
        c = a.get("server_counters") or {}
        lines.append(f"| {arm} | {c.get('jobs_ended', 0):.0f} | {c.get('session_conversations', 0):.0f} | "
                     f"{c.get('pins_created', 0):.0f} | {c.get('pins_released_handoff', 0):.0f} | "
                     f"{c.get('pins_released_ttl', 0):.0f} | {sum(r[arm]['failed'] for r in by_run if arm in r)} |")
    lines += ["", f"![mean session JCT per arm and run]({plot_name})", ""]
    return "\n".join(lines)


def readme_block(results: list[dict[str, Any]], arms: list[str]) -> list[str]:
    """The README's summary (the lines between its markers): mean JCT over
    the runs and the pooled gap share."""
    first = results[0]
    by_run = [{a["policy"]: a for a in r["arms"] if "error" not in a} for r in results]
    means = {arm: [mean_jct(run[arm]) if arm in run else None for run in by_run]
             for arm in [*arms, "fcfs", "oracle"]}
    lines = [
        f"Live replay by NVIDIA AIPerf {first['aiperf_version']} of {len(first['sessions'])} real Claude Code "
        f"sessions ({sum(s['turns'] for s in first['sessions'])} requests, `--session-header` as AIPerf sends it, "
        f"prompts rebuilt from the traces' hash blocks), {machines(results)}, "
        f"{len(results)} run(s); full table: [docs/aiperf.md](docs/aiperf.md).",
        "",
        "| arm | runs | mean session JCT, mean of runs | FCFS -> oracle gap closed (pooled) |",
        "|---|---|---|---|",
    ]
    for arm in arms:
        values = [v for v in means[arm] if v is not None]
        if not values:
            lines.append(f"| {arm} | 0 | failed | - |")
            continue
        _, g = pooled_share(means, arm)
        share = f"{g:+.0%}" if g is not None else "-"
        lines.append(f"| {arm} | {len(values)} | {sum(values) / len(values):.1f} s | {share} |")
    return lines


def update_readme(path: Path, body: list[str]) -> None:
    """Write ``body`` into the README's aiperf-report block."""
    replace_readme_block(str(path), README_BEGIN, README_END, body)


def plot(results: list[dict[str, Any]], arms: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_run = [{a["policy"]: a for a in r["arms"] if "error" not in a} for r in results]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(by_run))
    for i, run in enumerate(by_run):
        xs = [j + i * width for j in range(len(arms))]
        ys = [mean_jct(run[a]) or 0.0 if a in run else 0.0 for a in arms]
        ax.bar(xs, ys, width, label=f"run {i + 1}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(arms))], arms, rotation=20, ha="right")
    ax.set_ylabel("mean session JCT (s)")
    ax.set_title(f"AIPerf replay of Claude Code traces ({machines(results)})", fontsize=9, wrap=True)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    replay_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, replay_args = argv[:i], argv[i + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="replays to run (default: %(default)s)")
    parser.add_argument("--arms", default=DEFAULT_ARMS, help="arms of every run (default: %(default)s)")
    parser.add_argument("--out-root", type=Path, default=REPO / "docs" / "aiperf_runs",
                        help="run directories go here as run1, run2, ... (default: %(default)s)")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "aiperf.md", help="page to write")
    parser.add_argument("--plot", type=Path, default=REPO / "docs" / "aiperf.png", help="plot to write")
    parser.add_argument("--readme", default=str(REPO / "README.md"),
                        help="README whose aiperf-report block gets the summary ('': none, for a page of "
                             "its own; default: %(default)s)")
    parser.add_argument("--only-report", action="store_true", help="render from existing run directories")
    parser.add_argument("--resume", action="store_true",
                        help="run in each run directory only the arms it has no result for (keeps the others)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    dirs = run_dirs(args.out_root, args.runs)
    if not args.only_report:
        for i, d in enumerate(dirs):
            todo = run_order(missing_arms(d, arms) if args.resume else arms, i)
            print(f"[aiperf-report] run {i + 1}/{len(dirs)}: {', '.join(todo) or 'complete'}",
                  file=sys.stderr, flush=True)
            if todo:
                replay(d, ",".join(todo), replay_args)  # a failed arm is reported in the page
    results = [load(d) for d in dirs]
    # Where the page, its plot and its runs go, when not to the defaults.
    places = [f"--{name.replace('_', '-')}={os.path.relpath(value, REPO) if value else value}"
              for name, value in (("out_root", args.out_root), ("doc", args.doc), ("plot", args.plot),
                                  ("readme", args.readme))
              if str(value) != str(parser.get_default(name))]
    command = "python scripts/aiperf_report.py " + shlex.join(
        [f"--runs={args.runs}", f"--arms={args.arms}", *places] + (["--", *replay_args] if replay_args else []))
    text = render(results, arms, command, os.path.relpath(args.plot, args.doc.parent))
    args.doc.write_text(text)
    plot(results, arms, args.plot)
    if args.readme:
        update_readme(Path(args.readme), readme_block(results, arms))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
