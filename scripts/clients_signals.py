"""What each signal ``headers-only`` does not send is worth: a section of
docs/retention_clients.md (``scripts/clients_report.py``).

``headers-only`` sends a session id and nothing else; ``tagged`` sends a job
id per conversation (a sub-agent's its own), ``is_last_step`` on every
request and the tool name. The signal profiles (``benchmarks/sim/clients.py``)
replay ``headers-only``'s requests with one of the missing signals added:

* ``headers-last``: ``is_last_step: true`` on each conversation's last
  request (the session end; a batch harness knows it, a chat user does not);
* ``headers-own``: each sub-agent under a session id of its own instead of
  its parent's (Claude Code sends the parent's);
* ``headers-last-own``: both.

And what Claude Code really sends, ``claude-code`` (``CLAUDE_CODE_PROFILE``):
``headers-only``'s requests with each sub-agent's own id (``agent_id``, the
``x-claude-code-agent-id`` header Claude Code 2.1.328 sends on every request
of a sub-agent) beside its parent's session id.

Their prompts are ``headers-only``'s, which are the tagged client's, and
FCFS and the oracle read no metadata, so every profile's gap share here is
taken against the tagged client's FCFS and oracle at the same seed: the
signal profiles run Continuum only.
"""

from __future__ import annotations

from statistics import fmean

from benchmarks.stats import gap_closed

__all__ = ["CLAUDE_CODE_PROFILE", "SIGNAL_PROFILES", "signal_lines", "signal_summary"]

SIGNAL_PROFILES = ("headers-last", "headers-own", "headers-last-own")
CLAUDE_CODE_PROFILE = "claude-code"
# The rows of the section's table, in order: what is sent, then less to more.
_ROWS = ("headers-only", CLAUDE_CODE_PROFILE, *SIGNAL_PROFILES, "tagged")


def _versus(gap: float, tagged: float) -> str:
    """``gap`` against ``tagged``'s, in points."""
    if gap < tagged:
        return f"{(tagged - gap) * 100:.1f} points behind `tagged`"
    return f"{(gap - tagged) * 100:.1f} points ahead of `tagged`"


def _seed_gaps(by_seed: dict[int, list[dict]]) -> dict[str, list[float]]:
    """Per profile of the table (``_ROWS``), Continuum's gap share at each
    seed of ``by_seed`` in seed order; a missing point is an error naming it."""
    if not by_seed:
        raise ValueError("the signal profiles' section needs the points of at least one seed")
    gaps: dict[str, list[float]] = {client: [] for client in _ROWS}
    for seed in sorted(by_seed):
        by = {(p["client"], p["arm"]): p for p in by_seed[seed]}
        missing = [key for key in [("tagged", "fcfs"), ("tagged", "oracle"), *((c, "continuum") for c in _ROWS)]
                   if key not in by]
        if missing:
            raise ValueError(f"seed {seed}: no point for {', '.join(f'{c} {a}' for c, a in missing)}")
        fcfs_s, oracle_s = by[("tagged", "fcfs")]["jct_mean_s"], by[("tagged", "oracle")]["jct_mean_s"]
        for client in _ROWS:
            gaps[client].append(gap_closed(by[(client, "continuum")]["jct_mean_s"], fcfs_s, oracle_s))
    return gaps


def signal_summary(title: str, by_seed: dict[int, list[dict]]) -> str:
    """README's line for a workload's signal profiles: each profile's mean
    gap share over the seeds of ``by_seed``."""
    means = ", ".join(f"{client} {fmean(g):+.0%}" for client, g in _seed_gaps(by_seed).items())
    return f"- {title}: {means}"


def signal_lines(by_seed: dict[int, list[dict]]) -> list[str]:
    """The table (one row per profile of ``headers-only``, the signal
    profiles and ``tagged``; Continuum's gap share at each seed of
    ``by_seed`` and its mean), then a line per signal profile: its mean gap
    share's distance to ``tagged``'s and the share of ``headers-only``'s
    shortfall to ``tagged`` it recovers, each stated with its figures.

    ``by_seed``: seed -> the points there, holding the tagged client's FCFS,
    Continuum and oracle and Continuum under every profile of the table.
    A missing point is an error naming it."""
    seeds = sorted(by_seed)
    gaps = _seed_gaps(by_seed)
    rows = ["| client | " + " | ".join(f"seed {seed}" for seed in seeds) + " | mean gap closed |",
            "|---|" + "---:|" * (len(seeds) + 1)]
    for client in _ROWS:
        rows.append(f"| {client} | " + " | ".join(f"{g:+.1%}" for g in gaps[client])
                    + f" | {fmean(gaps[client]):+.1%} |")
    tagged, plain = fmean(gaps["tagged"]), fmean(gaps["headers-only"])
    shortfall = tagged - plain
    lines = ["", f"`headers-only`: {_versus(plain, tagged)} on the mean."]
    for client in (CLAUDE_CODE_PROFILE, *SIGNAL_PROFILES):
        mean = fmean(gaps[client])
        text = f"- `{client}`: {mean:+.1%}, {_versus(mean, tagged)}"
        gained = mean - plain
        if shortfall > 0 and gained >= shortfall:  # a share over 100% would read as a typo
            text += f"; it closes `headers-only`'s {shortfall * 100:.1f}-point shortfall"
        elif shortfall > 0:
            text += f"; {gained / shortfall:.0%} of `headers-only`'s {shortfall * 100:.1f}-point shortfall recovered"
        lines.append(text + ".")
    return [*rows, *lines]
