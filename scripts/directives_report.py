"""Write docs/retention_directives.md: client-declared retention against the
plugin's own decisions, simulated.

vLLM PR #38514 lets a client declare how long which token ranges of its
prompt should stay cached; its example client policy ("ContinuumPolicy")
declares the system prompt at priority 90, the conversation's history at 70
and the newest tail at 50, each for the think time before the next turn.
The simulator's ``directives`` client profile (``benchmarks/sim/clients.py``)
sends exactly that on every request (a session id, replies as text, and the
directives with the actual next think time: a client that knows its tool's
duration), and the plugin honours it (``vllm_continuum_plugin/retention.py``).
Four servers over the same arrivals, per GPU profile and workload, at the
high load of ``scripts/clients_report.py`` (FCFS's hit share below 50%):

* ``fcfs``: stock vLLM, which does not read the directives;
* ``directives alone``: what the PR gives on stock vLLM -- the directives
  honoured and nothing else: the plugin with its own pins off
  (``max_ttl_s=0``), no admission gate and FCFS order
  (``job_priority_window_s=0``), ``directives`` client;
* ``plugin alone``: the plugin's defaults, ``headers-only`` client (a session
  header, nothing declared);
* ``both``: the plugin's defaults, ``directives`` client (the directives
  replace the plugin's own hold for the blocks they cover);
* ``oracle``: a pool that never evicts.

Every figure comes from the results.json files this script makes with
``benchmarks.simulate`` (reused when a file holds the same command, so an
interrupted run resumes); the commands are printed at the end.

    python scripts/directives_report.py [--step-model roofline] [--out docs/sim/directives]

(About 20 minutes on 2 cores once scripts/clients_report.py has run.)
"""

from __future__ import annotations

import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.sim.clients import HISTORY_PRIORITY, SYSTEM_HOLD_S, SYSTEM_PRIORITY, TAIL_PRIORITY  # noqa: E402
from scripts.clients_report import CLIENT_ARMS, CLIENT_PROFILES, WORKLOADS, report_arguments  # noqa: E402
from scripts.sim_report import SimPoints  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The plugin reduced to honouring what clients declare: no pin of its own,
# no admission gate, turns in arrival order.
DIRECTIVES_ONLY = ("max_ttl_s=0", "admission=false", "job_priority_window_s=0")
# (row label, client profile, arm of that client's simulate run)
ROWS = (
    ("fcfs", "headers-only", "fcfs"),
    ("directives alone", "directives", "directives-only"),
    ("plugin alone", "headers-only", "continuum"),
    ("both", "directives", "continuum"),
    ("oracle", "headers-only", "oracle"),
)
# Stock vLLM reads neither a session header nor directives: FCFS and the
# oracle are the same runs under either client, so the headers-only client's
# (and the plugin alone) come from scripts/clients_report.py's high-load
# point, the same command, reused when its results.json exists.


def table(by: dict[tuple[str, str], dict]) -> list[str]:
    """One row per server; ``gap closed`` against the shared FCFS and oracle
    (stock vLLM reads neither the header nor the directives, so both clients'
    FCFS and oracle are the same runs)."""
    fcfs, oracle = by[("headers-only", "fcfs")]["jct_mean_s"], by[("headers-only", "oracle")]["jct_mean_s"]
    rows = ["| server | client | JCT mean s | vs FCFS | JCT p90 s | TTFT mean s | hit share "
            "| pins (handoff / expired / pressure) | gap closed |",
            "|---|---|---:|---:|---:|---:|---:|---|---:|"]
    for label, client, arm in ROWS:
        p = by[(client, arm)]
        pins = "" if arm in ("fcfs", "oracle") else (
            f"{p['pins_created']} ({p['pins_handed_over']} / {p['pins_expired']} / "
            f"{p['pins_released_under_pressure']})")
        gap = (fcfs - p["jct_mean_s"]) / (fcfs - oracle) if fcfs > oracle else None
        rows.append(f"| {label} | {client} | {p['jct_mean_s']:.1f} | {fcfs / p['jct_mean_s']:.2f}x "
                    f"| {p['jct_p90_s']:.1f} | {p['ttft_mean_s']:.2f} | {p['hit_share']:.1%} | {pins} "
                    f"| {'' if gap is None else f'{gap:+.1%}'} |")
    return rows


