"""Write docs/simulator.md: the Claude Code trace subset replayed at H100 scale.

For each profile (H100 + Llama-3.1-8B, 4xH100 + Llama-3.1-70B TP4):

1. a load sweep (``--sweep-rate``) over fcfs, continuum, context_serve and
   the oracle, on the profile's own KV pool;
2. a pool sweep at the load where FCFS's prefix-hit share first falls
   below 50% (the crossover: where pinning starts to pay);

then tables of mean / p90 JCT, hit share and the share of the FCFS→oracle
gap closed: at that high load, at the lowest load (the difference from
FCFS), and across pool sizes. Every figure in the document comes from the
results.json files this script makes with ``benchmarks.simulate``; the
commands are printed in the document.

    python scripts/sim_report.py [--step-model aiconfigurator] [--out results/sim]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.stats import gap_closed  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILES = ("h100-llama8b", "h100-llama70b-tp4")
# Load sweeps (sessions/min) per profile.
RATES = {"h100-llama8b": "0.5,1,2", "h100-llama70b-tp4": "0.5,1,2"}
POOLS = "0.5,1,2"
ARMS = "fcfs,continuum,context_serve,oracle"
OFFLOAD_ARMS = "continuum-offload,native-offload,continuum-native-offload"
ARM_ORDER = ["fcfs", "continuum", "context_serve", "continuum-offload", "native-offload", "continuum-native-offload",
             "oracle"]
PIN_ARMS = ("continuum", "context_serve", "continuum-offload", "continuum-native-offload")
LOW_RATE = 0.1  # sessions/min: a few sessions at a time
LOW_SESSIONS = 20
OFFLOAD_GIB = 256.0  # simulate's --offload-gib default


def run(argv: list[str]) -> None:
    """``benchmarks.simulate`` with ``argv``, unless its --out already holds
    the results of exactly this command (a rerun after an interruption)."""
    out = argv[argv.index("--out") + 1]
    done = os.path.join(out, "results.json")
    if os.path.exists(done) and load(done).get("argv") == argv:
        print(f"[sim_report] reusing {done}", file=sys.stderr)
        return
    cmd = [sys.executable, "-m", "benchmarks.simulate", *argv]
    print("[sim_report] " + " ".join(cmd[1:]), file=sys.stderr)
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


class SimPoints:
    """A report's simulator runs: ``point(path, argv)`` runs (or reuses)
    ``benchmarks.simulate argv --out path`` with the report's ``common``
    arguments and returns its points; :meth:`write` writes the document
    with every command it ran, in order."""

    def __init__(self, common: list[str]) -> None:
        self.common = common
        self.commands: list[str] = []

    def point(self, path: str, argv: list[str], common: list[str] | None = None) -> list[dict]:
        """The points of ``path``'s results.json, each with ``code_commit``:
        the commit of the code that ran them (None: not recorded, a run from
        before results recorded it). ``common``: other shared arguments for
        this point (another seed) in place of the report's."""
        argv = [*argv, *(self.common if common is None else common), "--out", path]
        run(argv)
        results = load(os.path.join(path, "results.json"))
        commit = results.get("commit")
        self.commands.append("python -m benchmarks.simulate " + " ".join(argv)
                             + f"  # code: {commit or 'not recorded (before 2026-11-29)'}")
        return [{**p, "code_commit": commit} for p in results["points"]]

    def write(self, doc: str, lines: list[str], who: str) -> None:
        with open(doc, "w") as f:
            f.write("\n".join([*lines, "## Commands", "",
                               "Each names the commit of the code it ran (`+dirty`: with uncommitted changes).", "",
                               "```", *self.commands, "```", ""]))
        print(f"[{who}] wrote {doc}", file=sys.stderr)


