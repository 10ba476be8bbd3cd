"""Write docs/retention_clients.md: what real clients get from the plugin, simulated.

The plugin's own figures were long measured on requests that carried every
hint it documents. Real clients send less: Claude Code and AIPerf a session
header, agents' replies as text, chat templates that drop earlier reasoning,
prompts rebuilt from hash blocks. ``benchmarks/sim/clients.py`` replays each
of those as a client profile over the same arrivals:

* ``tagged``: ``job_id``, ``is_last_step`` and the tool name on every request;
* ``headers-only``: a session id and replies the plugin has to parse;
* ``aiperf``: a session id, each prompt rebuilt from hash blocks (the previous
  prompt's partial tail and the reply are not re-sent);
* ``reasoning``: ``headers-only`` whose replies open with reasoning that the
  next prompts drop;
* at the high loads, ``aiperf-last-step``: ``aiperf`` with each
  conversation's last request flagged ``is_last_step`` -- how much of
  ``aiperf``'s shortfall is the session end it never sends;
* ``no-header`` and ``aiperf-no-header``: ``headers-only``'s and
  ``aiperf``'s requests with no session id at all (implicit jobs), in points
  of their own;
* on workloads with sub-agents, at the high load and every seed, the signal
  profiles (``scripts/clients_signals.py``): ``headers-only``'s requests with
  the session end, sub-agents' own session ids, or both added -- which of
  the signals it does not send its shortfall to ``tagged`` comes from.

For each GPU profile (H100 + Llama-3.1-8B; 4x H100 + Llama-3.1-70B, TP4) and
each workload (the shipped Claude Code trace subset with its sub-agents and a
shared system prompt; the ``spread`` synthetic preset, session sizes and
lengths log-normal), at a high load (FCFS's hit share below 50%) and a low
one, this runs FCFS, Continuum and the oracle under every profile, plus plain
admission at fixed caps (the stock scheduler behind a cap of K sessions in
flight) at the high load, over the tagged client's prompts and over those of
the profiles whose prompts differ (``CAP_CLIENTS``), and checks the bars of
the "Real traffic" issue from the tables' own figures:

* every profile within 5 points of gap share of ``tagged``, never slower than
  FCFS, ahead of the best fixed cap over the prompts it sends; at low load
  within 1% of FCFS;
* on the spread preset at the high load, ``headers-only`` at >= 2x lower
  mean JCT than FCFS and >= 75% of the FCFS -> oracle gap;
* the high loads again at two more arrival seeds (``SEEDS``): every
  profile's mean gap share over the seeds within 5 points of ``tagged``'s
  mean, and faster than FCFS at every seed (one seed's verdict can turn on a
  TTL decided milliseconds apart); the caps and the no-header profiles
  too, each profile ahead of the best cap (chosen per seed) on the mean of
  its ratios to it.

The profiles and the bars are in ``scripts/clients_bars.py``, the seed
sections in ``scripts/clients_seeds.py``. Every figure comes from the
results.json files this script makes with
``benchmarks.simulate`` (a point whose results.json holds the same command is
reused, so an interrupted run resumes); the commands are printed at the end.

    python scripts/clients_report.py [--step-model roofline] [--out docs/sim/clients]

(About an hour on 2 cores, most of it the traces' high loads, and about two hours more for
the extra seeds.)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from scripts.clients_bars import (  # noqa: E402
    CAP_CLIENTS,
    CAP_ORDER,
    CLIENT_PROFILES,
    LAST_STEP_PROFILE,
    LOW_LOAD_TOLERANCE,
    NO_HEADER_PROFILES,
    SPREAD_GAP,
    SPREAD_SPEEDUP,
    TAGGED_TOLERANCE,
    best_cap,
)
from scripts.clients_bars import check as _check  # noqa: E402
from scripts.clients_seeds import seed_lines, seed_summary  # noqa: E402
from scripts.clients_signals import CLAUDE_CODE_PROFILE, SIGNAL_PROFILES, signal_lines, signal_summary  # noqa: E402
from scripts.sim_report import SimPoints, replace_readme_block  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# README.md's block this script owns (the summary of the page it writes).
README_BEGIN = "<!-- clients-report: written by scripts/clients_report.py -->"
README_END = "<!-- /clients-report -->"
CLIENT_ARMS = ("fcfs", "continuum", "oracle")
CAPS = "fcfs-cap8,fcfs-cap12,fcfs-cap16,fcfs-cap24"
PROFILES = ("h100-llama8b", "h100-llama70b-tp4")
# The seed of every point's arrivals, and the workloads whose high loads run
# again at the other seeds: the trace subset has 50 sessions, and there a TTL
# decided a few milliseconds apart reorders every later turn, so one seed's
# gap shares move by points between profiles that send the same prompts.
# The 5-point bar is checked on the mean over the seeds as well. Where a
# workload is in ``SEEDED_CAPS`` the fixed caps and the no-header profiles
# run at every seed too, and the best-cap bar is checked on the mean (every
# seeded workload: on the spread preset the caps come within a few percent
# of Continuum, and on the traces the other seeds are lighter loads, where
# a cap costs less).
SEEDS = (7, 8, 9)
SEEDED_WORKLOADS = ("trace", "spread")
SEEDED_CAPS = ("trace", "spread")

@dataclass(frozen=True)
class Workload:
    """One workload of the report: its simulate arguments and its loads
    (sessions/min) per GPU profile, low and high."""

    key: str
    title: str
    argv: tuple[str, ...]
    loads: dict[str, tuple[float, float]]
    low_sessions: int | None = None  # the low load replays only the first N sessions


WORKLOADS = (
    # The traces' high loads are docs/simulator.md's sweep's lowest rates
    # where FCFS's hit share falls below 50% (as in docs/retention.md).
    Workload("trace", "Claude Code trace subset, sub-agents and a shared system prompt",
             ("--subagents", "--shared-system"),
             {"h100-llama8b": (0.1, 1.0), "h100-llama70b-tp4": (0.1, 0.5)}, low_sessions=20),
    # spread: 60 sessions; the high load is where FCFS's hit share falls
    # below 50% on each profile's default pool.
    Workload("spread", "Spread synthetic agent (60 sessions, task log-normal around 14k tokens, 3-40 turns)",
             ("--workload", "spread", "--shared-system", "--sessions", "60"),
             {"h100-llama8b": (1.2, 15.0), "h100-llama70b-tp4": (1.2, 15.0)}),
)


def client_table(points: list[dict], caps: list[dict], clients: tuple[str, ...] = CLIENT_PROFILES) -> list[str]:
    """One row per (client profile of ``clients``, policy), then the fixed
    caps: each profile's own FCFS and oracle give ``vs FCFS`` and ``gap
    closed``; ``vs tagged`` compares a policy with itself under the tagged
    client (``points`` holds the tagged client's too)."""
    rows = ["| client | policy | JCT mean s | vs FCFS | vs tagged | JCT p90 s | TTFT mean s | hit share "
            "| pins (handoff / expired / pressure) | gap closed |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    by = {(p["client"], p["arm"]): p for p in points}
    for client in clients:
        fcfs = by[(client, "fcfs")]
        for arm in CLIENT_ARMS:
            p, tagged = by[(client, arm)], by[("tagged", arm)]
            pins = "" if arm != "continuum" else (
                f"{p['pins_created']} ({p['pins_handed_over']} / {p['pins_expired']} / "
                f"{p['pins_released_under_pressure']})")
            gap = "" if p.get("gap_closed") is None else f"{p['gap_closed']:+.1%}"
            rows.append(
                f"| {client} | {arm} | {p['jct_mean_s']:.1f} | {fcfs['jct_mean_s'] / p['jct_mean_s']:.2f}x "
                f"| {p['jct_mean_s'] / tagged['jct_mean_s'] - 1:+.1%} | {p['jct_p90_s']:.1f} "
                f"| {p['ttft_mean_s']:.2f} | {p['hit_share']:.1%} | {pins} | {gap} |")
    for p in sorted(caps, key=lambda p: (CAP_ORDER.index(p["client"]), int(p["arm"].removeprefix("fcfs-cap")))):
        fcfs, oracle = by[(p["client"], "fcfs")]["jct_mean_s"], by[(p["client"], "oracle")]["jct_mean_s"]
        gap = (fcfs - p["jct_mean_s"]) / (fcfs - oracle) if fcfs > oracle else None
        rows.append(
            f"| {p['client']} | {p['arm']} | {p['jct_mean_s']:.1f} | {fcfs / p['jct_mean_s']:.2f}x | "
            f"| {p['jct_p90_s']:.1f} | {p['ttft_mean_s']:.2f} | {p['hit_share']:.1%} | "
            f"| {'' if gap is None else f'{gap:+.1%}'} |")
    return rows


def _bars(c: dict, fcfs: dict, tagged_gap: float, cap: dict) -> list[str]:
    """The high-load bars for Continuum's point ``c`` under one client:
    within 5 points of ``tagged_gap``, never slower than that client's
    ``fcfs``, ahead of ``cap`` (the best fixed cap over its prompts); each
    stated with its figure."""
    return [
        _check(c["gap_closed"] >= tagged_gap - TAGGED_TOLERANCE,
               f"gap {c['gap_closed']:+.1%} against tagged's {tagged_gap:+.1%} (within 5 points)"),
        _check(c["jct_mean_s"] <= fcfs["jct_mean_s"],
               f"{fcfs['jct_mean_s'] / c['jct_mean_s']:.2f}x FCFS (never slower)"),
        _check(c["jct_mean_s"] < cap["jct_mean_s"],
               f"{c['jct_mean_s'] / cap['jct_mean_s'] - 1:+.1%} against the best cap (ahead)"),
    ]


def high_verdict(points: list[dict], caps: list[dict], spread: bool,
                 clients: tuple[str, ...] = CLIENT_PROFILES) -> list[str]:
    """The high-load bars, one line per client profile of ``clients``, each
    check stated with the figure it rests on and whether it holds."""
    by = {(p["client"], p["arm"]): p for p in points}
    tagged_cap = best_cap(caps, "tagged")
    tagged_gap = by[("tagged", "continuum")]["gap_closed"]
    others = [f"`{cap['arm']}` at {cap['jct_mean_s']:.1f} s over `{c}`'s"
              for c in CAP_CLIENTS if any(p["client"] == c for p in caps) for cap in [best_cap(caps, c)]]
    lines = [f"FCFS's hit share {by[('tagged', 'fcfs')]['hit_share']:.1%}; the best fixed cap is "
             f"`{tagged_cap['arm']}` at {tagged_cap['jct_mean_s']:.1f} s over the tagged client's prompts"
             + ("" if not others else "; " + ", ".join(others)) + "."]
    for client in clients:
        c, fcfs = by[(client, "continuum")], by[(client, "fcfs")]
        checks = _bars(c, fcfs, tagged_gap, best_cap(caps, client))
        if spread and client == "headers-only":
            checks += [
                _check(fcfs["jct_mean_s"] / c["jct_mean_s"] >= SPREAD_SPEEDUP,
                       f"{fcfs['jct_mean_s'] / c['jct_mean_s']:.2f}x lower mean JCT (>= 2x)"),
                _check(c["gap_closed"] >= SPREAD_GAP, f"{c['gap_closed']:.1%} of the gap (>= 75%)"),
            ]
        lines.append(f"- `{client}` continuum: " + "; ".join(checks) + ".")
    return lines


def last_step_lines(points: list[dict], last_points: list[dict], caps: list[dict]) -> list[str]:
    """``aiperf`` against ``aiperf-last-step`` (the same requests, the last
    of each conversation flagged): a table row each for Continuum, and the
    high-load bars for the flagged client, each stated with its figure. The
    share of ``aiperf``'s shortfall to ``tagged`` that the flag recovers is
    what not knowing when a session ends costs."""
    by = {(p["client"], p["arm"]): p for p in [*points, *last_points]}
    tagged, plain, flagged = (by[(c, "continuum")] for c in ("tagged", "aiperf", LAST_STEP_PROFILE))
    fcfs = by[(LAST_STEP_PROFILE, "fcfs")]
    rows = ["| client | policy | JCT mean s | vs FCFS | vs tagged | TTFT mean s | hit share | gap closed |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for p in (plain, flagged):
        f = by[(p["client"], "fcfs")]
        rows.append(f"| {p['client']} | continuum | {p['jct_mean_s']:.1f} | {f['jct_mean_s'] / p['jct_mean_s']:.2f}x "
                    f"| {p['jct_mean_s'] / tagged['jct_mean_s'] - 1:+.1%} | {p['ttft_mean_s']:.2f} "
                    f"| {p['hit_share']:.1%} | {p['gap_closed']:+.1%} |")
    shortfall = tagged["gap_closed"] - plain["gap_closed"]
    gained = flagged["gap_closed"] - plain["gap_closed"]
    if shortfall <= 0:
        recovered = ""
    elif gained >= shortfall:  # a share over 100% would read as a typo
        recovered = (f"; the flag closes `aiperf`'s {shortfall * 100:.1f}-point shortfall to `tagged` and passes "
                     f"it by {(gained - shortfall) * 100:.1f} points")
    else:
        recovered = (f"; the flag recovers {gained / shortfall:.0%} of `aiperf`'s {shortfall * 100:.1f}-point "
                     "shortfall to `tagged`")
    checks = _bars(flagged, fcfs, tagged["gap_closed"], best_cap(caps, LAST_STEP_PROFILE))
    return [*rows, "", f"- `{LAST_STEP_PROFILE}` continuum: " + "; ".join(checks) + recovered + "."]


def summary_row(title: str, points: list[dict], caps: list[dict], last_points: list[dict] = (),
                no_header_points: list[dict] = ()) -> str:
    """README's row for a high-load point: per client profile (then
    ``aiperf-last-step``, from ``last_points``, and the clients without a
    session id, from ``no_header_points``), Continuum's share of the gap and
    its speed-up over FCFS, next to the best cap's."""
    by = {(p["client"], p["arm"]): p for p in [*points, *last_points, *no_header_points]}
    fcfs, oracle = by[("tagged", "fcfs")]["jct_mean_s"], by[("tagged", "oracle")]["jct_mean_s"]
    best = best_cap(caps, "tagged")
    cells = [f"{(fcfs - best['jct_mean_s']) / (fcfs - oracle):+.0%} ({best['arm']})"]
    for client in (*CLIENT_PROFILES, *((LAST_STEP_PROFILE,) if last_points else ()),
                   *(NO_HEADER_PROFILES if no_header_points else ())):
        c, f = by[(client, "continuum")], by[(client, "fcfs")]
        cells.append(f"{c['gap_closed']:+.0%} ({f['jct_mean_s'] / c['jct_mean_s']:.2f}x)")
    return f"| {title} | {by[('tagged', 'fcfs')]['hit_share']:.0%} | " + " | ".join(cells) + " |"


def write_readme_block(readme: str, rows: list[str], doc: str, seed_rows: list[str] = (),
                       signal_rows: list[str] = ()) -> None:
    """Replace README's block between the markers with ``rows``' table,
    then ``seed_rows`` (the mean gap shares over the seeds, where points ran
    at several) and ``signal_rows`` (the signal profiles' mean gap shares)."""
    rel = os.path.relpath(doc, os.path.dirname(os.path.abspath(readme)))
    replace_readme_block(readme, README_BEGIN, README_END, [
        "Simulated (vLLM's real scheduler on a virtual clock, roofline step model), at the high load of",
        "each workload (FCFS's hit share below 50%): Continuum's share of the FCFS -> oracle gap in mean JCT",
        "and its speed-up over FCFS under each client profile, next to plain admission at its best fixed",
        "cap. `aiperf, last turn flagged`: AIPerf's requests with `is_last_step: true` on each session's",
        "last one (AIPerf's prose replies never say a session ended; its per-turn `extra` can carry the",
        "flag). `no header`, `aiperf, no header`: `headers-only`'s and `aiperf`'s requests without any",
        "session id. On the traces the `aiperf` profiles send each sub-agent under a session id of its own,",
        "as AIPerf does; the others under its parent's, as Claude Code does.",
        "The traces' high loads ran at two more arrival seeds too (50 sessions: one seed's verdict can turn",
        "on a TTL decided milliseconds apart); the page checks the bars on the mean over the seeds as well.",
        f"Low loads, the seeds, the profiles and the commands: [{rel}]({rel}).",
        "",
        "| workload, GPU, sessions/min | FCFS hit share | best fixed cap | tagged | headers-only | aiperf | reasoning "
        "| aiperf, last turn flagged | no header | aiperf, no header |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        *([] if not seed_rows else [
            "", f"Mean gap closed over arrival seeds {', '.join(str(seed) for seed in SEEDS)} (the table's seed is the first):",
            "", *seed_rows]),
        *([] if not signal_rows else [
            "", "Which signal `headers-only` lacks costs what on the traces: its requests with `is_last_step: true`",
            "on each conversation's last (`headers-last`), with each sub-agent under a session id of its own",
            "(`headers-own`), with both (`headers-last-own`); and what Claude Code sends (`claude-code`: each",
            "sub-agent's own id beside the session id); mean gap closed over the same seeds:",
            "", *signal_rows]),
    ])


def low_verdict(points: list[dict], clients: tuple[str, ...] = CLIENT_PROFILES) -> list[str]:
    by = {(p["client"], p["arm"]): p for p in points}
    out = []
    for client in clients:
        diff = by[(client, "continuum")]["jct_mean_s"] / by[(client, "fcfs")]["jct_mean_s"] - 1
        out.append(f"- `{client}` continuum: " + _check(abs(diff) <= LOW_LOAD_TOLERANCE,
                                                         f"{diff:+.2%} mean JCT against FCFS (within 1%)") + ".")
    return out


def report_arguments(description: str, out: str, doc: str) -> argparse.ArgumentParser:
    """The arguments of a report over this module's workloads and profiles."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--step-model", default="roofline", choices=["roofline", "aiconfigurator"])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "sim", out),
                    help="directory for the simulator's results (default: %(default)s)")
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", doc),
                    help="the document to write (default: %(default)s)")
    ap.add_argument("--profiles", default=",".join(PROFILES),
                    help="GPU profiles to report, comma-separated (default: %(default)s)")
    ap.add_argument("--workloads", default=",".join(w.key for w in WORKLOADS),
                    help="workloads to report, comma-separated (default: %(default)s)")
    return ap


def seed_common(step_model: str, seed: int) -> list[str]:
    """The simulate arguments every point of the report shares, at ``seed``."""
    return ["--step-model", step_model, "--seed", str(seed), "--workers", "2"]


def main() -> int:
    ap = report_arguments(__doc__.split("\n\n")[0], "clients", "retention_clients.md")
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"),
                    help="README whose clients-report block gets the summary (default: %(default)s)")
    args = ap.parse_args()
    profiles = [p for p in args.profiles.split(",") if p]
    wanted = set(args.workloads.split(","))
    sims = SimPoints(seed_common(args.step_model, SEEDS[0]))
    summary: list[str] = []
    seed_summary_rows: list[str] = []
    signal_summary_rows: list[str] = []

    def point(out: str, argv: list[str]) -> list[dict]:
        return sims.point(os.path.join(args.out, out), argv)

    clients = ["--policies", ",".join(CLIENT_ARMS), "--client", ",".join(CLIENT_PROFILES)]
    no_header = ["--policies", ",".join(CLIENT_ARMS), "--client", ",".join(NO_HEADER_PROFILES)]
    lines = [
        "# What real clients get: client profiles in the simulator",
        "",
        "Written by `python scripts/clients_report.py` from the simulator's results.json files (none of",
        f"the figures is copied by hand). Step model: `{args.step_model}` (docs/step_models.md); times are",
        f"virtual seconds on the simulated GPU; every row of a table ran on the same arrivals (seed {SEEDS[0]}; the",
        "tables across arrival seeds at the others too). The",
        f"simulator ran on {platform.machine()} / CPU, which changes no figure (the replay is deterministic).",
        "",
        "Client profiles (`benchmarks/sim/clients.py`): `tagged` the job metadata the plugin documents",
        "(`job_id`, `is_last_step` on every request, the tool name), replies re-sent verbatim;",
        "`headers-only` only a session id (what `X-Session-ID` sets), replies are tokenizer text the",
        "plugin parses (prose ending in a Hermes `<tool_call>` on a tool turn, prose on a final answer);",
        "`aiperf` a session id, each prompt the previous one's full hash blocks plus fresh content (its",
        "partial block and the reply are not re-sent), replies prose; `reasoning` `headers-only` whose",
        "replies open with a reasoning section that later prompts drop. On the traces every profile's",
        "prompts are hash-block prompts (the trace cannot say more), so there the profiles differ by",
        "metadata and replies; sub-agents run as conversations of their own (`--subagents`), under the",
        "parent's session id (Claude Code sends its session header on its `Task` sub-agents' requests),",
        "except in the AIPerf profiles: AIPerf's `weka_trace` loader replays each sub-agent as a child",
        "conversation with a fresh correlation id of its own, which is what `--session-header` sends.",
        "`fcfs-capK` is plain admission (the stock scheduler behind a cap of K",
        "sessions in flight, as a client's own concurrency limit sets it: AIPerf's `--concurrency`; the",
        "wait counts in JCT), run with the tagged client's prompts and with `aiperf`'s and `reasoning`'s,",
        "whose prompts differ from them; each profile is held to the best cap over the prompts it sends",
        "(`headers-only` and `no-header` send the tagged client's, the other AIPerf profiles `aiperf`'s).",
        "`gap closed` is the share of the profile's own FCFS -> oracle mean-JCT gap.",
        "",
        "`aiperf`'s replies are prose (what a model answers to AIPerf's synthetic prompts), so nothing it",
        "sends says when a session is over: the plugin keeps counting a session that has ended until its",
        "quiet horizon passes. At each high load `aiperf-last-step` replays `aiperf`'s requests with",
        "`is_last_step: true` on each conversation's last one and nothing else added: AIPerf knows its",
        "final turns (`is_final_turn`), and its trace datasets' per-turn `extra` field (merged into the",
        "request body) can carry the flag; its `weka_trace` replay sends none. FCFS and the oracle do not",
        "read it. The difference between the two rows is what the missing session end costs.",
        "",
        "`no-header` and `aiperf-no-header` send `headers-only`'s and `aiperf`'s requests without any",
        "session id (AIPerf with its default `X-Session-Affinity` header off, a proxy dropping headers): the",
        "plugin has only the prompts to go by. An untagged turn is an implicit job's next turn when its",
        "prompt continues that turn's prompt by shared prefix (docs/clients.md); an answer continued so",
        "is a chat's, kept like a session's, and where the scope's answers are seen to come back (once 8",
        "were), a chat starts at its first answer; an untagged request that continues nothing passes the",
        "admission gate as a newcomer. They run on the same arrivals, in points of their own.",
        "",
        "On the traces (sub-agents), `headers-last`, `headers-own` and `headers-last-own` replay",
        "`headers-only`'s requests with one signal it lacks added: `is_last_step: true` on each",
        "conversation's last request (a batch harness knows its end; a chat user's session has none),",
        "each sub-agent under a session id of its own instead of its parent's, or both. `claude-code`",
        "replays them with what Claude Code 2.1.328 sends on a sub-agent's requests besides the parent's",
        "session id (measured against a recording server, docs/clients.md): the sub-agent's own id",
        "(`x-claude-code-agent-id`, the plugin's `agent_id`), which keeps the sub-agent's conversation",
        "apart and ends its job at its answer. They run",
        "Continuum only, at every seed; their gap shares are taken against the tagged client's FCFS and",
        "oracle, which read no metadata and replay the same prompts.",
        "",
    ]
    for wl in WORKLOADS:
        if wl.key not in wanted:
            continue
        for prof in profiles:
            low, high = wl.loads[prof]
            base = [*wl.argv, "--profile", prof]
            high_argv = [*base, "--rate", f"{high:g}"]
            pts = point(f"{wl.key}-{prof}-high", [*high_argv, *clients])
            caps = point(f"{wl.key}-{prof}-caps", [*high_argv, "--policies", CAPS])
            caps += point(f"{wl.key}-{prof}-caps-clients",
                          [*high_argv, "--policies", CAPS, "--client", ",".join(CAP_CLIENTS)])
            last_pts = point(f"{wl.key}-{prof}-last-step",
                             [*high_argv, "--policies", ",".join(CLIENT_ARMS), "--client", LAST_STEP_PROFILE])
            low_argv = [*base, "--rate", f"{low:g}"]
            if wl.low_sessions is not None:
                low_argv += ["--sessions", str(wl.low_sessions)]
            low_pts = point(f"{wl.key}-{prof}-low", [*low_argv, *clients])
            nh_pts = point(f"{wl.key}-{prof}-high-no-header", [*high_argv, *no_header])
            nh_low = point(f"{wl.key}-{prof}-low-no-header", [*low_argv, *no_header])
            seeded: dict[int, list[dict]] = {SEEDS[0]: pts}
            seeded_caps: dict[int, list[dict]] = {}
            signals: dict[int, list[dict]] = {}
            signal_argv = [*high_argv, "--policies", "continuum", "--client", ",".join(SIGNAL_PROFILES)]
            claude_argv = [*high_argv, "--policies", "continuum", "--client", CLAUDE_CODE_PROFILE]

            def signal_points(suffix: str, common: list[str] | None = None) -> list[dict]:
                """Continuum under the signal profiles and claude-code at one seed."""
                return [*sims.point(os.path.join(args.out, f"{wl.key}-{prof}-high-signals{suffix}"), signal_argv,
                                    common),
                        *sims.point(os.path.join(args.out, f"{wl.key}-{prof}-high-claude-code{suffix}"), claude_argv,
                                    common)]

            if "--subagents" in wl.argv:
                signals[SEEDS[0]] = signal_points("")
            if wl.key in SEEDED_WORKLOADS:
                for seed in SEEDS[1:]:
                    common = seed_common(args.step_model, seed)
                    seeded[seed] = sims.point(os.path.join(args.out, f"{wl.key}-{prof}-high-seed{seed}"),
                                              [*high_argv, *clients], common)
                    if wl.key in SEEDED_CAPS:
                        seeded_caps[seed] = sims.point(
                            os.path.join(args.out, f"{wl.key}-{prof}-caps-seed{seed}"),
                            [*high_argv, "--policies", CAPS], common)
                        seeded_caps[seed] += sims.point(
                            os.path.join(args.out, f"{wl.key}-{prof}-caps-clients-seed{seed}"),
                            [*high_argv, "--policies", CAPS, "--client", ",".join(CAP_CLIENTS)], common)
                        seeded[seed] += sims.point(
                            os.path.join(args.out, f"{wl.key}-{prof}-high-no-header-seed{seed}"),
                            [*high_argv, *no_header], common)
                    if signals:
                        signals[seed] = signal_points(f"-seed{seed}", common)
                if seeded_caps:
                    seeded[SEEDS[0]] = [*pts, *nh_pts]
                    seeded_caps[SEEDS[0]] = caps
                seed_summary_rows.append(seed_summary(f"{wl.key}, {prof}, {high:g}", seeded))
            summary.append(summary_row(f"{wl.key}, {prof}, {high:g}", pts, caps, last_pts, nh_pts))
            signal_seeds = {seed: [*seeded[seed], *signals[seed]] for seed in signals}
            if signal_seeds:
                signal_summary_rows.append(signal_summary(f"{wl.key}, {prof}, {high:g}", signal_seeds))
            lines += [
                f"## {wl.title}, {prof}, {high:g} sessions/min", "",
                *client_table(pts, caps), "",
                *high_verdict(pts, caps, spread=wl.key == "spread"), "",
                "The session end `aiperf` does not send (`aiperf-last-step`):", "",
                *last_step_lines(pts, last_pts, caps), "",
                *([] if len(seeded) == 1 else [
                    f"### Across arrival seeds ({', '.join(str(seed) for seed in seeded)})", "",
                    "The same sessions under each profile, arriving at the same rate in the order and at the",
                    "times each seed draws: the load differs by seed (FCFS's row), and where FCFS keeps most of",
                    "its hits the gap is short, so a point of it is a few seconds of mean JCT. Gap closed and",
                    "speed-up over the profile's own FCFS"
                    + ("; the caps and the no-header profiles ran at every seed too." if seeded_caps else
                       "; the caps and the no-header profiles ran at the first seed only."), "",
                    *seed_lines(seeded, seeded_caps or None, spread=wl.key == "spread"), ""]),
                *([] if not signals else [
                    f"### What `headers-only` does not send (seeds {', '.join(str(seed) for seed in signals)})", "",
                    "Continuum's gap closed under `headers-only`'s requests with the signals it lacks added",
                    "(against the tagged client's FCFS and oracle at each seed):", "",
                    *signal_lines(signal_seeds), ""]),
                f"### Low load: {low:g} sessions/min"
                + (f", the first {wl.low_sessions} sessions" if wl.low_sessions else ""), "",
                *client_table(low_pts, []), "",
                *low_verdict(low_pts), "",
                "### No session id at all", "",
                *client_table([*pts, *nh_pts], [], NO_HEADER_PROFILES), "",
                *high_verdict([*pts, *nh_pts], caps, spread=False, clients=NO_HEADER_PROFILES)[1:], "",
                f"At {low:g} sessions/min:", "",
                *client_table([*low_pts, *nh_low], [], NO_HEADER_PROFILES), "",
                *low_verdict(nh_low, NO_HEADER_PROFILES), "",
            ]
    sims.write(args.doc, lines, "clients_report")
    if args.readme:
        write_readme_block(args.readme, summary, args.doc, seed_summary_rows, signal_summary_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
