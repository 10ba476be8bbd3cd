"""The sections of docs/capacity.md and README's capacity block.

Each function renders one part of the page from scored points
(``capacity_scoring``): the per-profile table of SLO attainment and
capacities, the verdict against the 1.5x bar, why turns are slow at the
bar, where the TTFT goes under native offloading, the seed check, and the
README summary. No function runs the simulator."""

from __future__ import annotations

from typing import Any

from scripts.capacity_scoring import (
    BASE_ARMS, EVICTED_ARMS, GPUS, OFFLOAD_ARMS, PLUGIN_NATIVE_ARM, PREFETCH_ARM, SEED_CHECK_ARMS, SEED_CHECK_REFERENCE,
    SEED_CHECK_TIER, VICTIM_ARM,
    Slo, arm_series, attainment, capacity, misses, rates_run, reference_arm, static_cut,
)


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
        for a in (*OFFLOAD_ARMS, PREFETCH_ARM, static_cut("native-offload"), VICTIM_ARM, *EVICTED_ARMS):
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
               for a in ("continuum-native-offload", PREFETCH_ARM, "continuum-offload", VICTIM_ARM, *EVICTED_ARMS)
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
             "if every load had finished before its turn arrived: the most prefetching could give. What "
             "the turns wait for is room in the GPU pool: under the plugin (`continuum-native-offload`) a "
             "job's next turn whose context the tier holds does not wait for it behind younger jobs' "
             "decodes, which are preempted and reloaded from the tier when they resume "
             "(`preempt_for_turns`, docs/scheduling.md). `continuum-native-prefetch` is the plugin with "
             "`prefetch` on: a job's context is loaded back from the tier before its tool is predicted back "
             "(docs/offload.md).", "",
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
    measured: list[str] = []  # what prefetching gave, where it ran
    for tier, pts in per_tier.items():
        stock = next((p for p in pts if p["arm"] == "native-offload"), None)
        plugin = next((p for p in pts if p["arm"] == PLUGIN_NATIVE_ARM), None)
        for p in pts:
            if p["arm"] == PREFETCH_ARM and plugin is not None:
                within = "" if oracle is None else (
                    f", {'within' if p['ttft_mean_s'] <= 2 * oracle['ttft_mean_s'] else 'above'} 2x the oracle's")
                more = (": the turns waited longer for loads, not less" if round(p["load_wait_mean_s"], 2)
                        > round(plugin["load_wait_mean_s"], 2) else "")
                measured.append(f"at {tier} GiB mean TTFT {plugin['ttft_mean_s']:.2f} -> {p['ttft_mean_s']:.2f} s"
                                f"{within}, mean JCT {p['jct_mean_s'] / plugin['jct_mean_s'] - 1:+.1%}, mean load wait "
                                f"{plugin['load_wait_mean_s']:.2f} -> {p['load_wait_mean_s']:.2f} s{more}")
            load = p["load_wait_mean_s"]
            without = p["ttft_mean_s"] - load
            lines.append(f"| {p['arm']} ({tier} GiB) | {p['ttft_mean_s']:.2f} | {load:.2f} | "
                         f"{p['queue_mean_s'] - load:.2f} | {p['ttft_mean_s'] - p['queue_mean_s']:.2f} | "
                         f"{without:.2f} | {p['jct_mean_s']:.1f} |")
            if oracle is not None:
                bar = 2 * oracle["ttft_mean_s"]
                name = f"`{p['arm']}` at {tier} GiB"
                if p["arm"] != PREFETCH_ARM:  # what prefetching could give, for the arms without it
                    (already if p["ttft_mean_s"] <= bar else reachable if without <= bar else beyond).append(name)
                verdicts.append(f"{name}: {p['ttft_mean_s']:.2f} s, of which loads "
                                f"{load:.2f} s ({load / p['ttft_mean_s']:.0%}); without them {without:.2f} s, "
                                f"{'within' if without <= bar else 'above'} 2x the oracle's ({bar:.2f} s)"
                                + ("" if stock is None or p is stock else
                                   f"; mean JCT {p['jct_mean_s']:.1f} s against stock + native offloading's "
                                   f"{stock['jct_mean_s']:.1f} s ({p['jct_mean_s'] / stock['jct_mean_s'] - 1:+.1%})"))
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
    if measured:
        lines += [f"Prefetching as the plugin does it (`{PLUGIN_NATIVE_ARM}` -> `{PREFETCH_ARM}`): "
                  + "; ".join(measured) + ".", ""]
    return lines


# The arms of the TTFT check on other draws: the oracle (the bar is 2x its
# mean TTFT), stock + native offloading (what mean JCT must not exceed) and
# the plugin's two native-offloading arms.
TTFT_CHECK_ARMS = ("oracle", *NATIVE_ARMS, PREFETCH_ARM)


