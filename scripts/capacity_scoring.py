"""The capacity benchmark's arms and how their sessions are scored.

What ``scripts/capacity_report.py`` compares (the simulator's arms, the
static chunk cut, the seed check) and how: a session keeps the SLO when
its p90 TTFT and its JCT over its JCT served alone are within bounds; a rate
is sustained when enough sessions keep it; an arm's capacity is the largest
rate sustained with every lower rate sustained too. Pure functions over
the simulator's results.json points."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

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
# The plugin + native offloading runs in points of its own (``-plugin-native``
# beside each point that runs the stock arms): the plugin's scheduler
# changes far more often than the stock arms, and a change to it then reruns
# only its own runs. The points that ran it beside the stock arms (before
# ``preempt_for_turns``) keep their command; their runs of it are superseded
# (``superseded``), not shown.
PLUGIN_NATIVE_ARM = "continuum-native-offload"
# The same with prefetch on (opt-in): its TTFT beside the plugin's.
PREFETCH_ARM = "continuum-native-prefetch"


def superseded(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``points`` without :data:`PLUGIN_NATIVE_ARM`'s: it has points of its
    own."""
    return [p for p in points if p["arm"] != PLUGIN_NATIVE_ARM]
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
# Another draw of sessions and arrivals (``--check-seeds``): the headline
# offload arms at one tier, at the rates around their capacities, so the
# page says whether a capacity ratio holds on other sessions or only on
# seed 7's 50. Fewer arms and rates than the main sweep: a check, not a
# second sweep.
SEED_CHECK_TIER = "64"
# The check's ratios are over this arm (stock + native offloading), as the
# main table's offload ratios are (``reference_arm``).
SEED_CHECK_REFERENCE = "native-offload"
SEED_CHECK_ARMS = (SEED_CHECK_REFERENCE, "continuum-native-offload", "continuum-offload-victim")
SEED_CHECK_RATES = {"h100-llama8b": "0.3,0.35,0.4,0.45,0.5", "h100-llama70b-tp4": "0.25,0.375,0.5"}
# Sessions a minute at which the oracle serves each session about as it
# would alone (they barely overlap): the JCT SLO's reference.
SOLO_RATE = 0.02
GPUS = {"h100-llama8b": 1, "h100-llama70b-tp4": 4}


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
    offloading at the same host tier for an offload arm (prefetch runs
    under native offloading), stock vLLM else."""
    if ("offload" in arm or arm.startswith(PREFETCH_ARM)) and "(" in arm:
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


def rates_run(points: list[dict[str, Any]]) -> list[float]:
    """The rates ``points`` ran at, sorted, each once."""
    return sorted({p["rate_per_min"] for p in points})


def rate_union(*specs: str) -> str:
    """The rates of several comma-separated lists, as one sorted list
    without repeats (``"0.5,1"`` and ``"0.75,1"`` -> ``"0.5,0.75,1"``)."""
    return ",".join(f"{r:g}" for r in sorted({float(r) for spec in specs for r in spec.split(",") if r.strip()}))
