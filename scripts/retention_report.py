"""Write docs/retention.md: the priced retention rule and the admission gate
against FCFS, the paper's rule, vLLM's native offloading and the oracle.

Three workloads, every arm on the same arrivals in one run each:

1. the ``coding-agent`` synthetic preset (60 sessions sharing a 6k-token
   system prompt, first context ~14k, ~20 turns, tools 0.2-20 s) on the
   H100 + Llama-3.1-8B profile, at a high load (15 sessions/min: the
   working set about twice the pool) and a low one (1.2/min), and next to
   it the ``spread`` preset (the same agent with a task log-normal around
   14k tokens and 3-40 turns) at the same loads;
2. the shipped Claude Code trace subset on both profiles at a low load
   (0.1 sessions/min, the first 20 sessions) and a high one (the lowest
   rate of docs/simulator.md's sweep where FCFS's hit share is below 50%:
   1/min on the 8B profile, 0.5/min on the 70B one), with the
   plugin's own offload connector, vLLM's native offloading under both
   schedulers and plain admission at fixed caps at the high load.

What real clients send (session headers only, parsed replies, AIPerf's
hash-block prompts, reasoning dropped from history) is its own report:
``scripts/clients_report.py`` writes docs/retention_clients.md, which this
document links.

Every figure in the document comes from the results.json files this script
makes with ``benchmarks.simulate``; the commands are printed with them.

    python scripts/retention_report.py [--step-model roofline] [--out results/retention]

(About an hour on 2 cores.)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from scripts.sim_report import load, run  # noqa: E402
from vllm_continuum_plugin.config import ContinuumConfig  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORDER = ["fcfs", "continuum-paper", "continuum", "context_serve", "continuum-offload", "native-offload",
         "continuum-native-offload", "oracle"]
PIN_ARMS = ("continuum-paper", "continuum", "context_serve", "continuum-offload", "continuum-native-offload")


def _pins_cell(p: dict) -> str:
    """A point's pins: made (handed over / expired / released under pressure)."""
    if p["arm"] not in PIN_ARMS:
        return ""
    return (f"{p['pins_created']} ({p['pins_handed_over']} / {p['pins_expired']} / "
            f"{p['pins_released_under_pressure']})")


def _gap_cell(p: dict) -> str:
    return "" if p.get("gap_closed") is None else f"{p['gap_closed']:+.1%}"
OFFLOAD_POLICIES = ("continuum-offload", "continuum-native-offload")  # the plugin's policy with a CPU tier
SYNTHETIC_ARMS = "fcfs,continuum-paper,continuum,context_serve,oracle"
TRACE_ARMS = "fcfs,continuum-paper,continuum,native-offload,continuum-native-offload,oracle"
TRACE_HIGH_ARMS = "fcfs,continuum-paper,continuum,continuum-offload,native-offload,continuum-native-offload,oracle"
SYNTHETIC = "--workload coding-agent --shared-system --sessions 60"
SYNTHETIC_HIGH, SYNTHETIC_LOW = 15.0, 1.2  # sessions/min
# sessions/min per profile: low, high (FCFS's hit share below 50%). The
# loads between are docs/simulator.md's sweep.
TRACE_LOADS = {"h100-llama8b": (0.1, 1.0), "h100-llama70b-tp4": (0.1, 0.5)}
TRACE_LOW_SESSIONS = 20
# The defaults of the settings below (the report runs the plugin's defaults).
DEFAULTS = ContinuumConfig()
# Plain admission: fixed caps on sessions in flight, to find the best one.
SYNTHETIC_CAPS = "fcfs-cap10,fcfs-cap16,fcfs-cap22,fcfs-cap30"
TRACE_CAPS = "fcfs-cap8,fcfs-cap12,fcfs-cap16,fcfs-cap24"
PROFILES = ("h100-llama8b", "h100-llama70b-tp4")
# The settings the gate and the TTL rule read, each swept around its default
# on the synthetic high load (the rest of the constants are argued away in
# their docstrings: MIN_HOLD_PRICE only keeps a quotient finite).
SWEEP = {"max_ttl_s": (30, 60, 120), "admission_max_wait_s": (600, 1200, 2400)}
SWEEP_DEFAULTS = {key: getattr(DEFAULTS, key) for key in SWEEP}
SPREAD = "--workload spread --shared-system --sessions 60"


def _order(point: dict) -> tuple[int, int]:
    """Table order: ORDER, plain admission caps (by K) before the oracle."""
    arm = point["arm"]
    if arm in ORDER:
        return (ORDER.index(arm), 0)
    return (ORDER.index("oracle") - 1, int(arm.removeprefix("fcfs-cap")))


