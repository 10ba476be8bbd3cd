"""How long to keep a finished turn's KV cache pinned.

Three named policies, selectable with the ``ttl_policy`` setting
(``config.ContinuumConfig.ttl_policy``, default ``priced``):

``cdf`` -- the Continuum paper's rule. For a turn whose reply calls
tool f, choose

    tau* = argmax_{tau in {0} U samples(f)}  P(tau, f) * (T * eta + R) - tau

where P is the empirical CDF of f's measured durations, T the recent queueing
delay of requests whose KV had been evicted, eta = -Corr(k, N-k) over
finished jobs, and R the cost of rebuilding this turn's context (prefill, or
reload from an offload store). Cold start: fewer than ``cold_start_samples``
samples in total -> ``default_ttl_s``, plus the client's round trip once it
has been measured (``TTLContext.round_trip_measured``: the default is a
guess at the tool's own time, and the next turn also waits for the client;
before a measurement the default stands alone, as it always did); fewer
for this tool -> the global distribution (measured gaps: they hold the
round trip already); otherwise the tool's own.

``priced`` (default) -- the same candidates, cold start and fallbacks, with
both sides priced in one unit, GPU-seconds of work:

    tau* = argmax_{tau in {0} U samples(f)}  P(tau, f) * R - tau * hold_price

* saved: R, the GPU-seconds a rebuild costs if the context is dropped and
  the next turn arrives (``PrefillCostModel.seconds(context)``, which counts
  attention, so R grows faster than the context; or the measured reload from
  a tier, ``TTLContext.rebuild_seconds``). The paper's ``T * eta`` is left
  out: it is this job's wait, not work, and the plugin's job order
  (``job_priority_window_s``) keeps a returning turn's place anyway;
* displaced: ``hold_price`` GPU-seconds of other jobs' work per second held
  (``hold_price()``): the pin's share of the pool's blocks times the pool's
  pressure (how full the rest of the pool is with other jobs' blocks,
  ``pool_pressure()``) times the rate of work the pool serves (1 GPU-second
  per second for an engine with work to do).

A pin's share grows linearly with its context and R, once the prefill fit
has an attention term, faster, so bigger contexts are held longer (priced
linearly, the size would cancel out); a fuller pool and slower tools
shorten the hold, down to 0. An idle pool (pressure 0) makes holding free: every pin is held up to the
tool's longest observed return (soft pins give way the moment memory is
needed). ``hold_price`` 1 with ``T * eta`` added back is the paper's rule.

``fixed`` -- the released fork's rule, kept for comparison: pin for
``fixed_ttl_s`` when the tool's mean duration is at most ``fixed_ttl_s``
(unknown tools count as fast), otherwise do not pin.

Each returns a ``TTLDecision``; the result is clamped to [0, ``max_ttl_s``].

Scopes: the scheduler keeps one history per client scope
(``ScopedToolHistory``) and asks a ``ScopedTTLPolicy``, which runs the rule
above on the asking scope's own samples, or, while that scope is cold, on a
robust prior over other scopes (``estimators.scopes``); with one scope
every TTL is the unscoped rule's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .history import ToolDurationHistory
from .prefill import PrefillCostModel
from .scopes import DEFAULT_SCOPE, ScopeTable, shared_prior

__all__ = [
    "CDFTTLPolicy",
    "FixedTTLPolicy",
    "PricedTTLPolicy",
    "ScopedToolHistory",
    "ScopedTTLPolicy",
    "TTLContext",
    "TTLDecision",
    "TTLPolicy",
    "hint_ttl",
    "hold_price",
    "make_ttl_policy",
    "pool_pressure",
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
    # Whether ``round_trip_s`` was measured (``RoundTripOverhead.is_measured``:
    # this job's samples or the server's) rather than the configured default.
    # The CDF rule's cold-start TTL adds it only then, so that a server that
    # has measured nothing decides exactly as before.
    round_trip_measured: bool = False
    # GPU-seconds of other jobs' work displaced per second the context is
    # held (``hold_price()``: pool share x pressure x work rate). ``priced``
    # reads it; the paper's rule charges 1.0 whatever it says.
    hold_price: float = 1.0
    # The client scope the turn came from (``estimators.scopes``): a
    # ``ScopedTTLPolicy`` decides from that scope's own samples first.
    scope: str = DEFAULT_SCOPE


@dataclass(frozen=True)
class TTLDecision:
    ttl_s: float
    source: str  # "default" | "global" | "tool" | "fixed" | "hint"


class TTLPolicy(Protocol):
    name: str

    def decide(self, ctx: TTLContext) -> TTLDecision: ...


class CDFTTLPolicy:
    """The paper's CDF rule (see module docstring).

    Cost: a decision is ``best_tau`` over the tool's sorted samples (kept
    sorted by the history: a few vectorised passes, no sort). Decisions are
    cached per sample set (``_SortedSamples.version``): an unchanged history
    answers from the cache when the benefit is one already seen or lies in
    the interval over which the cached answer stays optimal
    (``_DecisionCache``), so only the first decision after a new sample pays
    the numpy passes.
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
        # One cache per sample set (tool key, or None for the global pool);
        # bounded like the history's tool keys (stale ones are replaced).
        # ``ScopedTTLPolicy`` lowers the bound to share it among scopes.
        self._caches: dict[str | None, _DecisionCache] = {}
        self.max_caches = 2 * history.max_tools + 2

    def decide(self, ctx: TTLContext) -> TTLDecision:
        history = self.history
        if history.num_samples() < self.cold_start_samples:
            return TTLDecision(self.cold_start_ttl(ctx), "default")
        key: str | None = ctx.tool_key
        samples = history.samples(key)
        source = "tool"
        if samples is None or len(samples) < self.cold_start_samples:
            key, samples, source = None, history.samples(None), "global"
        assert samples is not None
        rebuild = ctx.rebuild_seconds if ctx.rebuild_seconds is not None else self.prefill.seconds(ctx.context_tokens)
        benefit = self._benefit(rebuild, ctx)
        cache = self._caches.get(key)
        if cache is None or cache.version != samples.version:
            if cache is None and len(self._caches) >= self.max_caches:
                self._caches.clear()  # tool keys the history dropped
            cache = self._caches[key] = _DecisionCache(samples.version)
        return TTLDecision(cache.answer(samples.as_array(), benefit, self.max_ttl_s), source)

    def cold_start_ttl(self, ctx: TTLContext) -> float:
        """TTL before ``cold_start_samples`` gaps are measured:
        ``default_ttl_s`` plus the measured client round trip (nothing when
        it is not measured, or not a finite number >= 0), at most
        ``max_ttl_s``. Never below ``min(default_ttl_s, max_ttl_s)``."""
        round_trip = ctx.round_trip_s if ctx.round_trip_measured else 0.0
        if not (math.isfinite(round_trip) and round_trip > 0.0):
            round_trip = 0.0
        return min(self.default_ttl_s + round_trip, self.max_ttl_s)

    def _benefit(self, rebuild_s: float, ctx: TTLContext) -> float:
        """What ``best_tau`` weighs against a held second. The paper's rule:
        the rebuild plus the job's lost place, ``T * eta``; a second held
        costs a second."""
        return ctx.queueing_delay_s * ctx.eta + rebuild_s


