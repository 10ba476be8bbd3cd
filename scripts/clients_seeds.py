"""The high loads at every arrival seed: a section of
docs/retention_clients.md per seeded workload (``scripts/clients_report.py``).

One seed's verdict can turn on a TTL decided milliseconds apart, so the
report runs the high loads again at more seeds and judges the mean: each
profile's mean gap share within 5 points of ``tagged``'s, faster than FCFS
at every seed, and (with the fixed caps at every seed) ahead of the best
cap on the mean of its ratios to it.
"""

from __future__ import annotations

from statistics import fmean

from scripts.clients_bars import (
    CAP_ORDER,
    CLIENT_PROFILES,
    NO_HEADER_PROFILES,
    SPREAD_GAP,
    SPREAD_SPEEDUP,
    TAGGED_TOLERANCE,
    best_cap,
    check,
)

__all__ = ["seed_cap_lines", "seed_lines", "seed_summary"]


def seed_lines(by_seed: dict[int, list[dict]], caps_by_seed: dict[int, list[dict]] | None = None,
               spread: bool = False) -> list[str]:
    """The high load at every seed of ``by_seed`` (seed -> the profiles'
    points): per profile (those of ``CLIENT_PROFILES`` and
    ``NO_HEADER_PROFILES`` that ran at every seed) Continuum's gap share and
    speed-up over its FCFS at each seed and the mean gap share, then the
    bars on the mean (within 5 points of ``tagged``'s mean) and on every
    seed (faster than FCFS), each stated with its figures; ``spread``: also
    ``headers-only``'s (>= 2x FCFS at every seed, >= 75% of the gap on the
    mean). With ``caps_by_seed`` (seed -> the fixed caps' points there), a
    table of each profile against the best cap over its prompts at each
    seed, and the bar on the mean of those ratios (ahead of the best cap)."""
    seeds = sorted(by_seed)
    by = _by_seed(by_seed)
    clients = _seed_clients(by_seed)
    rows = ["| client | " + " | ".join(f"seed {seed}" for seed in seeds) + " | mean gap closed |",
            "|---|" + "---:|" * (len(seeds) + 1),
            "| FCFS (tagged): JCT mean, hit share | " + " | ".join(
                f"{by[(seed, 'tagged', 'fcfs')]['jct_mean_s']:.0f} s, {by[(seed, 'tagged', 'fcfs')]['hit_share']:.0%}"
                for seed in seeds) + " | |"]
    gaps = _seed_gaps(by_seed, clients)
    means = {client: fmean(g) for client, g in gaps.items()}
    speedups = {client: [by[(seed, client, "fcfs")]["jct_mean_s"] / by[(seed, client, "continuum")]["jct_mean_s"]
                         for seed in seeds] for client in clients}
    for client in clients:
        cells = [f"{g:+.1%} ({x:.2f}x)" for g, x in zip(gaps[client], speedups[client])]
        rows.append(f"| {client} | " + " | ".join(cells) + f" | {means[client]:+.1%} |")
    lines = [*rows, ""]
    for client in clients:
        within = sum(g >= t - TAGGED_TOLERANCE for g, t in zip(gaps[client], gaps["tagged"]))
        checks = [] if client == "tagged" else [
            check(means[client] >= means["tagged"] - TAGGED_TOLERANCE,
                   f"mean gap {means[client]:+.1%} against tagged's {means['tagged']:+.1%} (within 5 points; "
                   f"{within} of {len(seeds)} seeds within)")]
        checks.append(check(min(speedups[client]) > 1.0,
                             f"{min(speedups[client]):.2f}x FCFS at its slowest seed (faster on every seed)"))
        if spread and client == "headers-only":
            checks += [check(min(speedups[client]) >= SPREAD_SPEEDUP,
                              f"{min(speedups[client]):.2f}x lower mean JCT at its slowest seed (>= 2x)"),
                       check(means[client] >= SPREAD_GAP, f"{means[client]:.1%} of the gap on the mean (>= 75%)")]
        lines.append(f"- `{client}` continuum: " + "; ".join(checks) + ".")
    if caps_by_seed:
        lines += ["", *seed_cap_lines(by_seed, caps_by_seed, clients)]
    return lines


def seed_cap_lines(by_seed: dict[int, list[dict]], caps_by_seed: dict[int, list[dict]],
                   clients: list[str]) -> list[str]:
    """Each profile of ``clients`` against the best fixed cap over the
    prompts it sends, at every seed (the cap chosen per seed: the best a
    client that knew the load in advance could set), and the bar on the mean
    of the ratios: ahead of the best cap."""
    seeds = sorted(by_seed)
    by = _by_seed(by_seed)
    caps = {seed: {c: best_cap(caps_by_seed[seed], c) for c in clients} for seed in seeds}
    rows = ["| client | " + " | ".join(f"seed {seed}" for seed in seeds) + " | mean |",
            "|---|" + "---:|" * (len(seeds) + 1)]
    for prompts in CAP_ORDER:
        if all(any(p["client"] == prompts for p in caps_by_seed[seed]) for seed in seeds):
            cells = [f"`{caps[seed][prompts]['arm']}` {caps[seed][prompts]['jct_mean_s']:.1f} s" for seed in seeds]
            rows.append(f"| best cap over `{prompts}`'s prompts | " + " | ".join(cells) + " | |")
    ratios = {c: [by[(seed, c, "continuum")]["jct_mean_s"] / caps[seed][c]["jct_mean_s"] - 1 for seed in seeds]
              for c in clients}
    for c in clients:
        rows.append(f"| {c} | " + " | ".join(f"{r:+.1%}" for r in ratios[c]) + f" | {fmean(ratios[c]):+.1%} |")
    lines = ["Continuum's mean JCT against the best fixed cap over the prompts each profile sends, at each",
             "seed (the cap chosen per seed, as a client that knew the load in advance would set it):", "",
             *rows, ""]
    for c in clients:
        ahead = sum(r < 0 for r in ratios[c])
        lines.append(f"- `{c}` continuum: " + check(
            fmean(ratios[c]) < 0,
            f"{fmean(ratios[c]):+.1%} against the best cap on the mean (ahead; {ahead} of {len(seeds)} seeds ahead)")
            + ".")
    return lines


def _by_seed(by_seed: dict[int, list[dict]]) -> dict[tuple[int, str, str], dict]:
    return {(seed, p["client"], p["arm"]): p for seed in by_seed for p in by_seed[seed]}


def _seed_clients(by_seed: dict[int, list[dict]]) -> list[str]:
    """The profiles (``CLIENT_PROFILES``, then ``NO_HEADER_PROFILES``) whose
    Continuum ran at every seed of ``by_seed``."""
    by = _by_seed(by_seed)
    return [c for c in (*CLIENT_PROFILES, *NO_HEADER_PROFILES)
            if all((seed, c, "continuum") in by for seed in by_seed)]


def _seed_gaps(by_seed: dict[int, list[dict]], clients: tuple[str, ...] | list[str] = CLIENT_PROFILES,
               ) -> dict[str, list[float]]:
    """Per client profile, Continuum's gap share at each seed (in seed order)."""
    by = _by_seed(by_seed)
    return {client: [by[(seed, client, "continuum")]["gap_closed"] for seed in sorted(by_seed)]
            for client in clients}


def seed_summary(title: str, by_seed: dict[int, list[dict]]) -> str:
    """README's line for a point run at several seeds: each profile's mean
    gap share over them."""
    means = ", ".join(f"{client} {fmean(g):+.0%}" for client, g in _seed_gaps(by_seed).items())
    return f"- {title}: {means}"
