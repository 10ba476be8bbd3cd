"""Write docs/capacity.md: agent sessions per GPU at an SLO, per policy,
with and without vLLM's own CPU offloading, simulated.

The question a user serving coding agents asks: how many sessions a minute
can one replica take before its agents slow down, and how many more with
the plugin? This sweeps the arrival rate on the shipped Claude Code traces
(sub-agents, the shared system prompt, the ``headers-only`` client: a
session header and nothing else, what Claude Code sends) through vLLM's real
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
fixed cap per rate (``fcfs-capK``); the oracle (a pool that never evicts).
The offload arms run once per host tier (``--tiers``, GiB per GPU): 64 GiB
overflows at the higher rates, 256 GiB is what docs/retention.md measured.
Where the offload arms' capacities fall between two rates of the sweep,
finer rates (``--fine-rates``) run for them and the oracle; and where no
rate of the sweep is 1.5x stock + native offloading's capacity at a tier,
they and the oracle run at that rate too (``{profile}-offload-{tier}g-bar``),
so whether any policy can reach 1.5x is measured, not inferred.

Every figure comes from the results.json files this script makes (reused
when a file holds the same command, so an interrupted run resumes); the
commands are printed at the end.

    python scripts/capacity_report.py [--profiles h100-llama8b] [--rates 0.25,0.5,1,1.5,2]
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from scripts.sim_report import SimPoints, replace_readme_block  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOAD = ("--subagents", "--shared-system", "--client", "headers-only")
BASE_ARMS = ("fcfs", "continuum", "oracle")
OFFLOAD_ARMS = ("native-offload", "continuum-native-offload", "continuum-offload")
# The plugin's connector as a victim tier (``store_mode: explicit``): its own
# runs, so the sweeps above are reused as they are.
VICTIM_ARM = "continuum-offload-explicit"
# The connector storing what the GPU prefix cache evicts (``store_mode:
# victim``), under Continuum and under the stock scheduler: their own runs
# too, for the same reason.
EVICTED_ARMS = ("continuum-offload-victim", "offload-victim")
CAPS = ("fcfs-cap8", "fcfs-cap12", "fcfs-cap16")
# vLLM's own static chunk cut (``--long-prefill-token-threshold``, every
# prefill in every step) under the stock scheduler, with native offloading
# and for the oracle: what the flag alone gives, beside the plugin's cut for
# the steps in which a job's next turn waits (``cut_long_prefills``). Half
# the H100 profiles' 8,192-token budget: the plugin's share with one long
# prefill running. Run at these host tiers (GiB).
STATIC_CUT_TOKENS = 4096
STATIC_CUT_TIERS = ("64",)


def static_cut(arm: str) -> str:
    """The name of ``arm`` run with vLLM's static chunk cut."""
    return f"{arm}-cut{STATIC_CUT_TOKENS}"


STATIC_CUT_ARMS = ("native-offload", "oracle")
# Sessions a minute at which the oracle serves each session about as it
# would alone (they barely overlap): the JCT SLO's reference.
SOLO_RATE = 0.02
# Runs at the bar per tier at most: a run at 1.5x stock's capacity that
# stock sustains moves the bar up, and the next round runs the new one.
BAR_ROUNDS = 3
DEFAULT_RATES = {"h100-llama8b": "0.25,0.5,1,1.5", "h100-llama70b-tp4": "0.125,0.25,0.5"}
# Finer rates per profile and host tier (GiB), run for the offload arms and
# the oracle where the offload arms' capacities fall between two rates of
# the coarse sweep: a ratio of capacities is only as fine as the grid.
DEFAULT_FINE_RATES = {"h100-llama8b": {"64": "0.3,0.35,0.4,0.45", "256": "0.75"}}
GPUS = {"h100-llama8b": 1, "h100-llama70b-tp4": 4}


# README.md's block this script owns (the summary of the page it writes).
README_BEGIN = "<!-- capacity-report: written by scripts/capacity_report.py -->"
README_END = "<!-- /capacity-report -->"