# The smallest hold price ``priced`` divides by. A pool with no pressure
# makes holding free (price 0) and the quotient infinite; at this floor a
# rebuild of R GPU-seconds buys R * 1e6 held seconds per unit of return
# probability (a 20 ms rebuild: a step of 1/100 in the CDF is worth 200 s),
# so in practice the hold runs to the longest return within ``max_ttl_s``.
MIN_HOLD_PRICE = 1e-6


def pool_pressure(used_blocks: float, pin_blocks: float, pool_blocks: float) -> float:
    """How full the rest of the pool is with other jobs' blocks, in [0, 1]:
    ``(used - pin) / (pool - pin)``, where ``used`` counts every block in
    use (running requests and pins) including the ``pin_blocks`` of the
    context being decided, which are still allocated when it is decided.
    A context alone in the pool displaces nobody (0); a pool whose other
    blocks are all taken (1) displaces a block of other work for each block
    held. A context as large as the pool counts as fully pressured when
    anything else is in use."""
    others = max(0.0, used_blocks - pin_blocks)
    room = pool_blocks - pin_blocks
    if room <= 0.0:
        return 1.0 if others > 0.0 else 0.0
    return min(1.0, others / room)


def hold_price(pin_blocks: float, pool_blocks: float, pressure: float, work_rate_s: float = 1.0) -> float:
    """GPU-seconds of other jobs' work displaced per second a pin of
    ``pin_blocks`` is held: its share of the pool (``pin_blocks /
    pool_blocks``) times ``pressure`` (``pool_pressure``: the chance that a
    held block would be serving other work) times ``work_rate_s``, the
    GPU-seconds of work the pool serves per second (1 for one engine that
    has work to do). Non-finite or negative inputs count as 0 pressure or
    rate; the share is capped at 1."""
    if pool_blocks <= 0 or not math.isfinite(pin_blocks) or pin_blocks <= 0:
        return 0.0
    share = min(1.0, pin_blocks / pool_blocks)
    pressure = min(1.0, pressure) if math.isfinite(pressure) and pressure > 0.0 else 0.0
    rate = work_rate_s if math.isfinite(work_rate_s) and work_rate_s > 0.0 else 0.0
    return share * pressure * rate


