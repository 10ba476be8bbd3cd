"""How long to keep a finished turn's KV cache pinned.

Two named policies, selectable with the ``ttl_policy`` setting:

``cdf`` (default) -- the Continuum paper's rule. For a turn whose reply calls
tool f, choose

    tau* = argmax_{tau in {0} U samples(f)}  P(tau, f) * (T * eta + R) - tau

where P is the empirical CDF of f's measured durations, T the recent queueing
delay of requests whose KV had been evicted, eta = -Corr(k, N-k) over
finished jobs, and R the cost of rebuilding this turn's context (prefill, or
reload from an offload store). Cold start: fewer than ``cold_start_samples``
samples in total -> ``default_ttl_s``; fewer for this tool -> the global
distribution; otherwise the tool's own.

``fixed`` -- the released fork's rule, kept for comparison: pin for
``fixed_ttl_s`` when the tool's mean duration is at most ``fixed_ttl_s``
(unknown tools count as fast), otherwise do not pin.

Both return a ``TTLDecision``; the result is clamped to [0, ``max_ttl_s``].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .history import ToolDurationHistory
from .prefill import PrefillCostModel

__all__ = [
    "CDFTTLPolicy",
    "FixedTTLPolicy",
    "TTLContext",
    "TTLDecision",
    "TTLPolicy",
    "hint_ttl",
    "make_ttl_policy",
]


@dataclass(frozen=True)
class TTLContext:
    """Inputs of one decision that come from the scheduler, not the history."""

    tool_key: str
    context_tokens: int
    queueing_delay_s: float
    eta: float
    # Measured cost of rebuilding this context when an offload connector
    # holds (part of) it; None = recompute, estimated by the prefill model.
    rebuild_seconds: float | None = None
    # The job's client overhead per round trip (``RoundTripOverhead``): a TTL
    # from the tool's own expected duration adds it (see ``hint_ttl``).
    round_trip_s: float = 0.0


@dataclass(frozen=True)
class TTLDecision:
    ttl_s: float
    source: str  # "default" | "global" | "tool" | "fixed" | "hint"


class TTLPolicy(Protocol):
    name: str

    def decide(self, ctx: TTLContext) -> TTLDecision: ...


class CDFTTLPolicy:
    """The paper's CDF rule (see module docstring).

    Cost: one numpy pass over at most ``max_samples`` sorted samples; the
    sorted array is cached by the history between inserts.
    """

    name = "cdf"

    def __init__(
        self,
        history: ToolDurationHistory,
        prefill: PrefillCostModel,
        default_ttl_s: float,
        max_ttl_s: float,
        cold_start_samples: int = 100,
    ) -> None:
        self.history = history
        self.prefill = prefill
        self.default_ttl_s = default_ttl_s
        self.max_ttl_s = max_ttl_s
        self.cold_start_samples = cold_start_samples

    def decide(self, ctx: TTLContext) -> TTLDecision:
        if self.history.num_samples() < self.cold_start_samples:
            return TTLDecision(min(self.default_ttl_s, self.max_ttl_s), "default")
        if self.history.num_samples(ctx.tool_key) >= self.cold_start_samples:
            samples, source = self.history.sorted_samples(ctx.tool_key), "tool"
        else:
            samples, source = self.history.sorted_samples(None), "global"
        rebuild = ctx.rebuild_seconds if ctx.rebuild_seconds is not None else self.prefill.seconds(ctx.context_tokens)
        benefit = ctx.queueing_delay_s * ctx.eta + rebuild
        return TTLDecision(best_tau(samples, benefit, self.max_ttl_s), source)


def hint_ttl(seconds: float, max_ttl_s: float, round_trip_s: float = 0.0) -> float:
    """TTL for a tool expected to take ``seconds`` whose client spends
    ``round_trip_s`` more before the next turn arrives: just past that
    arrival. Shared by every policy that trusts a duration estimate (client
    hints, ContextServe's rules and classifier)."""
    return min(max_ttl_s, (seconds + round_trip_s) * 1.2 + 0.05)


def best_tau(sorted_samples: np.ndarray, benefit_s: float, max_ttl_s: float) -> float:
    """argmax over {0} U samples<=max_ttl of P(tau) * benefit - tau.

    With samples s_1 <= ... <= s_n, P(s_i) = (number of samples <= s_i) / n;
    for ties the last index of a value gives its CDF, and taking the maximum
    over all indices picks it automatically because equal taus with larger
    i score higher.
    """
    n = sorted_samples.shape[0]
    if n == 0 or benefit_s <= 0:
        return 0.0
    limit = int(np.searchsorted(sorted_samples, max_ttl_s, side="right"))
    if limit == 0:
        return 0.0
    candidates = sorted_samples[:limit]
    scores = np.arange(1, limit + 1, dtype=np.float64) * (benefit_s / n) - candidates
    best = int(np.argmax(scores))
    return float(candidates[best]) if scores[best] > 0.0 else 0.0


class FixedTTLPolicy:
    """The released fork's rule: pin ``fixed_ttl_s`` iff mean(tool) <= it."""

    name = "fixed"

    def __init__(self, history: ToolDurationHistory, fixed_ttl_s: float = 2.0) -> None:
        self.history = history
        self.fixed_ttl_s = fixed_ttl_s

    def decide(self, ctx: TTLContext) -> TTLDecision:
        mean = self.history.mean(ctx.tool_key)
        if mean is not None and mean > self.fixed_ttl_s:
            return TTLDecision(0.0, "fixed")
        return TTLDecision(self.fixed_ttl_s, "fixed")


def make_ttl_policy(
    name: str,
    history: ToolDurationHistory,
    prefill: PrefillCostModel,
    *,
    default_ttl_s: float,
    max_ttl_s: float,
    fixed_ttl_s: float,
    cold_start_samples: int,
) -> TTLPolicy:
    if name == "cdf":
        return CDFTTLPolicy(history, prefill, default_ttl_s, max_ttl_s, cold_start_samples)
    if name == "fixed":
        return FixedTTLPolicy(history, fixed_ttl_s)
    raise ValueError(f"unknown ttl_policy {name!r}; expected 'cdf' or 'fixed'")
