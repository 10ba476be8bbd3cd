"""The client profiles docs/retention_clients.md judges, and the "Real
traffic" issue's bars it judges them by (``scripts/clients_report.py``,
``scripts/clients_seeds.py``).

Invariants: a profile compared with the fixed caps is compared over the
prompts it sends itself (``PROMPTS_OF``); a verdict line states its figure
and whether its bar holds (:func:`check`).
"""

from __future__ import annotations

from scripts.clients_signals import SIGNAL_PROFILES

__all__ = [
    "CAP_CLIENTS", "CAP_ORDER", "CLIENT_PROFILES", "LAST_STEP_PROFILE", "LOW_LOAD_TOLERANCE",
    "NO_HEADER_PROFILES", "PROMPTS_OF", "SPREAD_GAP", "SPREAD_SPEEDUP", "TAGGED_TOLERANCE", "best_cap", "check",
]

CLIENT_PROFILES = ("tagged", "headers-only", "aiperf", "reasoning")
# The same clients without any session id (``no-header``: ``headers-only``'s
# requests; ``aiperf-no-header``: ``aiperf``'s): the plugin has only the
# prompts to go by (implicit jobs). Their own points, beside the others.
NO_HEADER_PROFILES = ("no-header", "aiperf-no-header")
# ``aiperf`` with each conversation's last request flagged (``is_last_step``):
# run at the high loads beside the profiles above, to tell how much of the
# ``aiperf`` client's shortfall is the session end it never sends.
LAST_STEP_PROFILE = "aiperf-last-step"
# The fixed caps run under the tagged client's prompts and, in a point of
# their own, under those of the profiles whose prompts differ from them
# (``CAP_CLIENTS``): a cap is the stock scheduler, which reads no metadata,
# so a profile is compared with the caps over the prompts it sends itself
# (``PROMPTS_OF``: whose prompts a profile sends, where they are another's).
CAP_CLIENTS = ("aiperf", "reasoning")
CAP_ORDER = ("tagged", *CAP_CLIENTS)  # the caps' rows, by whose prompts they ran over
PROMPTS_OF = {"headers-only": "tagged", "no-header": "tagged",
              LAST_STEP_PROFILE: "aiperf", "aiperf-no-header": "aiperf",
              **{signal: "tagged" for signal in SIGNAL_PROFILES}}
# The bars.
TAGGED_TOLERANCE = 0.05  # gap share a profile may trail the tagged client by
LOW_LOAD_TOLERANCE = 0.01  # mean JCT against FCFS at low load
SPREAD_SPEEDUP, SPREAD_GAP = 2.0, 0.75  # headers-only on the spread preset, high load


def best_cap(caps: list[dict], client: str) -> dict:
    """The fastest fixed cap over the prompts ``client`` sends (those of the
    profile whose prompts it sends, ``PROMPTS_OF``, else its own)."""
    prompts = PROMPTS_OF.get(client, client)
    mine = [p for p in caps if p["client"] == prompts]
    if not mine:
        raise ValueError(f"no fixed-cap points under the {prompts!r} client's prompts (for {client!r})")
    return min(mine, key=lambda p: p["jct_mean_s"])


def check(ok: bool, text: str) -> str:
    """``text`` with the verdict of its bar: holds or misses."""
    return f"{text}: **{'holds' if ok else 'misses'}**"
