"""What leaves vLLM's native host tier first: the contexts of ended jobs.

vLLM's native CPU offloading (``OffloadingConnector``, ``--kv-offloading-size``)
keeps its host tier in LRU order (``LRUCachePolicy``, the default
``eviction_policy``), and a request's finish counts as a use: the policy's
``on_request_finished`` makes every block the request touched the most
recent in the tier. For a job's last turn that is the wrong way round: the
context of a job that is over outlives, in the tier, the contexts of agents
whose tools are still running, which then lose them first and rebuild them
from scratch when they return. The GPU side has the same flaw and the plugin
already corrects it there (``eviction_order.evict_first``).

:class:`FinishedFirstLRUCachePolicy` is vLLM's LRU policy plus one call,
:meth:`~FinishedFirstLRUCachePolicy.mark_finished`: when the marked
request's finish reaches the policy, its blocks past the first
``keep_tokens`` (the prefix its job found already cached -- a system prompt,
a tool list -- which later jobs will ask for) rank below every other block:
they are the tier's first victims, the earliest marked first. A later
request that reads them (a follow-up that does come) makes them recent again,
as LRU does.

The scheduler marks a turn that ends its job (``is_last_step``, a finish
action, a final answer of a job that called no tool), as it moves the same
blocks first out of the GPU's prefix cache. Not an answer after tool calls
(``answered``): its session may follow it up, and its context may be the
prefix of a sibling sub-agent's; in the simulator on the Claude Code traces
(64 GiB tier, session-header client) marking answers too cut the tokens
rebuilt on H100 8B at 0.4-0.525 sessions/min but raised them on 70B TP4 at
0.5 (214k -> 831k tokens, mean JCT +1.2%).

:func:`install_finished_first` puts the policy in place of vLLM's at the
scheduler's start: only under vLLM's native ``OffloadingConnector`` whose
manager runs the stock LRU policy (not ARC, not an out-of-tree policy) and
holds nothing yet; otherwise the tier keeps its own order.

Invariants: the policy evicts what LRU would, except that the marked
requests' own blocks go first; a mark is consumed by its request's finish,
and at most ``MAX_MARKS`` wait (a request the tier never tracked finishes
before it is marked: its mark drops out, oldest first); capacity, transfer
pinning (``ref_cnt``) and events are vLLM's.
"""

from __future__ import annotations

import heapq
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

logger = logging.getLogger("vllm.continuum_plugin")

__all__ = ["MAX_MARKS", "FinishedFirstLRUCachePolicy", "install_finished_first"]

# Marks waiting for their request's finish to reach the policy.
MAX_MARKS = 4096
# Ranks of demoted blocks start here and grow: below every rank LRU gives
# (those start at 1), and among themselves the earliest demoted first.
_DEMOTED_BASE = -(1 << 62)


class FinishedFirstLRUCachePolicy(LRUCachePolicy):
    """vLLM's LRU host-tier policy whose marked requests' own blocks are
    evicted first (see module doc)."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        # request id -> tokens of its leading prefix that keep their LRU place
        self._marks: OrderedDict[str, int] = OrderedDict()
        self._next_demoted = _DEMOTED_BASE
        self.demoted_total = 0  # blocks ranked first for eviction
        self.on_demoted: Callable[[int], None] = lambda count: None  # the plugin's metrics

    def mark_finished(self, req_id: str, keep_tokens: int) -> None:
        """Request ``req_id`` finished its job's task: when its finish
        reaches the policy, its blocks past its first ``keep_tokens`` tokens
        go first out of the tier."""
        if keep_tokens < 0:
            raise ValueError(f"keep_tokens must be >= 0, got {keep_tokens}")
        self._marks[req_id] = keep_tokens
        self._marks.move_to_end(req_id)
        while len(self._marks) > MAX_MARKS:
            self._marks.popitem(last=False)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        super().on_request_finished(key_groups, insertion_only_keys, reused_keys, req_context)
        keep_tokens = self._marks.pop(req_context.req_id, None)
        if keep_tokens is None:
            return
        demoted = 0
        for keys in key_groups:
            # Tail first: vLLM's own order for the blocks of one request.
            for key in reversed(keys):
                position = req_context.get_offload_key_position(key)  # the block's end token
                if (position is not None and position <= keep_tokens) or key not in self.chunks:
                    continue
                self._demote(key)
                demoted += 1
        if demoted:
            self.demoted_total += demoted
            self.on_demoted(demoted)
            self._maybe_compact_heap()
            logger.debug("continuum: %d host-tier blocks of finished request %s go first", demoted, req_context.req_id)

    def _demote(self, key: OffloadKey) -> None:
        self._next_demoted += 1
        # vLLM 0.33 ranks by (request rank, -position), 0.32 by an int.
        rank: Any = (self._next_demoted, 0) if isinstance(self._ranks.get(key), tuple) else self._next_demoted
        self._ranks[key] = rank
        if key in self._evictable:
            heapq.heappush(self._heap, (rank, key))


def install_finished_first(connector: Any) -> FinishedFirstLRUCachePolicy | None:
    """Put a :class:`FinishedFirstLRUCachePolicy` in place of the LRU policy
    of ``connector``'s host tier, when ``connector`` is vLLM's native
    ``OffloadingConnector`` whose manager runs the stock LRU policy and holds
    nothing yet (at the scheduler's start); returns it, or None when the tier
    keeps its own order (another connector or policy)."""
    manager = getattr(getattr(connector, "connector_scheduler", None), "manager", None)
    policy = getattr(manager, "_policy", None)
    if isinstance(policy, FinishedFirstLRUCachePolicy):
        return policy
    if type(policy) is not LRUCachePolicy or policy.chunks:
        if manager is not None:
            logger.info("vllm-continuum-plugin: the host tier's %s policy keeps its own order",
                        type(policy).__name__)
        return None
    finished_first = FinishedFirstLRUCachePolicy(policy.cache_capacity)
    manager._policy = finished_first
    return finished_first