def verdict(by: dict[tuple[str, str], dict]) -> str:
    """Which is better, the client's directives or the plugin, and together."""
    jct = {label: by[(client, arm)]["jct_mean_s"] for label, client, arm in ROWS}
    alone = min(("directives alone", "plugin alone"), key=jct.__getitem__)
    other = "plugin alone" if alone == "directives alone" else "directives alone"
    both = jct["both"]
    best_alone = jct[alone]
    together = ("better than either alone" if both < best_alone * 0.995 else
                "no better than the better of the two" if both <= best_alone * 1.005 else
                f"{both / best_alone - 1:+.1%} behind {alone}")
    return (f"Better alone: **{alone}** ({best_alone:.1f} s against {jct[other]:.1f} s); "
            f"together ({both:.1f} s): {together}.")


def main() -> int:
    ap = report_arguments(__doc__.split("\n\n")[0], "directives", "retention_directives.md")
    ap.add_argument("--clients-out", default=os.path.join(ROOT, "docs", "sim", "clients"),
                    help="scripts/clients_report.py's results, whose headers-only arms are reused "
                         "(default: %(default)s)")
    args = ap.parse_args()
    profiles = [p for p in args.profiles.split(",") if p]
    wanted = set(args.workloads.split(","))
    sims = SimPoints(["--step-model", args.step_model, "--seed", "7", "--workers", "2"])

    def point(out: str, argv: list[str], root: str | None = None) -> list[dict]:
        return sims.point(os.path.join(root or args.out, out), argv)

    lines = [
        "# Declared retention: client directives, the plugin, and both",
        "",
        "Written by `python scripts/directives_report.py` from the simulator's results.json files (none",
        f"of the figures is copied by hand). Step model: `{args.step_model}` (docs/step_models.md); times are",
        "virtual seconds on the simulated GPU; every row of a table ran on the same arrivals (seed 7).",
        f"The simulator ran on {platform.machine()} / CPU, which changes no figure (the replay is deterministic).",
        "",
        f"The client's directives are vLLM PR #38514's example policy: the system prompt at priority {SYSTEM_PRIORITY}",
        f"for {SYSTEM_HOLD_S:g} s, the conversation's history at {HISTORY_PRIORITY} and the newest tail at "
        f"{TAIL_PRIORITY}, both for the think time",
        "before the next turn (the actual one: a client that knows its tool's duration); the last turn",
        "of a session declares its system prompt only. The servers: `fcfs` stock vLLM (reads no",
        "directive); `directives alone` the directives honoured and nothing else (the plugin with",
        f"`{'`, `'.join(DIRECTIVES_ONLY)}`: no pin of its own, no admission gate, FCFS order), i.e. what",
        "the PR gives on stock vLLM; `plugin alone` the plugin's defaults with a session header and no",
        "directive; `both` the plugin's defaults with the directives (they replace its own hold for the",
        "blocks they cover, and yield first to memory pressure); `oracle` a pool that never evicts.",
        "`gap closed` is the share of the FCFS -> oracle mean-JCT gap.",
        "",
    ]
    for wl in WORKLOADS:
        if wl.key not in wanted:
            continue
        for prof in profiles:
            high = wl.loads[prof][1]
            base = [*wl.argv, "--profile", prof, "--rate", f"{high:g}"]
            clients = point(f"{wl.key}-{prof}-high", [*base, "--policies", ",".join(CLIENT_ARMS),
                                                      "--client", ",".join(CLIENT_PROFILES)], args.clients_out)
            both = point(f"{wl.key}-{prof}", [*base, "--policies", "continuum", "--client", "directives"])
            alone = point(f"{wl.key}-{prof}-directives-only",
                          [*base, "--policies", "continuum", "--client", "directives",
                           *[a for s in DIRECTIVES_ONLY for a in ("--continuum-set", s)]])
            by = {(p["client"], p["arm"]): p for p in clients + both}
            by.update({(p["client"], "directives-only"): p for p in alone})
            lines += [f"## {wl.title}, {prof}, {high:g} sessions/min", "", *table(by), "", verdict(by), ""]
    sims.write(args.doc, lines, "directives_report")
    return 0


if __name__ == "__main__":
    sys.exit(main())