class PricedTTLPolicy(CDFTTLPolicy):
    """The rule in GPU-seconds (see module docstring): ``argmax P(tau) * R -
    tau * hold_price``, with ``R`` the rebuild's GPU-seconds and
    ``hold_price`` the GPU-seconds of others' work a held second displaces;
    solved as the paper's rule on ``R / hold_price`` (same argmax, so the
    decision cache applies unchanged)."""

    name = "priced"

    def _benefit(self, rebuild_s: float, ctx: TTLContext) -> float:
        return rebuild_s / max(ctx.hold_price, MIN_HOLD_PRICE)


class _DecisionCache:
    """``best_tau`` answers for one version of one sorted sample set.

    ``best_tau`` maximises ``a * i - s_i`` over ranks ``i`` (``a = benefit /
    n``), a linear function of ``a``; the index that wins for ``a`` keeps
    winning on an interval of ``a`` that two more vectorised passes find. The
    first decision of a version pays one ``best_tau``; the second one with
    another benefit also computes the interval of its answer; later ones
    inside a known interval, or with a benefit already seen, are lookups.
    At most ``MAX_ENTRIES`` answers are kept per version.
    """

    MAX_ENTRIES = 16
    __slots__ = ("version", "_exact", "_intervals", "_misses")

    def __init__(self, version: int) -> None:
        self.version = version
        self._exact: dict[float, float] = {}
        self._intervals: list[tuple[float, float, float]] = []  # (lo, hi, tau) over benefit
        self._misses = 0

    def answer(self, samples: np.ndarray, benefit_s: float, max_ttl_s: float) -> float:
        tau = self._exact.get(benefit_s)
        if tau is not None:
            return tau
        for lo, hi, cached in self._intervals:
            if lo <= benefit_s <= hi:
                return cached
        self._misses += 1
        if self._misses == 1:
            tau = best_tau(samples, benefit_s, max_ttl_s)
        else:
            tau, lo, hi = best_tau_interval(samples, benefit_s, max_ttl_s)
            if len(self._intervals) < self.MAX_ENTRIES:
                self._intervals.append((lo, hi, tau))
        if len(self._exact) < self.MAX_ENTRIES:
            self._exact[benefit_s] = tau
        return tau


def hint_ttl(seconds: float, max_ttl_s: float, round_trip_s: float = 0.0) -> float:
    """TTL for a tool expected to take ``seconds`` whose client spends
    ``round_trip_s`` more before the next turn arrives: just past that
    arrival. Shared by every policy that trusts a duration estimate (client
    hints, ContextServe's rules and classifier)."""
    return min(max_ttl_s, (seconds + round_trip_s) * 1.2 + 0.05)


# Ranks 1..n as floats, shared by every decision (sliced, never written).
_RANKS = np.arange(1, 4097, dtype=np.float64)


def _ranks(n: int) -> np.ndarray:
    global _RANKS
    if n > _RANKS.shape[0]:
        _RANKS = np.arange(1, 2 * n + 1, dtype=np.float64)
    return _RANKS[:n]


def best_tau(sorted_samples: np.ndarray, benefit_s: float, max_ttl_s: float) -> float:
    """argmax over {0} U samples<=max_ttl of P(tau) * benefit - tau.

    With samples s_1 <= ... <= s_n, P(s_i) = (number of samples <= s_i) / n;
    for ties the last index of a value gives its CDF, and taking the maximum
    over all indices picks it automatically because equal taus with larger
    i score higher.
    """
    candidates, best = _best_rank(sorted_samples, benefit_s, max_ttl_s)
    return float(candidates[best]) if best >= 0 else 0.0


def _best_rank(sorted_samples: np.ndarray, benefit_s: float, max_ttl_s: float) -> tuple[np.ndarray, int]:
    """(samples <= max_ttl_s, index of the best-scoring one, or -1 when
    ``tau`` 0 wins)."""
    n = sorted_samples.shape[0]
    limit = int(sorted_samples.searchsorted(max_ttl_s, side="right")) if n else 0
    candidates = sorted_samples[:limit]
    if limit == 0 or benefit_s <= 0:
        return candidates, -1
    scores = _ranks(limit) * (benefit_s / n)
    scores -= candidates
    best = int(scores.argmax())
    return candidates, (best if scores[best] > 0.0 else -1)


