"""Declared retention applied: a finished request's blocks as its client declared.

The scheduler decides what a finished turn becomes (``turn_outcome``, the
TTL policy); when the request carried retention directives (``retention``),
:class:`DeclaredHolds` applies them to its blocks in place of that decision
for the blocks they cover, in one place for every outcome (an agent turn, a
final answer, chat):

* the plan keeps leading blocks: they become a pin (``pin_manager``) in
  stages -- under the request's job, whose next turn takes it over like
  any pin, or, with no job to hand it to, under a key no client can name,
  so it only lapses or yields;
* blocks the directives rank below the default go to the front of the free
  queue (``eviction_order.evict_first``);
* otherwise the caller frees the blocks as it would have.

Invariants: only a request that finished normally (stopped or length-capped)
is held -- a preempted, aborted or failed one never; every block of the
request is either pinned or freed exactly once (by the pin manager or by
``free``, never both); with ``retention_max_s`` 0 nothing here acts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from vllm.v1.request import Request, RequestStatus

from .eviction_order import evict_first
from .metrics import EngineMetrics
from .pin_manager import PinManager
from .request_record import request_meta

logger = logging.getLogger("vllm.continuum_plugin")

__all__ = ["DECLARED_HOLD", "DeclaredHolds"]

# Key prefix of a declared hold that no job takes over (non-printable: no
# client job id can name it, see ``metadata.parse_job_id``).
DECLARED_HOLD = "\x00declared:"
_FINISHED = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)


class DeclaredHolds:
    """Applies a finished request's declared retention (module doc)."""

    def __init__(
        self,
        kv_cache_manager: Any,
        pins: PinManager,
        metrics: EngineMetrics,
        block_size: int,
        max_hold_s: float,
        rank: Callable[[Request], float],
        free: Callable[[Request], None],
    ) -> None:
        self._kv_cache_manager = kv_cache_manager
        self._pins = pins
        self._metrics = metrics
        self._block_size = block_size
        self._max_hold_s = max_hold_s
        self._rank = rank  # a request's job-level arrival (pressure order)
        self._free = free  # the scheduler's stock free of a request's blocks

    def free(self, request: Request, job_id: str | None = None) -> None:
        """Free ``request``'s blocks where the policy holds none of them:
        as it declared (:meth:`apply`; a hold goes to ``job_id``'s next turn
        when given), else as stock vLLM does."""
        if not self.apply(request, job_id, 0.0):
            self._free(request)

    def apply(self, request: Request, job_id: str | None, policy_ttl_s: float,
              tool_key: str = "declared", fence: int | None = None) -> bool:
        """Hold or free ``request``'s blocks as it declared; ``policy_ttl_s``
        is the policy's TTL for the blocks no directive covers (0: it holds
        nothing), ``job_id`` the job whose next turn may take the hold over
        (None: none). Returns True when it took the blocks (pinned or
        freed); False leaves them to the caller."""
        retention = request_meta(request).retention
        if retention is None or self._max_hold_s <= 0 or request.status not in _FINISHED:
            return False
        plan = retention.plan(request.num_prompt_tokens, request.num_tokens, self._block_size,
                              self._max_hold_s, policy_ttl_s)
        blocks = self._kv_cache_manager.get_blocks(request.request_id).blocks
        pool = self._kv_cache_manager.block_pool
        if plan.keep_blocks == 0:
            if plan.evict_from is None:
                self._metrics.on_directives()
                return False
            self._free(request)
            self._metrics.on_directives(evict_first(pool, blocks, plan.evict_from))
            return True
        pins = self._pins
        if job_id is None or (job_id in pins and pins.get(job_id).request_id != request.request_id):
            # No job to hand the hold to (or its pin holds another branch).
            job_id = DECLARED_HOLD + request.request_id
        pin = pins.pin(request, job_id, self._rank(request), plan.stages[0][0], tool_key,
                       fence=fence, stages=plan.stages, declared_after_s=plan.declared_after_s)
        moved = evict_first(pool, blocks, plan.evict_from) if plan.evict_from is not None else 0
        self._metrics.on_directives(moved)
        logger.debug("continuum: request %s declared retention: %d blocks held in %d stage(s) up to %.1fs%s",
                     request.request_id, pin.num_blocks if pin is not None else 0, len(plan.stages),
                     plan.stages[-1][0], "" if plan.evict_from is None else f", blocks from {plan.evict_from} first out")
        return True