def ttft_seed_section(prof: str, rate: float, tier: str,
                      by_seed: dict[str, list[dict[str, Any]]]) -> tuple[list[str], list[str]]:
    """Mean TTFT of :data:`TTFT_CHECK_ARMS` at ``rate`` and ``tier`` GiB on
    each seed of ``by_seed`` (seed -> its points; seed 7's are the section
    above's), and over the seeds: within 2x the oracle's on each draw and
    on the mean, and the mean JCT against stock + native offloading's. One
    draw's mean TTFT can hinge on one burst where the sessions' contexts
    outgrow the pool (tens of seconds of queueing for a handful of turns),
    so the verdict is the seeds' mean, with each draw shown. Returns the
    page's lines and README's line on it (both empty when no draw has
    every arm)."""
    lines = [f"### Mean TTFT on other draws, {prof}, {tier} GiB, {rate:g} sessions/min", "",
             "The arms of the section above on other draws of sessions and arrivals (seeds of the same traces), "
             "each against its own oracle: one draw's mean TTFT can hinge on one burst in which the sessions' "
             "contexts outgrow the GPU pool and a few turns queue for tens of seconds (the oracle's pool never "
             "fills), so the verdict is on the mean over the draws. `2x oracle`: the bar.", "",
             "| seed | oracle s | 2x oracle s | " + " | ".join(f"{arm} s" for arm in TTFT_CHECK_ARMS[1:])
             + f" | {PREFETCH_ARM} JCT vs stock + native |",
             "|---|" + "---:|" * (len(TTFT_CHECK_ARMS) + 2)]
    ttft: dict[str, list[float]] = {arm: [] for arm in TTFT_CHECK_ARMS}
    jct: dict[str, list[float]] = {arm: [] for arm in TTFT_CHECK_ARMS}
    within: dict[str, int] = {arm: 0 for arm in TTFT_CHECK_ARMS[1:]}
    seeds = []
    for seed, pts in by_seed.items():
        found = {arm: next((p for p in pts if p["arm"] == arm), None) for arm in TTFT_CHECK_ARMS}
        if any(p is None for p in found.values()):
            continue  # a draw without every arm says nothing about the bar
        seeds.append(seed)
        for arm, p in found.items():
            ttft[arm].append(p["ttft_mean_s"])
            jct[arm].append(p["jct_mean_s"])
        bar = 2 * found["oracle"]["ttft_mean_s"]
        for arm in within:
            within[arm] += found[arm]["ttft_mean_s"] <= bar
        rel = found[PREFETCH_ARM]["jct_mean_s"] / found["native-offload"]["jct_mean_s"] - 1
        lines.append(f"| {seed} | {found['oracle']['ttft_mean_s']:.3f} | {bar:.3f} | "
                     + " | ".join(f"{found[arm]['ttft_mean_s']:.3f}" for arm in TTFT_CHECK_ARMS[1:])
                     + f" | {rel:+.2%} |")
    if not seeds:
        return [], []
    mean = {arm: sum(v) / len(v) for arm, v in ttft.items()}
    mean_jct = {arm: sum(v) / len(v) for arm, v in jct.items()}
    bar = 2 * mean["oracle"]
    vs_native = {arm: mean_jct[arm] / mean_jct["native-offload"] - 1 for arm in TTFT_CHECK_ARMS}
    rel = vs_native[PREFETCH_ARM]
    lines += [f"| mean of {len(seeds)} | {mean['oracle']:.3f} | {bar:.3f} | "
              + " | ".join(f"{mean[arm]:.3f}" for arm in TTFT_CHECK_ARMS[1:]) + f" | {rel:+.2%} |", ""]
    for arm in TTFT_CHECK_ARMS[1:]:
        verdict = (f"- `{arm}`: mean TTFT {mean[arm]:.3f} s over seeds {', '.join(seeds)}, "
                   f"{'within' if mean[arm] <= bar else 'above'} 2x the oracle's mean ({bar:.3f} s); "
                   f"within on {within[arm]} of {len(seeds)} draws")
        if arm != "native-offload":
            verdict += (f"; mean JCT {mean_jct[arm]:.1f} s against stock + native offloading's "
                        f"{mean_jct['native-offload']:.1f} s ({vs_native[arm]:+.2%})")
        lines.append(verdict + ".")
    lines.append("")
    readme = ["", f"Mean TTFT under native offloading, {prof}, {tier} GiB, {rate:g} sessions/min, over seeds "
              f"{', '.join(seeds)} (bar: 2x the oracle's {mean['oracle']:.2f} s = {bar:.2f} s): "
              + ", ".join(f"{arm} {mean[arm]:.2f} s" for arm in TTFT_CHECK_ARMS[1:])
              + f"; mean JCT of {PREFETCH_ARM} {rel:+.2%} against native-offload's."]
    return lines, readme


def _seed_capacity_cell(cap: float | None, rates: list[float]) -> str:
    """A capacity found on the check's ``rates``: below its lowest rate, or
    at least its highest (the check ran no rate above it)."""
    if cap is None:
        return f"< {rates[0]:g}/min"
    return f">= {cap:g}/min" if cap == rates[-1] else f"{cap:g}/min"