@dataclass(frozen=True)
class Slo:
    ttft_p90_s: float
    jct_factor: float
    attainment: float


def _judged(point: dict[str, Any], solo: dict[str, tuple[float, int]]) -> Iterator[tuple[dict[str, Any], float]]:
    """``point``'s sessions that can be judged, each with its JCT served
    alone: a job whose tokens differ from its solo run's is not the same
    job and is not judged."""
    for s in point.get("sessions", ()):
        alone, tokens = solo.get(s["job"], (None, None))
        if alone is not None and tokens == s["tokens"]:
            yield s, alone


def attainment(point: dict[str, Any], solo: dict[str, tuple[float, int]], slo: Slo) -> float | None:
    """The share of ``point``'s sessions that keep the SLO (None: no
    session to judge). ``solo``: each job's JCT served alone and its tokens."""
    kept = [s["ttft_p90_s"] <= slo.ttft_p90_s and s["jct_s"] <= slo.jct_factor * alone
            for s, alone in _judged(point, solo)]
    return sum(kept) / len(kept) if kept else None


def misses(point: dict[str, Any], solo: dict[str, tuple[float, int]], slo: Slo) -> tuple[int, int, int]:
    """``(judged, missing the TTFT bound, missing the JCT bound)`` among
    ``point``'s sessions (a session may miss both): which half of the SLO
    breaks first."""
    judged = list(_judged(point, solo))
    return (len(judged), sum(s["ttft_p90_s"] > slo.ttft_p90_s for s, _ in judged),
            sum(s["jct_s"] > slo.jct_factor * alone for s, alone in judged))


def capacity(by_rate: dict[float, float | None], slo: Slo) -> float | None:
    """The largest rate sustained with every lower rate sustained too."""
    best = None
    for rate in sorted(by_rate):
        share = by_rate[rate]
        if share is None or share < slo.attainment:
            break
        best = rate
    return best


def bar_rate(stock: float) -> float:
    """The issue's bar: 1.5x stock + native offloading's capacity
    (sessions/min), rounded so that it names one sweep rate."""
    return round(1.5 * stock, 6)


def reference_arm(arm: str) -> str:
    """What an arm's capacity is compared with: stock vLLM with native
    offloading at the same host tier for an offload arm, stock vLLM else."""
    if "offload" in arm and "(" in arm:
        return "native-offload " + arm[arm.index("("):]
    return "fcfs"