def best_tau_interval(sorted_samples: np.ndarray, benefit_s: float, max_ttl_s: float) -> tuple[float, float, float]:
    """``best_tau`` plus the closed interval of benefits ``[lo, hi]`` over
    which its answer stays the optimum (``tau`` 0 included: it scores 0)."""
    n = sorted_samples.shape[0]
    candidates, best = _best_rank(sorted_samples, benefit_s, max_ttl_s)
    limit = candidates.shape[0]
    if limit == 0:
        return 0.0, -math.inf, math.inf
    ranks = _ranks(limit)
    if best < 0:
        # tau 0 wins up to the first benefit at which some rank breaks even.
        return 0.0, -math.inf, float((candidates / ranks).min()) * n
    # Rank k = best + 1 beats rank i iff a * (k - i) >= s_k - s_i, with
    # a = benefit / n, and beats tau 0 iff a * k > s_k.
    k = best + 1
    s_k = float(candidates[best])
    lo = s_k / k
    if best > 0:
        lo = max(lo, float(((s_k - candidates[:best]) / (k - ranks[:best])).max()))
    hi = math.inf
    if best + 1 < limit:
        hi = float(((candidates[best + 1:] - s_k) / (ranks[best + 1:] - k)).min())
    # Strictly inside the interval, so ties at its ends are recomputed.
    return s_k, lo * n * (1 + 1e-12) + 1e-12, hi * n * (1 - 1e-12)


class FixedTTLPolicy:
    """The released fork's rule: pin ``fixed_ttl_s`` iff mean(tool) <= it.

    Invariant: ``0 <= ttl_s <= max_ttl_s``. ``fixed_ttl_s`` is clamped to
    ``max_ttl_s`` once, as TTL and threshold alike, so the rule stays "pin
    for T iff the tool returns within T" with T the TTL actually held.
    """

    name = "fixed"

    def __init__(self, history: ToolDurationHistory, fixed_ttl_s: float = 2.0,
                 max_ttl_s: float = math.inf) -> None:
        self.history = history
        self.fixed_ttl_s = min(fixed_ttl_s, max_ttl_s)

    def decide(self, ctx: TTLContext) -> TTLDecision:
        mean = self.history.mean(ctx.tool_key)
        if mean is not None and mean > self.fixed_ttl_s:
            return TTLDecision(0.0, "fixed")
        return TTLDecision(self.fixed_ttl_s, "fixed")


# Decision caches (sample sets) each scope keeps at least (see ScopedTTLPolicy).
MIN_SCOPE_CACHES = 8


class ScopedToolHistory:
    """Measured tool durations, one ``ToolDurationHistory`` per client scope
    (see ``estimators.scopes``).

    Invariants: a sample teaches only the scope it is recorded under; each
    scope's history is bounded like an unscoped one (``max_samples`` per
    tool key and globally, ``max_tools`` keys); at most ``max_scopes``
    scopes are kept, and the samples held over all scopes exceed the
    unscoped bound ``(max_tools + 1) * max_samples`` only while one scope
    alone holds more (least recently active scopes are dropped first).
    """

    def __init__(self, max_samples: int = 4096, max_tools: int = 1024, max_scopes: int = 256) -> None:
        # Validates max_samples and max_tools with the unscoped errors.
        ToolDurationHistory(max_samples, max_tools)
        self.max_samples = max_samples
        self.max_tools = max_tools
        self._scopes: ScopeTable[ToolDurationHistory] = ScopeTable(
            lambda: ToolDurationHistory(max_samples, max_tools),
            max_scopes,
            max_units=(max_tools + 1) * max_samples,
            units=ToolDurationHistory.stored_samples,
        )

    @property
    def max_scopes(self) -> int:
        return self._scopes.max_scopes

    @property
    def scopes(self) -> ScopeTable[ToolDurationHistory]:
        return self._scopes

    def record(self, tool_key: str, seconds: float, scope: str = DEFAULT_SCOPE) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return  # clock skew: no sample, and no scope created for it
        self._scopes.touch(scope).record(tool_key, seconds)
        self._scopes.update_units(scope)

    def get(self, scope: str = DEFAULT_SCOPE) -> ToolDurationHistory | None:
        """The scope's own history, or None when it has recorded nothing
        (or was dropped)."""
        return self._scopes.get(scope)

    def num_samples(self, tool_key: str | None = None, scope: str = DEFAULT_SCOPE) -> int:
        history = self._scopes.get(scope)
        return history.num_samples(tool_key) if history is not None else 0

    def stored_samples(self) -> int:
        """Samples held over all scopes."""
        return self._scopes.total_units