def table(points: list[dict]) -> list[str]:
    fcfs = next((p for p in points if p["arm"] == "fcfs"), None)
    rows = ["| policy | JCT mean s | vs FCFS | JCT p90 s | TTFT mean s | first wait max s | hit share "
            "| recomputed Mtok | pins (handoff / expired / pressure) | gap closed |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for p in sorted(points, key=_order):
        gap = _gap_cell(p)
        speedup = f"{fcfs['jct_mean_s'] / p['jct_mean_s']:.2f}x" if fcfs else ""
        pins = _pins_cell(p)
        rows.append(
            f"| {p['arm']} | {p['jct_mean_s']:.1f} | {speedup} | {p['jct_p90_s']:.1f} | {p['ttft_mean_s']:.2f} "
            f"| {p['first_wait_max_s']:.1f} | {p['hit_share']:.1%} | {p['recomputed_tokens'] / 1e6:.2f} | {pins} | {gap} |"
        )
    return rows


def low_load_line(points: list[dict]) -> str:
    fcfs = next(p for p in points if p["arm"] == "fcfs")["jct_mean_s"]
    diffs = ", ".join(f"{p['arm']} {p['jct_mean_s'] / fcfs - 1:+.2%}" for p in points if p["arm"] != "fcfs")
    return f"Difference from FCFS in mean JCT: {diffs}."


def bar_plot(points: list[dict], path: str, title: str, doc_dir: str) -> str:
    """Mean JCT per policy (bars, the table's order) with the oracle's as a
    line; returns the Markdown image line (path relative to ``doc_dir``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = sorted(points, key=_order)
    fig, ax = plt.subplots(figsize=(9, 3.6))
    colours = ["tab:grey" if p["arm"] == "fcfs" else "tab:green" if p["arm"] == "oracle"
               else "tab:blue" if p["arm"].startswith("continuum") or p["arm"] == "context_serve"
               else "tab:orange" for p in pts]
    ax.bar(range(len(pts)), [p["jct_mean_s"] for p in pts], color=colours)
    ax.set_xticks(range(len(pts)), [p["arm"] for p in pts], rotation=30, ha="right", fontsize=8)
    oracle = next((p["jct_mean_s"] for p in pts if p["arm"] == "oracle"), None)
    if oracle is not None:
        ax.axhline(oracle, color="tab:green", lw=0.8, ls="--")
    ax.set_ylabel("mean JCT (virtual s)")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    rel = os.path.relpath(path, doc_dir)
    return f"![{title}]({rel})"


def verdict(points: list[dict]) -> list[str]:
    """The issue's bar at a high-load point, from the table's own figures:
    the plugin's policy with a CPU tier closes >= 90% of the FCFS to oracle
    gap and beats native offloading (same tier) and the best fixed cap."""
    by = {p["arm"]: p for p in points}
    caps = [p for p in points if p["arm"].startswith("fcfs-cap")]
    best_cap = min(caps, key=lambda p: p["jct_mean_s"]) if caps else None
    native = by.get("native-offload")
    out = [f"FCFS hit share {by['fcfs']['hit_share']:.1%}."]
    for arm in OFFLOAD_POLICIES:
        p = by.get(arm)
        if p is None or p.get("gap_closed") is None:
            continue
        checks = [f"closes {p['gap_closed']:.1%} of the gap ({'>=' if p['gap_closed'] >= 0.9 else '<'} 90%)"]
        if native is not None:
            diff = p["jct_mean_s"] / native["jct_mean_s"] - 1
            checks.append(f"{diff:+.3%} mean JCT against native-offload "
                          f"({'beats' if diff < 0 else 'does not beat'} it)")
        if best_cap is not None:
            diff = p["jct_mean_s"] / best_cap["jct_mean_s"] - 1
            checks.append(f"{diff:+.1%} against the best fixed cap, {best_cap['arm']} "
                          f"({'beats' if diff < 0 else 'does not beat'} it)")
        out.append(f"`{arm}`: " + "; ".join(checks) + ".")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--step-model", default="roofline", choices=["roofline", "aiconfigurator"])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "sim", "retention"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "retention.md"),
                    help="the document to write (default: %(default)s)")
    args = ap.parse_args()
    common = ["--step-model", args.step_model, "--seed", "7", "--workers", "2"]
    sections: list[tuple[str, str, list[str]]] = []

    def point(title: str, out: str, argv: list[str]) -> list[dict]:
        argv = [*argv, *common, "--out", os.path.join(args.out, out)]
        run(argv)
        sections.append((title, "python -m benchmarks.simulate " + " ".join(argv), []))
        return load(os.path.join(args.out, out, "results.json"))["points"]

    def with_caps(points: list[dict], title: str, out: str, argv: list[str], caps: str) -> list[dict]:
        """``points`` plus the plain-admission arms of ``caps``, run apart
        (same arrivals, so FCFS and the oracle are the same) and given their
        share of that run's FCFS-to-oracle gap."""
        capped = point(title, out, [*argv, "--policies", caps])
        fcfs = next(p["jct_mean_s"] for p in points if p["arm"] == "fcfs")
        oracle = next(p["jct_mean_s"] for p in points if p["arm"] == "oracle")
        for p in capped:
            p["gap_closed"] = (fcfs - p["jct_mean_s"]) / (fcfs - oracle) if fcfs > oracle else None
        return points + capped

    lines: list[str] = []
    doc_dir = os.path.dirname(os.path.abspath(args.doc))
    syn_argv = [*SYNTHETIC.split(), "--rate", f"{SYNTHETIC_HIGH:g}"]
    spread_argv = [*SPREAD.split(), "--rate", f"{SYNTHETIC_HIGH:g}"]
    syn_high = point("synthetic-high", "synthetic-high", [*syn_argv, "--policies", SYNTHETIC_ARMS])
    syn_high = with_caps(syn_high, "synthetic-high-caps", "synthetic-high-caps", syn_argv, SYNTHETIC_CAPS)
    syn_low = point("synthetic-low", "synthetic-low",
                    [*SYNTHETIC.split(), "--rate", f"{SYNTHETIC_LOW:g}", "--policies", SYNTHETIC_ARMS])
    spread_high = point("spread-high", "spread-high", [*spread_argv, "--policies", SYNTHETIC_ARMS])
    spread_low = point("spread-low", "spread-low",
                       [*SPREAD.split(), "--rate", f"{SYNTHETIC_LOW:g}", "--policies", SYNTHETIC_ARMS])
    sweep: list[tuple[str, float, dict]] = []
    for key, values in SWEEP.items():
        for value in values:
            if value == SWEEP_DEFAULTS[key]:
                sweep.append((key, value, next(p for p in syn_high if p["arm"] == "continuum")))
                continue
            out = f"synthetic-high-{key}-{value:g}"
            got = point(out, out, [*syn_argv, "--policies", "continuum", "--continuum-set", f"{key}={value:g}"])
            sweep.append((key, value, got[0]))
    traces: dict[str, dict[str, list[dict]]] = {}
    for prof in PROFILES:
        low, high = TRACE_LOADS[prof]
        base = ["--profile", prof]
        argv = [*base, "--rate", f"{high:g}"]
        traces[prof] = {
            "high": with_caps(point(f"trace-{prof}", f"trace-{prof}", [*argv, "--policies", TRACE_HIGH_ARMS]),
                              f"trace-{prof}-caps", f"trace-{prof}-caps", argv, TRACE_CAPS),
            "low": point(f"trace-{prof}-low", f"trace-{prof}-low",
                         [*base, "--rate", f"{low:g}", "--sessions", str(TRACE_LOW_SESSIONS),
                          "--policies", TRACE_ARMS]),
        }

    lines += [
        "# Retention priced by the pool, and an admission gate",
        "",
        "Written by `python scripts/retention_report.py` from the simulator's results.json files (none of the",
        f"figures is copied by hand). Step model: `{args.step_model}` (docs/step_models.md); times are virtual",
        "seconds on the simulated GPU; every arm of a table ran on the same arrivals (seed 7) in one",
        f"command. The simulator ran on {platform.machine()} / {platform.processor() or 'CPU'}, which changes no",
        "figure (the replay is deterministic).",
        "",
        "Arms: `fcfs` vLLM's stock scheduler; `continuum-paper` the plugin with the paper's TTL rule as",
        "published and no admission gate (the plugin before this change); `continuum` / `context_serve` the",
        "plugin's defaults: `ttl_policy = \"priced\"` (a held second costs the pin's share of the pool times",
        "its usage) and the admission gate; `native-offload` vLLM's `OffloadingConnector` with 256 GiB of",
        "host memory per GPU under the stock scheduler, `continuum-native-offload` the same under Continuum",
        "(the gate counts the pool and the host tier together; a dropped context is priced as the reload that the plugin has",
        "measured from that tier, `estimators/tier_reload.py`); `continuum-offload` Continuum with the",
        "plugin's own offload connector (256 GiB); `fcfs-capK` plain admission, the stock scheduler behind a",
        "fixed cap of K sessions in flight (the rest wait first come, first served; the wait counts in",
        "their JCT), run apart on the same arrivals; `oracle` a pool that never evicts (the bound).",
        "`gap closed` is the share of the FCFS to oracle mean-JCT gap. `first wait max s` is the longest any",
        "job waited from its arrival until its first turn was scheduled (gate, cap and queue together); the",
        f"gate's documented bound on its own hold is `admission_max_wait_s` = {DEFAULTS.admission_max_wait_s:g} s.",
        "",
        f"## Synthetic coding agent, H100 + Llama-3.1-8B, {SYNTHETIC_HIGH:g} sessions/min (working set ~2x the pool)",
        "",
        *table(syn_high),
        "",
        bar_plot(syn_high, os.path.join(args.out, "synthetic-high.png"),
                 f"synthetic coding agent, h100-llama8b, {SYNTHETIC_HIGH:g} sessions/min", doc_dir),
        "",
        f"## The same at low load: {SYNTHETIC_LOW:g} sessions/min",
        "",
        *table(syn_low),
        "",
        low_load_line(syn_low),
        "",
    ]
    lines += [
        f"## Spread synthetic agent, {SYNTHETIC_HIGH:g} sessions/min: session sizes and lengths log-normal",
        "",
        "The `spread` preset: `coding-agent`'s system prompt, replies and tools, with a task log-normal",
        "around 14k tokens (sigma 0.5) and 3-40 turns (log-normal, median 12), on the same loads.",
        "",
        *table(spread_high),
        "",
        bar_plot(spread_high, os.path.join(args.out, "spread-high.png"),
                 f"spread synthetic agent, h100-llama8b, {SYNTHETIC_HIGH:g} sessions/min", doc_dir),
        "",
        f"### Low load: {SYNTHETIC_LOW:g} sessions/min",
        "",
        *table(spread_low),
        "",
        low_load_line(spread_low),
        "",
    ]
    syn_fcfs = next(p["jct_mean_s"] for p in syn_high if p["arm"] == "fcfs")
    syn_oracle = next(p["jct_mean_s"] for p in syn_high if p["arm"] == "oracle")
    lines += [
        f"## The settings the policy reads, swept: synthetic coding agent, {SYNTHETIC_HIGH:g} sessions/min (continuum, same arrivals)",
        "",
        "`max_ttl_s` bounds every TTL and is how long the gate counts a quiet job at most;",
        "`admission_max_wait_s` is how long the gate may hold a first turn.",
        "",
        "| setting | value | JCT mean s | gap closed | first wait max s |",
        "|---|---:|---:|---:|---:|",
        *[f"| `{key}` | {value:g}{' (default)' if value == SWEEP_DEFAULTS[key] else ''} | {p['jct_mean_s']:.1f} "
          f"| {(syn_fcfs - p['jct_mean_s']) / (syn_fcfs - syn_oracle):+.1%} | {p['first_wait_max_s']:.1f} |"
          for key, value, p in sweep],
        "",
    ]
    for prof in PROFILES:
        low, high = TRACE_LOADS[prof]
        lines += [
            f"## Claude Code trace subset, {prof}, high load: {high:g} sessions/min",
            "",
            *table(traces[prof]["high"]),
            "",
            bar_plot(traces[prof]["high"], os.path.join(args.out, f"trace-{prof}.png"),
                     f"Claude Code traces, {prof}, {high:g} sessions/min", doc_dir),
            "",
            *verdict(traces[prof]["high"]),
            "",
            f"### Low load: {low:g} sessions/min, the first {TRACE_LOW_SESSIONS} sessions",
            "",
            *table(traces[prof]["low"]),
            "",
            low_load_line(traces[prof]["low"]),
            "",
        ]
    lines += [
        "## What real clients send",
        "",
        "Every table above replays the `tagged` client (the job metadata the plugin documents). What a",
        "client that sends only a session header, AIPerf's hash-block prompts or reasoning dropped from",
        "history gets, on the traces and the spread preset on both profiles, is in",
        "[retention_clients.md](retention_clients.md) (`python scripts/clients_report.py`).",
        "",
    ]
    lines += ["## Commands", "", "```", *[cmd for _, cmd, _ in sections], "```", ""]
    with open(args.doc, "w") as f:
        f.write("\n".join(lines))
    print(f"[retention_report] wrote {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