def _seed_ratio(cap: float | None, stock: float | None, rates: list[float]) -> str | None:
    """``cap`` over stock + native offloading's ``stock`` on the check's
    ``rates``, as a bound where either is outside them: stock below the
    lowest rate makes the ratio more than ``cap / lowest``; ``cap`` at the
    highest rate makes it at least ``cap / stock``. None: no ratio (the arm
    sustains none of the rates)."""
    if cap is None:
        return None
    if stock is None:
        return f"> {cap / rates[0]:.2f}x"
    return f"{'>= ' if cap == rates[-1] else ''}{cap / stock:.2f}x"


def seed_check_section(
    prof: str, tier: str, seed7: dict[str, float | None], checks: dict[str, tuple[dict[str, tuple[float, int]],
                                                                           list[dict[str, Any]]]], slo: Slo,
) -> tuple[list[str], dict[str, tuple[list[float], dict[str, float | None]]]]:
    """The seed check's table for ``prof`` at ``tier`` GiB: per arm of
    ``SEED_CHECK_ARMS``, its capacity and ratio over stock + native
    offloading on each seed of ``checks`` (seed -> its solo JCTs and
    points), with that seed's attainment per rate, beside seed 7's
    (``seed7``: the main sweep's capacities, by table name). A capacity
    outside the check's rates is shown as a bound (``< R``, ``>= R``), and
    so is a ratio that depends on one. Returns the lines and, per seed, the
    rates it ran and each arm's capacity (None: below the lowest rate)."""
    name = {arm: f"{arm} ({tier} GiB)" for arm in SEED_CHECK_ARMS}
    lines = [f"### Another draw of sessions, {prof}, {tier} GiB", "",
             "The same arms on other Claude Code sessions and arrival times (another seed of the same traces), at the "
             "rates around their capacities: does each ratio hold beyond seed 7's 50 sessions? Share of sessions "
             "keeping the SLO per rate, judged against each seed's own solo runs; a capacity outside the rates run "
             "here is a bound, and so is a ratio that depends on one.", ""]
    found: dict[str, tuple[list[float], dict[str, float | None]]] = {}
    for seed, (solo, pts) in checks.items():
        rates = rates_run(pts)
        shares = {arm: {r: attainment(p, solo, slo) for r, p in arm_series(pts, arm).items()}
                  for arm in SEED_CHECK_ARMS}
        caps = {arm: capacity(shares[arm], slo) for arm in SEED_CHECK_ARMS}
        stock, stock7 = caps[SEED_CHECK_REFERENCE], seed7.get(name[SEED_CHECK_REFERENCE])
        lines += [f"| arm (seed {seed}) | " + " | ".join(f"{r:g}/min" for r in rates)
                  + " | capacity | vs stock + native | seed 7: capacity | vs stock + native |",
                  "|---|" + "---:|" * (len(rates) + 4)]
        for arm in SEED_CHECK_ARMS:
            cells = ["-" if shares[arm].get(r) is None else f"{shares[arm][r]:.0%}" for r in rates]
            cap7, compared = seed7.get(name[arm]), arm != SEED_CHECK_REFERENCE
            ratio = _seed_ratio(caps[arm], stock, rates) if compared else None
            ratio7 = f"{cap7 / stock7:.2f}x" if cap7 and stock7 and compared else None
            lines.append(f"| {name[arm]} | " + " | ".join(cells) + f" | {_seed_capacity_cell(caps[arm], rates)} "
                         f"| {ratio or '-'} | {'none' if cap7 is None else f'{cap7:g}/min'} | {ratio7 or '-'} |")
        lines.append("")
        found[seed] = (rates, caps)
    return lines, found


def seed_check_readme(found: dict[str, dict[str, tuple[list[float], dict[str, float | None]]]]) -> list[str]:
    """README's line on the seed check: per profile and seed, the plugin
    arms' capacity ratios over stock + native offloading at
    ``SEED_CHECK_TIER`` GiB, bounds as the page gives them (empty when
    nothing was checked)."""
    parts = []
    for prof, by_seed in found.items():
        for seed, (rates, caps) in by_seed.items():
            stock = caps.get(SEED_CHECK_REFERENCE)
            cells = []
            for arm in (a for a in SEED_CHECK_ARMS if a != SEED_CHECK_REFERENCE):
                ratio = _seed_ratio(caps.get(arm), stock, rates)
                cells.append(f"{arm} " + (ratio or f"below {rates[0]:g}/min"))
            note = "" if stock is not None else f"; stock + native offloading below {rates[0]:g}/min"
            parts.append(f"{prof} (seed {seed}): " + ", ".join(cells) + note)
    if not parts:
        return []
    return ["", f"On another draw of sessions ({SEED_CHECK_TIER} GiB, over `{SEED_CHECK_REFERENCE}`): "
            + "; ".join(parts) + "."]


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