def relabel_static_cut(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Points run with vLLM's static chunk cut, their arms renamed
    (``static_cut``) so they stand beside the same arms without it."""
    return [{**p, "arm": static_cut(p["arm"])} for p in points]


def solo_jcts(points: list[dict[str, Any]]) -> dict[str, tuple[float, int]]:
    """Job -> (JCT alone, tokens) from the oracle at ``SOLO_RATE``."""
    oracle = next(p for p in points if p["arm"] == "oracle")
    return {s["job"]: (s["jct_s"], s["tokens"]) for s in oracle["sessions"]}


def arm_series(points: list[dict[str, Any]], arm: str) -> dict[float, dict[str, Any]]:
    return {p["rate_per_min"]: p for p in points if p["arm"] == arm}


def offload_verdict(ours: float | None, stock: float | None, oracle: float | None, rates: list[float],
                    oracle_rates: list[float] | None = None,
                    oracle_name: str = "the oracle (a pool that never evicts)") -> str:
    """A plugin offload arm's capacity against stock + native offloading's
    at one tier, and what bounds the ratio, first that applies: the oracle
    (a pool that never evicts) misses the SLO at a rate of ``oracle_rates``
    within 1.5x stock's, so no policy can reach the bar; stock already
    sustains the oracle's capacity on the sweep, so no policy serves more
    there; the oracle sustains 1.5x stock's rate, so the bar is open and the
    arm's own retention falls short; the sweep has no rate at 1.5x stock's,
    so it cannot show the bar. An arm that sustains more than the oracle
    wins by scheduling, and that is said first. ``oracle_name`` names the
    oracle in the text
    (the report passes the better of the oracle with and without vLLM's
    static chunk cut)."""
    if ours is None or stock is None:
        return "not comparable (an arm sustains no rate of the sweep)"
    ratio = ours / stock
    verdict = (f"{ratio:.2f}x: the 1.5x bar {'holds' if ratio >= 1.5 else 'is not reached'}"
               f"{'' if ratio >= 1 else ', and it serves fewer'} on this sweep's rates")
    if ratio >= 1.5:
        return verdict
    bar = 1.5 * stock
    if oracle is not None and ours > oracle:
        # The oracle keeps every context but schedules as stock vLLM does:
        # an arm past it wins by scheduling, and the oracle bounds nothing.
        return (verdict + f"; it sustains more than {oracle_name}, which sustains {oracle:g}/min: what it adds there is "
                "scheduling (a returning turn is not held behind long prefills), which the oracle's stock "
                "scheduler lacks"
                + ("" if any(r >= bar - 1e-9 for r in rates) else
                   f"; the sweep has no rate at 1.5x stock's {stock:g}/min"))
    missed = [r for r in (oracle_rates or ()) if oracle is not None and oracle < r <= bar + 1e-9]
    if missed:
        return (verdict + f"; {oracle_name} misses the SLO at {missed[0]:g}/min, within 1.5x "
                f"stock + native offloading's {stock:g}/min: there the GPU's compute, not its KV, breaks the SLO, "
                "so no retention or tier policy can reach the bar here")
    if oracle is not None and stock >= oracle:
        return (verdict + f"; stock + native offloading already sustains the oracle's {oracle:g}/min, "
                "so no policy serves more on this sweep")
    if oracle is not None and oracle >= bar - 1e-9:
        return (verdict + f"; {oracle_name} sustains {oracle:g}/min, at least 1.5x stock + "
                f"native offloading's {stock:g}/min, so the GPU's compute leaves room for the bar: this arm keeps "
                "too little of what the sessions reuse to reach it")
    if not any(r >= bar - 1e-9 for r in rates):
        return verdict + f" (the sweep has no rate at 1.5x stock's {stock:g}/min)"
    return verdict


def rates_run(points: list[dict[str, Any]]) -> list[float]:
    """The rates ``points`` ran at, sorted, each once."""
    return sorted({p["rate_per_min"] for p in points})


def rate_union(*specs: str) -> str:
    """The rates of several comma-separated lists, as one sorted list
    without repeats (``"0.5,1"`` and ``"0.75,1"`` -> ``"0.5,0.75,1"``)."""
    return ",".join(f"{r:g}" for r in sorted({float(r) for spec in specs for r in spec.split(",") if r.strip()}))


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


def profile_section(
    prof: str, solo: dict[str, tuple[float, int]], pts: list[dict[str, Any]], caps: list[dict[str, Any]],
    cap_arms: list[str], per_tier: dict[str, list[dict[str, Any]]], slo: Slo,
) -> tuple[list[str], dict[str, dict[float, float | None]], dict[str, float | None]]:
    """One GPU profile's table: every arm's SLO attainment per rate and its
    capacity (sessions/min, in flight, tokens per GPU-second, against stock).
    Returns the lines, the attainment per arm and rate, and the capacities."""
    series: dict[str, dict[float, dict[str, Any]]] = {a: arm_series(pts, a)
                                                      for a in (*BASE_ARMS, static_cut("oracle"))}
    for t, tp in per_tier.items():
        for a in (*OFFLOAD_ARMS, static_cut("native-offload"), VICTIM_ARM, *EVICTED_ARMS):
            series[f"{a} ({t} GiB)"] = arm_series(tp, a)
    # Plain admission at its best cap, per rate.
    best_cap: dict[float, dict[str, Any]] = {}
    for cap in cap_arms:
        for rate, p in arm_series(caps, cap).items():
            share = attainment(p, solo, slo) or 0.0
            if rate not in best_cap or share > (attainment(best_cap[rate], solo, slo) or 0.0):
                best_cap[rate] = p
    if best_cap:
        series["fcfs-cap (best)"] = best_cap
    tiers = list(per_tier)
    order = ["fcfs", *[f"native-offload ({t} GiB)" for t in tiers],
             *[f"{static_cut('native-offload')} ({t} GiB)" for t in tiers
               if series[f"{static_cut('native-offload')} ({t} GiB)"]],
             *(["fcfs-cap (best)"] if best_cap else []),
             "continuum",
             *[f"{a} ({t} GiB)" for t in tiers
               for a in ("continuum-native-offload", "continuum-offload", VICTIM_ARM, *EVICTED_ARMS)
               if series[f"{a} ({t} GiB)"]],
             "oracle", *([static_cut("oracle")] if series[static_cut("oracle")] else [])]
    shares = {arm: {r: attainment(p, solo, slo) for r, p in series[arm].items()} for arm in order}
    all_rates = sorted({r for arm in order for r in series[arm]})
    gpus = GPUS.get(prof, 1)
    lines = [
        f"## {prof} ({gpus} GPU{'s' if gpus > 1 else ''} per replica)", "",
        "SLO attainment (share of sessions keeping it) per arrival rate (sessions/min), and each arm's capacity:",
        "",
        "| arm | " + " | ".join(f"{r:g}/min" for r in all_rates)
        + " | capacity sessions/min | in flight | tok/GPU-s | vs stock |",
        "|---|" + "---:|" * len(all_rates) + "---:|---:|---:|---:|",
    ]
    caps_by_arm = {arm: capacity(shares[arm], slo) for arm in order}
    for arm in order:
        cap = caps_by_arm[arm]
        cells = [f"{shares[arm][r]:.0%}" if shares[arm].get(r) is not None else "-" for r in all_rates]
        flight = tok = vs = "-"
        if cap is not None:
            p = series[arm][cap]
            flight = f"{cap * p['jct_mean_s'] / 60:.1f}"
            tokens = sum(s["tokens"] for s in p["sessions"])
            tok = f"{tokens / p['makespan_s'] / gpus:,.0f}"
            ref = caps_by_arm.get(reference_arm(arm))
            if ref:
                vs = f"{cap / ref:.2f}x"
        label = arm if arm != "fcfs-cap (best)" else "fcfs-cap (best cap per rate)"
        lines.append(f"| {label} | " + " | ".join(cells)
                     + f" | {'none' if cap is None else f'{cap:g}'} | {flight} | {tok} | {vs} |")
    lines += ["", "`vs stock`: an offload arm's capacity over `native-offload` at the same tier, the others' "
              "over `fcfs`. `none`: not even the lowest rate is sustained. `-`: not run at that rate (the finer "
              "rates and 1.5x stock + native offloading's capacity run for the offload arms and the oracle only).",
              ""]
    lines += ["What breaks first: at the lowest rate each arm does not sustain, its sessions missing each half of "
              f"the SLO (p90 TTFT > {slo.ttft_p90_s:g} s; JCT > {slo.jct_factor:g}x alone; a session may miss both), "
              "and the rate's mean TTFT, queueing and JCT:", "",
              "| arm | rate | sessions | miss TTFT | miss JCT | TTFT mean s | queue mean s | JCT mean s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for arm in order:
        failed = [r for r in sorted(shares[arm]) if (shares[arm][r] or 0.0) < slo.attainment]
        if not failed:
            continue
        p = series[arm][failed[0]]
        judged, ttft, jct = misses(p, solo, slo)
        label = arm if arm != "fcfs-cap (best)" else "fcfs-cap (best cap per rate)"
        lines.append(f"| {label} | {failed[0]:g}/min | {judged} | {ttft} | {jct} | {p['ttft_mean_s']:.2f} | "
                     f"{p['queue_mean_s']:.2f} | {p['jct_mean_s']:.1f} |")
    lines.append("")
    return lines, shares, caps_by_arm


SLOW_CAUSES = (("recomputed", "recomputed"), ("queued", "queued"), ("new_prompt", "new prompt"))


def slow_turns_section(prof: str, tier: str, rate: float, points: list[dict[str, Any]], slo: Slo) -> list[str]:
    """At the bar's rate: each arm's turns slower than the TTFT bound, by
    cause (the simulator's ``slow_turns``), and what each arm has beyond the
    oracle's: lost contexts (``recomputed``) are what retention and a tier
    can win back; ``queued`` turns waited for room that the oracle's pool
    (which never fills) always has. Points without the breakdown (older
    runs) are left out."""
    rows = [p for p in points if p.get("slow_turns")]
    if not rows:
        return []
    label = {p["arm"]: p["arm"] if p["arm"] == "oracle" else f"{p['arm']} ({tier} GiB)" for p in rows}
    lines = [f"### Why turns are slow at the bar's rate: {prof}, {tier} GiB, {rate:g} sessions/min", "",
             f"Turns whose TTFT exceeds {slo.ttft_p90_s:g} s, by what made each slow (first that applies): "
             "`recomputed`, it rebuilt at least 4,096 tokens its session had had in KV (retention lost them); "
             "`queued`, it spent at least half its TTFT waiting to be scheduled (room in the GPU pool, a place in "
             "the batch, an asynchronous load); `new prompt`, the prefill of tokens no pool could have kept "
             "(a first turn, a long tool result).", "",
             "| arm | turns > bound | " + " | ".join(name for _, name in SLOW_CAUSES) + " |",
             "|---|---:|" + "---:|" * len(SLOW_CAUSES)]
    for p in rows:
        c = p["slow_turns"]
        lines.append(f"| {label[p['arm']]} | {c['slow']} | " + " | ".join(str(c[k]) for k, _ in SLOW_CAUSES) + " |")
    oracle = next((p["slow_turns"] for p in rows if p["arm"] == "oracle"), None)
    if oracle is not None:
        lines.append("")
        for p in rows:
            if p["arm"] == "oracle":
                continue
            c = p["slow_turns"]
            lines.append(f"- `{label[p['arm']]}`: {c['slow'] - oracle['slow']:+d} slow turns over the oracle's; "
                         f"{c['recomputed'] - oracle['recomputed']:+d} recomputed, "
                         f"{c['queued'] - oracle['queued']:+d} queued.")
    lines.append("")
    return lines


# Where a returning turn's TTFT goes under vLLM's native offloading: the arms
# whose loads are asynchronous (a turn waits for its prefix before it runs).
NATIVE_ARMS = ("native-offload", "continuum-native-offload")
DEFAULT_TTFT_RATE = {"h100-llama8b": 1.0, "h100-llama70b-tp4": 0.5}


def ttft_section(prof: str, rate: float, oracle: dict[str, Any] | None,
                 per_tier: dict[str, list[dict[str, Any]]]) -> list[str]:
    """TTFT under each native-offloading arm at ``rate``, split into the
    wait for the host tier's loads, the rest of the queueing (room in the GPU
    pool, a place in the batch) and the first step; against the oracle's.
    Prefetching a context before its turn returns can remove at most the
    first part: the table says whether that alone could bring the mean TTFT
    within 2x the oracle's."""
    lines = [f"### Where the TTFT goes under vLLM's native offloading, {prof}, {rate:g} sessions/min", "",
             "Mean per turn: the wait for its prefix to load from the host tier (vLLM's asynchronous "
             "loads), the rest of its queueing (waiting for room in the GPU pool or a place in the batch) "
             "and the time from its first scheduled step to its first token. `without loads` is the TTFT "
             "if every load had finished before its turn arrived: the most prefetching could give.", "",
             "| arm | TTFT mean s | load wait s | other queueing s | first step to token s | "
             "without loads s | JCT mean s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    if oracle is not None:
        lines.append(f"| oracle | {oracle['ttft_mean_s']:.2f} | 0.00 | {oracle['queue_mean_s']:.2f} | "
                     f"{oracle['ttft_mean_s'] - oracle['queue_mean_s']:.2f} | {oracle['ttft_mean_s']:.2f} | "
                     f"{oracle['jct_mean_s']:.1f} |")
    verdicts = []
    # Arms whose mean TTFT is within 2x the oracle's as it is; arms above it
    # that would be within it without their loads (what prefetching could
    # give); arms above it either way.
    already: list[str] = []
    reachable: list[str] = []
    beyond: list[str] = []
    for tier, pts in per_tier.items():
        for p in pts:
            load = p["load_wait_mean_s"]
            without = p["ttft_mean_s"] - load
            lines.append(f"| {p['arm']} ({tier} GiB) | {p['ttft_mean_s']:.2f} | {load:.2f} | "
                         f"{p['queue_mean_s'] - load:.2f} | {p['ttft_mean_s'] - p['queue_mean_s']:.2f} | "
                         f"{without:.2f} | {p['jct_mean_s']:.1f} |")
            if oracle is not None:
                bar = 2 * oracle["ttft_mean_s"]
                name = f"`{p['arm']}` at {tier} GiB"
                (already if p["ttft_mean_s"] <= bar else reachable if without <= bar else beyond).append(name)
                verdicts.append(f"{name}: {p['ttft_mean_s']:.2f} s, of which loads "
                                f"{load:.2f} s ({load / p['ttft_mean_s']:.0%}); without them {without:.2f} s, "
                                f"{'within' if without <= bar else 'above'} 2x the oracle's ({bar:.2f} s)")
    lines.append("")
    if verdicts:
        lines += ["- " + v + "." for v in verdicts]
        said = []
        if already:
            said.append("the mean TTFT is already within 2x the oracle's, without prefetching, for "
                        + ("every arm and tier here" if not (reachable or beyond) else ", ".join(already)))
        it = "it" if said else "the mean TTFT"
        if reachable:
            said.append(f"prefetching contexts before their turns return could bring {it} within 2x the "
                        "oracle's for " + ", ".join(reachable))
        elif beyond:
            said.append(f"prefetching contexts before their turns return cannot bring {it} within 2x the "
                        "oracle's for " + ("any arm or tier here" if not already else ", ".join(beyond))
                        + ": the turns wait for room in the GPU pool (the oracle's pool never fills), not "
                        "for their loads; a prefetch would take that room earlier")
        lines += ["", "So " + "; ".join(said) + ".", ""]
    return lines


def readme_body(capacities: dict[str, dict[str, float | None]], slo: Slo, doc: str,
                stale: dict[str, set[str]] | None = None) -> list[str]:
    """README's summary: each arm's capacity per profile (sessions/min per
    replica) and its ratio over its stock reference (``reference_arm``).
    ``stale``: per profile, the plugin arms (as the tables name them, with
    their tier) whose runs predate ``cut_long_prefills``; their cells are
    marked."""
    stale = stale or {}
    profiles = list(capacities)
    arms = list(dict.fromkeys(a for caps in capacities.values() for a in caps))
    lines = [
        "Simulated (vLLM's real scheduler on a virtual clock, roofline step model): the most Claude Code",
        "sessions a minute one replica takes while >= "
        f"{slo.attainment:.0%} of them keep p90 TTFT <= {slo.ttft_p90_s:g} s and JCT <= {slo.jct_factor:g}x "
        "their JCT served alone",
        "(the `headers-only` client, sub-agents, the shared system prompt); in brackets, over stock vLLM",
        f"(`fcfs`), or over `native-offload` at the same host tier for an offload arm. Per rate and tier: [{doc}]({doc}).",
        "",
        "| arm | " + " | ".join(profiles) + " |",
        "|---|" + "---:|" * len(profiles),
    ]
    for arm in arms:
        cells = []
        for prof in profiles:
            cap = capacities[prof].get(arm)
            ref = capacities[prof].get(reference_arm(arm))
            if arm not in capacities[prof]:
                cells.append("-")
            elif cap is None:
                cells.append("none")
            else:
                cells.append(f"{cap:g}/min" + (f" ({cap / ref:.2f}x)" if ref and arm != reference_arm(arm) else "")
                             + (" †" if arm in stale.get(prof, ()) else ""))
        label = "fcfs-cap (best cap per rate)" if arm == "fcfs-cap (best)" else arm
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if any(stale.values()):
        lines += ["", "† ran before `cut_long_prefills` (their runs record no commit; "
                  f"[{doc}]({doc}) says which)."]
    return lines


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
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "sim", "capacity"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "capacity.md"))
    ap.add_argument("--plot", default=os.path.join(ROOT, "docs", "capacity.png"))
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"),
                    help="README whose capacity-report block gets the summary ('' : none)")
    args = ap.parse_args(argv)
    slo = Slo(args.ttft_slo, args.jct_slo, args.attainment)
    profiles = [p for p in args.profiles.split(",") if p]
    tiers = [t for t in args.tiers.split(",") if t]
    sims = SimPoints(["--step-model", args.step_model, "--seed", "7", "--workers", "2"])

    def point(out: str, argv: list[str]) -> list[dict[str, Any]]:
        return sims.point(os.path.join(args.out, out), argv)

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
        "plugin parses: what Claude Code sends). SLO per session: p90 of its turns' TTFT <= "
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
            per_tier[t] = [*point(f"{prof}-offload-{t}g", [*sweep, "--policies", ",".join(OFFLOAD_ARMS), *tier]),
                           *point(f"{prof}-offload-{t}g-victim", [*sweep, "--policies", VICTIM_ARM, *tier]),
                           *point(f"{prof}-offload-{t}g-evicted", [*sweep, "--policies", ",".join(EVICTED_ARMS),
                                                                   *tier])]
            if t in fine:
                per_tier[t] += point(f"{prof}-offload-{t}g-fine", [
                    *base, "--sweep-rate", fine[t], "--policies", ",".join((*OFFLOAD_ARMS, VICTIM_ARM)), *tier])
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
                got = point(f"{prof}-offload-{t}g-{suffix}", [*base, "--rate", f"{bar:g}", "--policies",
                                                              ",".join((*OFFLOAD_ARMS, VICTIM_ARM, "oracle")),
                                                              "--offload-gib", t])
                got += point(f"{prof}-offload-{t}g-{suffix}-evicted", [
                    *base, "--rate", f"{bar:g}", "--policies", ",".join(EVICTED_ARMS), "--offload-gib", t])
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
            split = {t: point(f"{prof}-ttft-{t}g", [*base, "--rate", f"{ttft_rate:g}", "--policies",
                                                      ",".join(NATIVE_ARMS), "--offload-gib", t]) for t in tiers}
            oracle = arm_series(pts, "oracle").get(ttft_rate)
            lines += ttft_section(prof, ttft_rate, oracle, split)
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
                             (VICTIM_ARM, "the plugin + its connector storing what leaves a pin"),
                             ("continuum-offload-victim", "the plugin + its connector storing what the GPU evicts"),
                             ("offload-victim", "stock vLLM + the plugin's connector storing what the GPU evicts")):
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
    sims.write(args.doc, lines, "capacity_report")
    _plot(plots, slo, args.plot)
    if args.readme:
        rel = os.path.relpath(args.doc, os.path.dirname(os.path.abspath(args.readme)))
        replace_readme_block(args.readme, README_BEGIN, README_END, readme_body(capacities, slo, rel, stale_by_prof))
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