def replace_readme_block(readme: str, begin: str, end: str, body: list[str]) -> None:
    """Replace the README's block between the ``begin`` and ``end`` marker
    lines (kept) with ``body``: the block a report script owns. A README
    without both markers is an error that names them."""
    with open(readme) as f:
        text = f.read()
    if begin not in text or end not in text:
        raise SystemExit(f"{readme} has no {begin} ... {end} block to write")
    a, b = text.index(begin), text.index(end) + len(end)
    with open(readme, "w") as f:
        f.write(text[:a] + "\n".join([begin, *body, end]) + text[b:])


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def table(points: list[dict], key: str, key_header: str) -> list[str]:
    rows = [f"| {key_header} | policy | JCT mean s | JCT p90 s | TTFT mean s | hit share | recomputed Mtok "
            f"| pins (handoff / expired / pressure) | preempt | gap closed |",
            "|---:|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    for p in sorted(points, key=lambda p: (p[key], ARM_ORDER.index(p["arm"]))):
        gap = "" if p.get("gap_closed") is None else f"{p['gap_closed']:+.1%}"
        pins = (f"{p['pins_created']} ({p['pins_handed_over']} / {p['pins_expired']} / "
                f"{p['pins_released_under_pressure']})" if p["arm"] in PIN_ARMS else "")
        rows.append(
            f"| {p[key]:g} | {p['arm']} | {p['jct_mean_s']:.1f} | {p['jct_p90_s']:.1f} | {p['ttft_mean_s']:.2f} "
            f"| {p['hit_share']:.1%} | {p['recomputed_tokens'] / 1e6:.1f} | {pins} | {p['preemptions']} | {gap} |"
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--step-model", default="aiconfigurator", choices=["roofline", "aiconfigurator"])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "sim"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "simulator.md"))
    ap.add_argument("--seed", default="7")
    ap.add_argument("--workers", default=str(os.cpu_count() or 1))
    args = ap.parse_args()
    sections: list[str] = []
    commits: set[str] = set()  # of the code that ran the points

    def ran(argv: list[str]) -> list[dict]:
        """The points of ``run(argv)``'s results.json; notes its commit."""
        run(argv)
        results = load(os.path.join(argv[argv.index("--out") + 1], "results.json"))
        commits.add(results.get("commit") or "not recorded")
        return results["points"]

    for profile in PROFILES:
        rate_dir = os.path.join(args.out, profile, "rate")
        common = ["--profile", profile, "--step-model", args.step_model, "--seed", args.seed,
                  "--workers", args.workers]
        rate_cmd = [*common, "--policies", ARMS, "--sweep-rate", RATES[profile], "--out", rate_dir]
        rate_points = ran(rate_cmd)
        fcfs = sorted((p for p in rate_points if p["arm"] == "fcfs"), key=lambda p: p["rate_per_min"])
        high = next((p["rate_per_min"] for p in fcfs if p["hit_share"] < 0.5), fcfs[-1]["rate_per_min"])
        blocks = rate_points[0]["num_blocks"]
        # Low load (the difference from FCFS) and the offload hybrid at the
        # high load: points of their own.
        low_dir = os.path.join(args.out, profile, "low")
        # Sessions rarely overlap at this rate, so the first LOW_SESSIONS
        # show the same as all 50 at less cost (little batching: many steps).
        low_cmd = [*common, "--policies", ARMS, "--rate", f"{LOW_RATE:g}", "--sessions", str(LOW_SESSIONS),
                   "--out", low_dir]
        low_points = ran(low_cmd)
        off_dir = os.path.join(args.out, profile, "offload")
        off_cmd = [*common, "--policies", OFFLOAD_ARMS, "--rate", f"{high:g}", "--out", off_dir]
        # Same jobs and arrivals as the load sweep's point at this rate: its
        # fcfs and oracle bound the offload arm's gap closed.
        ref = {p["arm"]: p for p in rate_points if p["rate_per_min"] == high}
        off_points = [p for p in rate_points if p["rate_per_min"] == high and p["arm"] in ("fcfs", "continuum", "oracle")]
        for p in ran(off_cmd):
            p["gap_closed"] = gap_closed(p["jct_mean_s"], ref["fcfs"]["jct_mean_s"], ref["oracle"]["jct_mean_s"])
            off_points.append(p)
        pool_section: list[str] = []
        pool_cmd: list[str] = []
        if profile == PROFILES[0]:  # the crossover on the first profile only (time)
            pool_dir = os.path.join(args.out, profile, "pool")
            pool_cmd = [*common, "--policies", "fcfs,continuum,oracle", "--rate", f"{high:g}",
                        "--sweep-blocks", POOLS, "--out", pool_dir]
            pool_points = ran(pool_cmd)
            plot = os.path.relpath(os.path.join(pool_dir, "sweep_pool.png"), os.path.dirname(args.doc))
            pool_section = [
                f"### Pool sweep at {high:g} sessions/min (fraction of the profile's pool)",
                "",
                *table(pool_points, "pool_fraction", "pool fraction"),
                "",
                f"![pool sweep]({plot})",
                "",
            ]
        at = lambda r: [p for p in rate_points if p["rate_per_min"] == r]  # noqa: E731
        low = LOW_RATE
        lowp = {p["arm"]: p for p in low_points}
        diff = {a: (lowp[a]["jct_mean_s"] / lowp["fcfs"]["jct_mean_s"] - 1) for a in lowp}
        sections += [
            f"## {profile}",
            "",
            f"KV pool {int(blocks):,} blocks of 16 tokens; sessions arrive as a Poisson process (seed {args.seed}).",
            "",
            f"### High load: {high:g} sessions/min, the lowest swept rate where FCFS's hit share is below 50%",
            "",
            *table(at(high), "rate_per_min", "sessions/min"),
            "",
            f"### Low load: {low:g} sessions/min, the first {LOW_SESSIONS} sessions (difference from FCFS in mean JCT: "
            + ", ".join(f"{a} {d:+.2%}" for a, d in diff.items() if a != "fcfs") + ")",
            "",
            *table(low_points, "rate_per_min", "sessions/min"),
            "",
            f"### Pinning and host offload at {high:g} sessions/min ({OFFLOAD_GIB:g} GiB of host memory per GPU)",
            "",
            "`continuum-offload`: the plugin's connector (stores what leaves a pin or a freed turn, synchronous",
            "copies priced in the step); `native-offload`: vLLM's own `OffloadingConnector` as",
            "`--kv-offloading-size` sets it up (write-through stores of every computed block, LRU host store,",
            "asynchronous copies: a request waits for its load, compute does not), under the stock scheduler;",
            "`continuum-native-offload`: the same under Continuum.",
            "",
            *table(off_points, "rate_per_min", "sessions/min"),
            "",
            "### Load sweep",
            "",
            *table(rate_points, "rate_per_min", "sessions/min"),
            "",
            f"![load sweep]({os.path.relpath(os.path.join(rate_dir, 'sweep_rate.png'), os.path.dirname(args.doc))})",
            "",
            *pool_section,
            "Commands:",
            "",
            "```",
            "python -m benchmarks.simulate " + " ".join(rate_cmd),
            "python -m benchmarks.simulate " + " ".join(low_cmd),
            "python -m benchmarks.simulate " + " ".join(off_cmd),
            *(["python -m benchmarks.simulate " + " ".join(pool_cmd)] if pool_cmd else []),
            "```",
            "",
        ]
    commit = ", ".join(sorted(commits))
    header = [
        "# H100-scale replay of the Claude Code trace subset",
        "",
        "Written by `python scripts/sim_report.py"
        + (f" --step-model {args.step_model}" if args.step_model != "aiconfigurator" else "")
        + "` (arms run 2 at a time: `--workers 2`); every figure below comes from the simulator's results.json files, none is copied by hand.",
        f"Step model: `{args.step_model}` (see docs/step_models.md); workload: the 50 shipped sessions of",
        "benchmarks/data/claude_code_traces (main conversations, think time capped at 120 s, sessions end",
        "at the 128k context limit). Times are virtual seconds on the simulated GPU. Policies see the same",
        "arrivals. `gap closed` is the share of the FCFS→oracle mean-JCT gap; the oracle is vLLM's stock",
        "scheduler over a pool that never evicts (the bound).",
        "Client: the simulator's `tagged` profile (every request carries the plugin's job metadata, `is_last_step`",
        "and the tool's name, and each prompt continues the last verbatim): what the plugin gets from a client",
        "that tags its requests. What clients that send only a session header, AIPerf's rebuilt prompts or",
        "stripped reasoning get: docs/retention_clients.md (roofline step model).",
        f"Code: commit `{commit}` ran every point below (the simulator records it in each results.json).",
        "",
    ]
    os.makedirs(os.path.dirname(args.doc), exist_ok=True)
    with open(args.doc, "w") as f:
        f.write("\n".join(header + sections))
    print(f"[sim_report] wrote {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
