"""What keeping a finished turn's context costs, and what rebuilding it costs.

A TTL weighs the two in one unit, GPU-seconds of work
(``estimators.ttl.TTLContext``, which :meth:`ContextCosts.ttl_context` fills
in): ``hold_price`` is the other requests' work that a second of holding the
context in GPU memory displaces, ``rebuild_seconds`` what its next turn pays
if the context is dropped (a reload from a second tier plus a prefill of the
rest on top of it, or ``None``: a prefill of all of it, which the TTL policy
prices itself); with them, what the
scheduler has measured: the queueing delay of turns whose context was not
kept (the paper's T), the turn-count correlation (eta) and the job's client
round trip.

Read-only: nothing here changes the block pool, the store, a tier or what
was measured.
"""

from __future__ import annotations

from typing import Any

from .estimators.history import JobState, SlidingMean, TurnCountCorrelation
from .estimators.prefill import PrefillCostModel
from .estimators.round_trip import RoundTripOverhead
from .estimators.ttl import TTLContext, hold_price, pool_pressure
from .foreign_tier import ForeignTier
from .offload_backend import OffloadBackend

__all__ = ["ContextCosts"]


class ContextCosts:
    """Prices of one scheduler's contexts (see module doc).

    ``offload`` is the plugin's offload connector, ``tier`` another
    connector's second tier (at most one of them is set)."""

    def __init__(
        self,
        block_pool: Any,
        block_size: int,
        prefill_cost: PrefillCostModel,
        offload: OffloadBackend | None,
        tier: ForeignTier | None,
        round_trip: RoundTripOverhead,
        queueing_delay: SlidingMean,
        turn_correlation: TurnCountCorrelation,
    ) -> None:
        self._pool = block_pool
        self._block_size = block_size
        self._prefill_cost = prefill_cost
        self._offload = offload
        self._tier = tier
        self._round_trip = round_trip
        self._queueing_delay = queueing_delay
        self._turn_correlation = turn_correlation

    def ttl_context(self, request: Any, tool_key: str, job: JobState | None, scope: str) -> TTLContext:
        """The inputs of the TTL decision for ``request``'s finished turn
        (its job's state ``job``, its client ``scope``)."""
        return TTLContext(
            tool_key=tool_key,
            context_tokens=request.num_tokens,
            queueing_delay_s=self._queueing_delay.mean(0.0),
            eta=self._turn_correlation.eta(),
            rebuild_seconds=self.rebuild_seconds(request),
            round_trip_s=self._round_trip.margin(job),
            round_trip_measured=self._round_trip.is_measured(job),
            hold_price=self.hold_price(request),
            scope=scope,
        )

    def hold_price(self, request: Any) -> float:
        """GPU-seconds of the others' work that a second of holding
        ``request``'s context displaces (``estimators.ttl.hold_price``): its
        share of the pool (the hashed blocks a pin would keep) times the
        pressure of the other requests on the rest of the pool
        (``pool_pressure``: blocks neither free nor evictable -- running
        requests and pins -- less this context's own, which are still
        allocated while it is decided) times one GPU-second per second, the
        work rate of an engine that has work to do. A pool the context has
        to itself makes holding free; a pool the others fill charges a pin
        its share of the engine."""
        pool = self._pool
        usable = max(1, pool.num_gpu_blocks - 1)  # minus the null block
        blocks = min(len(request.block_hashes), request.num_tokens // self._block_size)
        used = min(1.0, max(0.0, pool.get_usage())) * usable
        return hold_price(blocks, usable, pool_pressure(used, blocks, usable))

    def rebuild_seconds(self, request: Any) -> float | None:
        """With the plugin's offload connector, rebuilding the context costs a
        reload of what the store holds plus a prefill of the rest; with
        another connector's tier, its learned reload cost (``tier``); None
        (a prefill) otherwise or while nothing is known."""
        if self._offload is None:
            if self._tier is not None:
                return self._tier.rebuild_seconds(request.num_tokens)
            return None
        per_token = self._offload.reload_seconds_per_token()
        if per_token is None:
            return None
        stored = self._offload.stored_prefix_tokens(request)
        # The rest is computed on top of the reloaded prefix: it attends to it.
        return per_token * stored + self._prefill_cost.seconds(max(0, request.num_tokens - stored), stored)
