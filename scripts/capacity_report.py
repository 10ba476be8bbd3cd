"""Write docs/capacity.md: agent sessions per GPU at an SLO, per policy,
with and without vLLM's own CPU offloading, simulated.

The question a user serving coding agents asks: how many sessions a minute
can one replica take before its agents slow down, and how many more with
the plugin? This sweeps the arrival rate on the shipped Claude Code traces
(sub-agents, the shared system prompt, the ``headers-only`` client: a
session header and nothing else: what Claude Code sends, less its sub-agents' ids) through vLLM's real
scheduler (``benchmarks.simulate``) and scores every arm at every rate by
SLO attainment: the share of sessions that keep

* **TTFT**: the 90th percentile of the session's own turns' TTFT at most
  ``--ttft-slo`` (2 s: an interactive agent's turn starts within 2 s nine
  times in ten), and
* **JCT**: the session's completion time at most ``--jct-slo`` (1.3) times
  the same session's completion time served alone (the oracle pool at
  ``SOLO_RATE``, where sessions barely overlap): at most 30% slower than an
  idle replica would serve it.

A rate is *sustained* when at least ``--attainment`` (90%) of its sessions
keep both (AgentX and AA-AgentPerf score at a percentile, not on every
session: with 40-60 sessions a single outlier would otherwise decide).
An arm's capacity is the largest rate of the sweep it sustains, with every
lower rate sustained too; reported as sessions/min per replica, as the mean
number of sessions in flight at that rate (Little's law: rate x mean JCT;
AA-AgentPerf's "concurrent agents") and as tokens per GPU-second (prompt
and output tokens served over the makespan per GPU; AgentX's form).

Arms: stock vLLM (``fcfs``); stock + vLLM's native CPU offloading
(``native-offload``); the plugin (``continuum``); the plugin + native
offloading (``continuum-native-offload``); the plugin + its own connector
(``continuum-offload``), and the same connector as a victim tier
(``continuum-offload-explicit``: ``store_mode: explicit`` stores only what
leaves a pin or a SLOW turn, so the host tier holds what the GPU pool no
longer does, where vLLM's native offloading and the connector's default
store a copy of every block as it is computed); plain admission at its best
fixed cap per rate (``fcfs-capK``); the plugin with prefetch
(``continuum-native-prefetch``, at ``PREFETCH_TIERS``); the oracle (a pool
that never evicts).
The offload arms run once per host tier (``--tiers``, GiB per GPU): 64 GiB
overflows at the higher rates, 256 GiB is what docs/retention.md measured.
Where the offload arms' capacities fall between two rates of the sweep,
finer rates (``--fine-rates``) run for them and the oracle; and where no
rate of the sweep is 1.5x stock + native offloading's capacity at a tier,
they and the oracle run at that rate too (``{profile}-offload-{tier}g-bar``),
so whether any policy can reach 1.5x is measured, not inferred. The
headline offload arms also run on other draws of sessions and arrivals
(``--check-seeds``, at ``SEED_CHECK_TIER`` GiB), so a capacity ratio is
shown to hold on other sessions, or not; and the TTFT split's arms run on
other draws at the tier ``TTFT_CHECK`` names (``--ttft-check-seeds``), the
TTFT bar judged on the draws' mean.

The arms and the scoring live in ``scripts/capacity_scoring.py``, the
page's sections in ``scripts/capacity_sections.py``; this script runs the
points and writes the page. Every figure comes from the results.json files
this script makes (reused when a file holds the same command, so an
interrupted run resumes); the commands are printed at the end.

    python scripts/capacity_report.py [--profiles h100-llama8b] [--rates 0.25,0.5,1,1.5,2]
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from scripts.sim_report import SimPoints, replace_readme_block  # noqa: E402

from scripts.capacity_scoring import (  # noqa: E402
    BASE_ARMS, CAPS, EVICTED_ARMS, OFFLOAD_ARMS, PLUGIN_NATIVE_ARM, PREFETCH_ARM, SEED_CHECK_ARMS, SEED_CHECK_RATES, SEED_CHECK_TIER,
    SOLO_RATE,
    STATIC_CUT_ARMS, STATIC_CUT_TIERS, STATIC_CUT_TOKENS, VICTIM_ARM, WORKLOAD, Slo, arm_series, attainment,
    bar_rate, rate_union, rates_run, relabel_static_cut, solo_jcts, static_cut, superseded,
)
from scripts.capacity_sections import (  # noqa: E402
    NATIVE_ARMS, TTFT_CHECK_ARMS, offload_verdict, profile_section, readme_body, seed_check_readme,
    seed_check_section, slow_turns_section, ttft_section, ttft_seed_section,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Runs at the bar per tier at most: a run at 1.5x stock's capacity that
# stock sustains moves the bar up, and the next round runs the new one.
BAR_ROUNDS = 3
DEFAULT_RATES = {"h100-llama8b": "0.25,0.5,1,1.5", "h100-llama70b-tp4": "0.125,0.25,0.5"}
# Finer rates per profile and host tier (GiB), run for the offload arms and
# the oracle where the offload arms' capacities fall between two rates of
# the coarse sweep: a ratio of capacities is only as fine as the grid.
DEFAULT_FINE_RATES = {"h100-llama8b": {"64": "0.3,0.35,0.4,0.45", "256": "0.75"}}
DEFAULT_TTFT_RATE = {"h100-llama8b": 1.0, "h100-llama70b-tp4": 0.5}
# Where the TTFT check runs on other draws (``--ttft-check-seeds``): the
# profile and host tier (GiB) the TTFT bar names (H100 8B, 256 GiB
# per GPU, at DEFAULT_TTFT_RATE). On 70B TP4 seed 7 is within 2x the
# oracle's by a factor of 2.4 at both tiers.
TTFT_CHECK = {"h100-llama8b": "256"}
# Host tiers (GiB) at which the plugin with prefetch (PREFETCH_ARM) is swept
# for its capacity: a 256 GiB tier is where prefetch is meant to run (at 64
# GiB the pool is full when contexts return and a prefetch displaces
# another's; docs/offload.md).
PREFETCH_TIERS = ("256",)


# README.md's block this script owns (the summary of the page it writes).
README_BEGIN = "<!-- capacity-report: written by scripts/capacity_report.py -->"
README_END = "<!-- /capacity-report -->"


def other_seeds(flag: str, spec: str) -> list[str]:
    """The seeds of a check flag (comma-separated; '' : none): each a
    non-negative integer other than 7, the seed every other point runs on;
    a bad one is an error that names the flag and the value."""
    seeds = [x.strip() for x in spec.split(",") if x.strip()]
    for seed in seeds:
        if not seed.isdigit() or seed == "7":
            raise SystemExit(f"{flag}: {seed!r} is not a seed other than 7 (a non-negative integer)")
    return seeds


def fine_rates(spec: str, prof: str, tiers: list[str]) -> dict[str, str]:
    """Host tier (GiB) -> its finer rates, for the tiers swept: ``spec`` as
    ``--fine-rates`` takes it (``"64=0.3,0.4;256=0.75"``, ``"none"``), or
    ``prof``'s defaults when empty. A rate that is not a positive number, or
    an entry without ``TIER=``, is an error naming it."""
    if spec == "none":
        return {}
    if not spec:
        return {t: r for t, r in DEFAULT_FINE_RATES.get(prof, {}).items() if t in tiers}
    out: dict[str, str] = {}
    for entry in (e.strip() for e in spec.split(";") if e.strip()):
        tier, sep, rates = entry.partition("=")
        if not sep or not tier.strip() or not rates.strip():
            raise ValueError(f"--fine-rates entry {entry!r} is not TIER=R,R")
        for r in rates.split(","):
            try:
                ok = float(r) > 0
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"--fine-rates: rate {r!r} of tier {tier.strip()} is not a positive number")
        if tier.strip() in tiers:
            out[tier.strip()] = rates.strip()
    return out



def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--step-model", default="roofline", choices=["roofline", "aiconfigurator"])
    ap.add_argument("--profiles", default="h100-llama8b,h100-llama70b-tp4",
                    help="GPU profiles, comma-separated (default: %(default)s)")
    ap.add_argument("--rates", default="",
                    help="arrival rates (sessions/min) to sweep, comma-separated "
                         f"(default per profile: {DEFAULT_RATES})")
    ap.add_argument("--fine-rates", default="",
                    help="finer rates for the offload arms and the oracle, per host tier, the same for every "
                         "profile: 'TIER=R,R;TIER=R' ('none': no finer rates; default per profile: "
                         f"{DEFAULT_FINE_RATES})")
    ap.add_argument("--caps", default=",".join(CAPS),
                    help="plain-admission arms, the best per rate reported (default: %(default)s)")
    ap.add_argument("--tiers", default="64,256", help="host tiers for the offload arms, GiB per GPU (default: %(default)s)")
    ap.add_argument("--ttft-slo", type=float, default=2.0, help="p90 TTFT of a session's turns, s (default: %(default)s)")
    ap.add_argument("--jct-slo", type=float, default=1.3,
                    help="a session's JCT over its JCT served alone (default: %(default)s)")
    ap.add_argument("--attainment", type=float, default=0.9,
                    help="share of sessions that must keep the SLO (default: %(default)s)")
    ap.add_argument("--ttft-rate", default="",
                    help="rate (sessions/min) at which the TTFT under native offloading is split into its "
                         f"parts, per profile (default: {DEFAULT_TTFT_RATE}; 0: not at all)")
    ap.add_argument("--check-seeds", default="8",
                    help="other seeds (draws of sessions and arrivals) on which the headline offload arms run "
                         f"at {SEED_CHECK_TIER} GiB, comma-separated ('' : none; default: %(default)s)")
    ap.add_argument("--ttft-check-seeds", default="8,9",
                    help="other seeds on which the TTFT arms run at the TTFT rate, where TTFT_CHECK names the "
                         "profile's tier; the bar is judged on the seeds' mean ('' : none; default: %(default)s)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "sim", "capacity"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "capacity.md"))
    ap.add_argument("--plot", default=os.path.join(ROOT, "docs", "capacity.png"))
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"),
                    help="README whose capacity-report block gets the summary ('' : none)")
    args = ap.parse_args(argv)
    slo = Slo(args.ttft_slo, args.jct_slo, args.attainment)
    profiles = [p for p in args.profiles.split(",") if p]
    tiers = [t for t in args.tiers.split(",") if t]
    check_seeds = other_seeds("--check-seeds", args.check_seeds)
    ttft_seeds = other_seeds("--ttft-check-seeds", args.ttft_check_seeds)
    def on_seed(seed: str) -> SimPoints:
        return SimPoints(["--step-model", args.step_model, "--seed", seed, "--workers", "2"])

    sims = on_seed("7")
    # One SimPoints per other seed (its commands listed once), shared by both checks.
    other_sims = {seed: on_seed(seed) for seed in dict.fromkeys([*check_seeds, *ttft_seeds])}
    seed_sims = {seed: other_sims[seed] for seed in check_seeds}
    ttft_sims = {seed: other_sims[seed] for seed in ttft_seeds}
    seed_found: dict[str, dict[str, tuple[list[float], dict[str, float | None]]]] = {}
    ttft_readme: list[str] = []

    def point(out: str, argv: list[str], on: SimPoints = sims) -> list[dict[str, Any]]:
        return on.point(os.path.join(args.out, out), argv)

    lines = [
        "# Capacity: agent sessions per GPU at an SLO",
        "",
        f"Written by `{' '.join(['python scripts/capacity_report.py', *map(shlex.quote, argv)])}` from the "
        "simulator's results.json files (none of the",
        f"figures is copied by hand). Step model: `{args.step_model}` (docs/step_models.md); virtual seconds on",
        "the simulated GPU; every arm of a rate ran on the same arrivals (seed 7); the simulator ran on "
        f"{platform.machine()} / CPU, which changes no figure.",
        "",
        "Workload: the shipped Claude Code traces (kv-cache-tester) with their sub-agents under the parent's",
        "session id and the shared system prompt; the `headers-only` client (a session header, replies the",
        "plugin parses: what Claude Code sends, less its sub-agents' ids). SLO per session: p90 of its turns' TTFT <= "
        f"{slo.ttft_p90_s:g} s and JCT <= {slo.jct_factor:g}x",
        f"its JCT served alone (the oracle at {SOLO_RATE:g} sessions/min). A rate is sustained when >= "
        f"{slo.attainment:.0%} of its sessions keep",
        "both; capacity is the largest rate of the sweep sustained with every lower rate sustained. "
        "`in flight` is",
        "rate x mean JCT (sessions served at once, AA-AgentPerf's form); `tok/GPU-s` the prompt and output tokens",
        "of all sessions over the makespan, per GPU (AgentX's form), at the capacity rate.",
        "",
        "Host tiers: `native-offload` is vLLM's own CPU offloading (`--kv-offloading-size`) under the stock",
        "scheduler, `continuum-native-offload` the same under Continuum; `continuum-offload` the plugin's",
        "connector (`ContinuumOffloadConnector`, its default `store_mode: eager`); `continuum-offload-explicit`",
        "the same connector as a victim tier (`store_mode: explicit`: only what leaves a pin or a SLOW turn is",
        "stored, where native offloading and `eager` copy every block as it is computed, so the tier also holds",
        "what the GPU pool still has). Finer rates run for the offload arms and the oracle where their capacities",
        "fall between two rates of the sweep, and at 1.5x stock + native offloading's capacity at each tier (the",
        "issue's bar), so the page says whether anything, the oracle included, sustains that rate.",
        f"`{PLUGIN_NATIVE_ARM}` runs in points of its own (`*-plugin-native`, same arrivals): the runs of it in",
        "the older points that ran it beside the stock arms (listed under Commands) are superseded, not shown.",
        "",
        f"Chunked prefill: `{static_cut('native-offload')}` and `{static_cut('oracle')}` run the stock scheduler with "
        f"vLLM's own `--long-prefill-token-threshold {STATIC_CUT_TOKENS}` (every prefill's chunk cut to "
        f"{STATIC_CUT_TOKENS:,} tokens in every step; at the {', '.join(STATIC_CUT_TIERS)} GiB tier), every other arm",
        "vLLM's default (no cut). The plugin's arms cut long prefills only in the steps in which a job's next",
        "turn waits behind them (`cut_long_prefills`, on by default; docs/scheduling.md).",
        "",
    ]
    plots: list[tuple[str, dict[str, dict[float, float | None]]]] = []
    capacities: dict[str, dict[str, float | None]] = {}
    stale_by_prof: dict[str, set[str]] = {}
    summary: list[str] = []
    for prof in profiles:
        rates = args.rates or DEFAULT_RATES[prof]
        base = [*WORKLOAD, "--profile", prof]
        solo = solo_jcts(point(f"{prof}-solo", [*base, "--rate", f"{SOLO_RATE:g}", "--policies", "oracle"]))
        sweep = [*base, "--sweep-rate", rates]
        pts = point(f"{prof}-base", [*sweep, "--policies", ",".join(BASE_ARMS)])
        cap_arms = [c for c in args.caps.split(",") if c]
        caps = point(f"{prof}-caps", [*sweep, "--policies", ",".join(cap_arms)]) if cap_arms else []
        fine = fine_rates(args.fine_rates, prof, tiers)
        if fine:  # the oracle at every finer rate: what any policy could sustain there
            union = rate_union(*fine.values())
            pts = pts + point(f"{prof}-oracle-fine", [*base, "--sweep-rate", union, "--policies", "oracle"])
        per_tier: dict[str, list[dict[str, Any]]] = {}
        for t in tiers:
            tier = ["--offload-gib", t]
            per_tier[t] = [*superseded(point(f"{prof}-offload-{t}g", [*sweep, "--policies", ",".join(OFFLOAD_ARMS),
                                                                       *tier])),
                           *point(f"{prof}-offload-{t}g-victim", [*sweep, "--policies", VICTIM_ARM, *tier]),
                           *point(f"{prof}-offload-{t}g-evicted", [*sweep, "--policies", ",".join(EVICTED_ARMS),
                                                                   *tier]),
                           *point(f"{prof}-offload-{t}g-plugin-native", [
                               *base, "--sweep-rate", rate_union(rates, fine.get(t, "")), "--policies",
                               PLUGIN_NATIVE_ARM, *tier])]
            if t in PREFETCH_TIERS:
                per_tier[t] += point(f"{prof}-offload-{t}g-prefetch", [
                    *base, "--sweep-rate", rate_union(rates, fine.get(t, "")), "--policies", PREFETCH_ARM, *tier])
            if t in fine:
                per_tier[t] += superseded(point(f"{prof}-offload-{t}g-fine", [
                    *base, "--sweep-rate", fine[t], "--policies", ",".join((*OFFLOAD_ARMS, VICTIM_ARM)), *tier]))
                per_tier[t] += point(f"{prof}-offload-{t}g-fine-evicted", [
                    *base, "--sweep-rate", fine[t], "--policies", ",".join(EVICTED_ARMS), *tier])
            if t in STATIC_CUT_TIERS:
                cut_rates = rate_union(rates, fine.get(t, ""))
                got = relabel_static_cut(point(f"{prof}-static-cut-{t}g", [
                    *base, "--sweep-rate", cut_rates, "--policies", ",".join(STATIC_CUT_ARMS), *tier,
                    "--long-prefill-token-threshold", str(STATIC_CUT_TOKENS)]))
                per_tier[t] += [p for p in got if p["arm"] != static_cut("oracle")]
                pts = pts + [p for p in got if p["arm"] == static_cut("oracle")]
        section, shares, caps_by_arm = profile_section(prof, solo, pts, caps, cap_arms, per_tier, slo)
        # The bar itself: where no rate of the sweep is 1.5x stock + native
        # offloading's capacity at a tier, the offload arms and the oracle
        # run at exactly that rate, so the page can say whether anything,
        # the oracle included, sustains it.
        # A run at the bar may raise stock's capacity (it sustains the bar's
        # rate too), which moves the bar: run the new one, at most
        # ``BAR_ROUNDS`` times.
        for bar_round in range(BAR_ROUNDS):
            bars = {t: bar_rate(stock) for t in tiers
                    if (stock := caps_by_arm.get(f"native-offload ({t} GiB)")) is not None
                    and all(abs(r - bar_rate(stock)) > 1e-9 for r in rates_run(per_tier[t]))}
            if not bars:
                break
            suffix = "bar" if bar_round == 0 else f"bar{bar_round + 1}"
            for t, bar in bars.items():
                got = superseded(point(f"{prof}-offload-{t}g-{suffix}", [
                    *base, "--rate", f"{bar:g}", "--policies", ",".join((*OFFLOAD_ARMS, VICTIM_ARM, "oracle")),
                    "--offload-gib", t]))
                got += point(f"{prof}-offload-{t}g-{suffix}-plugin-native", [
                    *base, "--rate", f"{bar:g}", "--policies", PLUGIN_NATIVE_ARM, "--offload-gib", t])
                got += point(f"{prof}-offload-{t}g-{suffix}-evicted", [
                    *base, "--rate", f"{bar:g}", "--policies", ",".join(EVICTED_ARMS), "--offload-gib", t])
                if t in PREFETCH_TIERS:
                    got += point(f"{prof}-offload-{t}g-{suffix}-prefetch", [
                        *base, "--rate", f"{bar:g}", "--policies", PREFETCH_ARM, "--offload-gib", t])
                if t in STATIC_CUT_TIERS:
                    got += relabel_static_cut(point(f"{prof}-static-cut-{t}g-{suffix}", [
                        *base, "--rate", f"{bar:g}", "--policies", ",".join(STATIC_CUT_ARMS), "--offload-gib", t,
                        "--long-prefill-token-threshold", str(STATIC_CUT_TOKENS)]))
                oracles = ("oracle", static_cut("oracle"))
                per_tier[t] += [p for p in got if p["arm"] not in oracles]
                pts = pts + [p for p in got if p["arm"] in oracles]
            section, shares, caps_by_arm = profile_section(prof, solo, pts, caps, cap_arms, per_tier, slo)
        lines += section
        for t in tiers:
            # At 1.5x stock + native offloading's (final) capacity, where the
            # oracle sustains it: elsewhere the GPU's compute, not what the
            # arms keep, is what breaks the SLO.
            stock = caps_by_arm.get(f"native-offload ({t} GiB)")
            if stock is None:
                continue
            bar = bar_rate(stock)
            oracle_at_bar = next((p for r, p in arm_series(pts, "oracle").items() if abs(r - bar) < 1e-9), None)
            if oracle_at_bar is None or (attainment(oracle_at_bar, solo, slo) or 0.0) < slo.attainment:
                continue
            at_bar = [p for p in per_tier[t] if abs(p["rate_per_min"] - bar) < 1e-9]
            lines += slow_turns_section(prof, t, bar, [*at_bar, oracle_at_bar], slo)
        ttft_rate = float(args.ttft_rate) if args.ttft_rate else DEFAULT_TTFT_RATE.get(prof, 0.0)
        if ttft_rate > 0:
            # Its own runs (the sweep's results predate the records of load waits); same arrivals.
            # (The plugin's own points record load waits: its run at that rate, where the sweep has one.)
            split = {}
            for t in tiers:
                ours = [p for p in per_tier[t] if p["arm"] == PLUGIN_NATIVE_ARM
                        and abs(p["rate_per_min"] - ttft_rate) < 1e-9 and "load_wait_mean_s" in p]
                split[t] = [*superseded(point(f"{prof}-ttft-{t}g", [*base, "--rate", f"{ttft_rate:g}", "--policies",
                                                                    ",".join(NATIVE_ARMS), "--offload-gib", t])),
                            *(ours or point(f"{prof}-ttft-{t}g-plugin-native", [
                                *base, "--rate", f"{ttft_rate:g}", "--policies", PLUGIN_NATIVE_ARM, "--offload-gib", t])),
                            *point(f"{prof}-ttft-{t}g-prefetch", [
                                *base, "--rate", f"{ttft_rate:g}", "--policies", PREFETCH_ARM, "--offload-gib", t])]
            oracle = arm_series(pts, "oracle").get(ttft_rate)
            lines += ttft_section(prof, ttft_rate, oracle, split)
            check_tier = TTFT_CHECK.get(prof)
            if ttft_sims and check_tier in split and oracle is not None:
                by_seed = {"7": [oracle, *split[check_tier]]}
                for seed, ss in ttft_sims.items():
                    by_seed[seed] = point(f"seed{seed}/{prof}-ttft-{check_tier}g", [
                        *base, "--rate", f"{ttft_rate:g}", "--policies", ",".join(TTFT_CHECK_ARMS),
                        "--offload-gib", check_tier], ss)
                section, readme = ttft_seed_section(prof, ttft_rate, check_tier, by_seed)
                lines += section
                ttft_readme += readme
        if seed_sims and SEED_CHECK_TIER in tiers and prof in SEED_CHECK_RATES:
            checks = {}
            for seed, ss in seed_sims.items():
                seed_solo = solo_jcts(point(f"seed{seed}/{prof}-solo", [
                    *base, "--rate", f"{SOLO_RATE:g}", "--policies", "oracle"], ss))
                sweep_check = [*base, "--sweep-rate", SEED_CHECK_RATES[prof]]
                tier_check = ["--offload-gib", SEED_CHECK_TIER]
                checks[seed] = (seed_solo, [
                    *superseded(point(f"seed{seed}/{prof}-offload-{SEED_CHECK_TIER}g", [
                        *sweep_check, "--policies", ",".join(SEED_CHECK_ARMS), *tier_check], ss)),
                    *point(f"seed{seed}/{prof}-offload-{SEED_CHECK_TIER}g-plugin-native", [
                        *sweep_check, "--policies", PLUGIN_NATIVE_ARM, *tier_check], ss)])
            section, seed_found[prof] = seed_check_section(prof, SEED_CHECK_TIER, caps_by_arm, checks, slo)
            lines += section
        plots.append((prof, shares))
        capacities[prof] = caps_by_arm
        summary.append(f"- {prof}: " + "; ".join(
            f"{arm} {'none' if cap is None else f'{cap:g}/min'}" for arm, cap in caps_by_arm.items()))
        # The better oracle bounds what a policy can reach: with vLLM's
        # static chunk cut, a pool that never evicts may sustain more.
        oracle_arm = max(("oracle", static_cut("oracle")), key=lambda a: caps_by_arm.get(a) or 0.0)
        oracle_name = ("the oracle (a pool that never evicts)" if oracle_arm == "oracle" else
                       "the oracle with vLLM's static chunk cut (a pool that never evicts, "
                       f"--long-prefill-token-threshold {STATIC_CUT_TOKENS})")
        oracle_rates = sorted(arm_series(pts, oracle_arm))
        stale = sorted({f"{p['arm']} ({t} GiB)" for t, tp in per_tier.items() for p in tp
                        if p["arm"].startswith("continuum-") and p.get("code_commit") is None})
        stale_by_prof[prof] = set(stale)
        if stale:
            summary.append("  - ran before `cut_long_prefills` (their runs record no commit; see Commands): "
                           + ", ".join(f"`{a}`" for a in stale) + ".")
        for t in tiers:
            stock = caps_by_arm.get(f"native-offload ({t} GiB)")
            cut = caps_by_arm.get(f"{static_cut('native-offload')} ({t} GiB)")
            if f"{static_cut('native-offload')} ({t} GiB)" in caps_by_arm:
                ours = caps_by_arm.get(f"continuum-native-offload ({t} GiB)")
                summary.append(
                    f"  - vLLM's own static chunk cut (`--long-prefill-token-threshold {STATIC_CUT_TOKENS}`) under "
                    f"stock + native offloading at {t} GiB: {'none' if cut is None else f'{cut:g}/min'}"
                    + (f" ({cut / stock:.2f}x stock + native offloading)" if cut and stock else "")
                    + f"; the plugin + native offloading (its cut only in the steps a job's next turn waits): "
                    + ("none" if ours is None else f"{ours:g}/min") + ".")
            bar = bar_rate(stock) if stock else None
            for arm, who in (("continuum-native-offload", "the plugin + native offloading"),
                             (PREFETCH_ARM, "the plugin with prefetch + native offloading"),
                             (VICTIM_ARM, "the plugin + its connector storing what leaves a pin"),
                             ("continuum-offload-victim", "the plugin + its connector storing what the GPU evicts"),
                             ("offload-victim", "stock vLLM + the plugin's connector storing what the GPU evicts")):
                if f"{arm} ({t} GiB)" not in caps_by_arm:
                    continue  # not run at this tier (prefetch: PREFETCH_TIERS only)
                verdict = offload_verdict(caps_by_arm.get(f"{arm} ({t} GiB)"), stock, caps_by_arm.get(oracle_arm),
                                          rates_run(per_tier[t]), oracle_rates, oracle_name)
                at_bar = shares.get(f"{arm} ({t} GiB)", {}).get(bar)
                if at_bar is not None and at_bar < slo.attainment:
                    # What the bar's own run says, beside the oracle's there.
                    oracle_at = shares.get(oracle_arm, {}).get(bar)
                    verdict += (f"; at the bar's {bar:g}/min {at_bar:.0%} of its sessions keep the SLO"
                                + ("" if oracle_at is None else f" ({oracle_arm}: {oracle_at:.0%})"))
                summary.append(f"  - {who} against stock + native offloading at {t} GiB: {verdict}.")
    lines += ["## Summary", "", *summary, "", "![SLO attainment against arrival rate](capacity.png)", ""]
    for ss in other_sims.values():
        sims.commands += ss.commands
    sims.write(args.doc, lines, "capacity_report")
    _plot(plots, slo, args.plot)
    if args.readme:
        rel = os.path.relpath(args.doc, os.path.dirname(os.path.abspath(args.readme)))
        replace_readme_block(args.readme, README_BEGIN, README_END, readme_body(capacities, slo, rel, stale_by_prof)
                             + seed_check_readme(seed_found) + ttft_readme)
    return 0


def _plot(plots: list[tuple[str, dict[str, dict[float, float | None]]]], slo: Slo, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(plots), figsize=(7 * len(plots), 4.5), squeeze=False)
    for ax, (prof, shares) in zip(axes[0], plots):
        for arm, by_rate in shares.items():
            xs = sorted(r for r, v in by_rate.items() if v is not None)
            ax.plot(xs, [by_rate[x] for x in xs], marker="o", label=arm)
        ax.axhline(slo.attainment, color="grey", linestyle="--", linewidth=1)
        ax.set_title(prof)
        ax.set_xlabel("arrivals (sessions/min per replica)")
        ax.set_ylabel("sessions keeping the SLO")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