class ScopedTTLPolicy:
    """A TTL policy per client scope, with a shared prior (see
    ``estimators.scopes``).

    ``decide(ctx)`` for ``ctx.scope``:

    1. the scope is warm (its own history holds ``cold_start_samples``): its
       own policy on its own samples -- the unscoped rule, unchanged;
    2. else, when ``PRIOR_QUORUM`` other warm scopes exist: the low median of
       their own policies' TTLs for the same context (``shared_prior``; one
       vote per scope, source ``"prior"``);
    3. else the scope's own policy (its cold start: ``default_ttl_s`` plus a
       measured round trip for the CDF rules).

    With one scope, step 2 never applies: every TTL is the unscoped one.
    Cost: step 1 is one cached decision; step 2 at most ``MAX_PRIOR_VOTERS``
    of them, each answered from its scope's decision cache while that
    scope's samples are unchanged. The decision caches of all scopes share
    the unscoped bound (``2 * max_tools + 2`` sample sets), at least
    ``MIN_SCOPE_CACHES`` per scope: caches change what a decision costs,
    never what it answers.
    """

    def __init__(
        self,
        history: ScopedToolHistory,
        make_policy: Callable[[ToolDurationHistory], TTLPolicy],
        cold_start_samples: int,
    ) -> None:
        self.history = history
        self.cold_start_samples = cold_start_samples
        self._make_policy = make_policy
        # Per scope: the policy bound to that scope's current history.
        self._policies: dict[str, TTLPolicy] = {}
        # A scope that has recorded nothing decides on an empty history.
        self._cold = make_policy(ToolDurationHistory(1, 1))
        self.name = self._cold.name
        self._cache_budget = 2 * history.max_tools + 2

    def is_warm(self, history: ToolDurationHistory) -> bool:
        return history.num_samples() >= self.cold_start_samples

    def decide(self, ctx: TTLContext) -> TTLDecision:
        own = self.history.get(ctx.scope)
        if own is not None and self.is_warm(own):
            return self._policy(ctx.scope, own).decide(ctx)
        voters = self.history.scopes.voters(ctx.scope, self.is_warm)
        if voters:
            prior = shared_prior([self._policy(scope, h).decide(ctx).ttl_s for scope, h in voters])
            if prior is not None:
                return TTLDecision(prior, "prior")
        if own is None:
            return self._cold.decide(ctx)
        return self._policy(ctx.scope, own).decide(ctx)

    def _policy(self, scope: str, history: ToolDurationHistory) -> TTLPolicy:
        policy = self._policies.get(scope)
        if policy is None or getattr(policy, "history", None) is not history:
            # New scope, or a scope dropped and created again: a fresh policy
            # (its decision caches belong to the old samples).
            if len(self._policies) >= 2 * self.history.max_scopes:
                live = self.history.scopes
                self._policies = {name: p for name, p in self._policies.items() if name in live}
            policy = self._policies[scope] = self._make_policy(history)
        if hasattr(policy, "max_caches"):
            policy.max_caches = max(MIN_SCOPE_CACHES, self._cache_budget // max(1, len(self.history.scopes)))
        return policy


def make_ttl_policy(
    name: str,
    history: ToolDurationHistory | ScopedToolHistory,
    prefill: PrefillCostModel,
    *,
    default_ttl_s: float,
    max_ttl_s: float,
    fixed_ttl_s: float,
    cold_start_samples: int,
) -> TTLPolicy:
    """The policy ``name`` over ``history``; over a ``ScopedToolHistory``,
    that policy per scope with the shared prior (``ScopedTTLPolicy``)."""
    if isinstance(history, ScopedToolHistory):
        if name not in ("priced", "cdf", "fixed"):
            raise ValueError(f"unknown ttl_policy {name!r}; expected 'priced', 'cdf' or 'fixed'")

        def per_scope(scope_history: ToolDurationHistory) -> TTLPolicy:
            return make_ttl_policy(
                name, scope_history, prefill, default_ttl_s=default_ttl_s, max_ttl_s=max_ttl_s,
                fixed_ttl_s=fixed_ttl_s, cold_start_samples=cold_start_samples,
            )

        return ScopedTTLPolicy(history, per_scope, cold_start_samples)
    if name == "priced":
        return PricedTTLPolicy(history, prefill, default_ttl_s, max_ttl_s, cold_start_samples)
    if name == "cdf":
        return CDFTTLPolicy(history, prefill, default_ttl_s, max_ttl_s, cold_start_samples)
    if name == "fixed":
        return FixedTTLPolicy(history, fixed_ttl_s, max_ttl_s)
    raise ValueError(f"unknown ttl_policy {name!r}; expected 'priced', 'cdf' or 'fixed'")
