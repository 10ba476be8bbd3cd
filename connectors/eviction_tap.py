"""``EvictionTap``: the cached blocks vLLM's GPU prefix cache evicts, seen
while they still hold their KV.

vLLM hands out free blocks in ``BlockPool.get_new_blocks``; a free block that
still holds a cached prefix loses its hash there
(``BlockPool._maybe_evict_cached_block``) and is then written by the step
being scheduled. A victim tier stores exactly those blocks: what the GPU no
longer holds, instead of a second copy of what it does (write-through, as
vLLM's native offloading and the connector's ``eager`` mode do).

The tap wraps those two methods of one pool instance. Each wrapper calls the
original: nothing of vLLM is copied, and vLLM's own bookkeeping (hash maps,
KV events, metrics) runs as before.

Invariants:

* the sink sees a block before its hash is removed, so ``block.block_hash``
  and ``block.block_id`` name the prefix the block still holds; whoever
  receives it must copy it before the step's forward pass writes the block
  (the connector's pre-stores run before it);
* only evictions *by an allocation* are reported. ``BlockPool.evict_blocks``
  (blocks whose external load failed: their content is invalid) and
  ``reset_prefix_cache`` do not go through ``get_new_blocks``, so an invalid
  block is never offered for storing;
* one tap per pool: a second raises ``RuntimeError`` (two sinks would store
  every victim twice).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["EvictionTap"]

_ATTR = "_continuum_eviction_tap"


class EvictionTap:
    """Report each prefix-cached block ``pool`` evicts to make room for an
    allocation to ``sink(block)``, before the eviction clears its hash."""

    def __init__(self, pool: Any, sink: Callable[[Any], None]) -> None:
        if getattr(pool, _ATTR, None) is not None:
            raise RuntimeError(f"{type(pool).__name__} {id(pool):#x} already has an eviction tap")
        for name in ("get_new_blocks", "_maybe_evict_cached_block"):
            if not callable(getattr(pool, name, None)):
                raise TypeError(
                    f"EvictionTap: {type(pool).__name__} has no {name}(); this vLLM's block pool "
                    f"is not supported (store_mode 'victim' needs it)"
                )
        self._pool = pool
        self._sink = sink
        self._allocating = 0
        self._get_new_blocks = pool.get_new_blocks
        self._evict = pool._maybe_evict_cached_block
        self.reported = 0
        # Instance attributes shadow the class's methods for this pool only;
        # vLLM calls both through ``self.`` so the wrappers see every call.
        pool.get_new_blocks = self._tapped_get_new_blocks
        pool._maybe_evict_cached_block = self._tapped_evict
        setattr(pool, _ATTR, self)

    def _tapped_get_new_blocks(self, num_blocks: int) -> Any:
        self._allocating += 1
        try:
            return self._get_new_blocks(num_blocks)
        finally:
            self._allocating -= 1

    def _tapped_evict(self, block: Any) -> bool:
        if self._allocating and block.block_hash is not None and not getattr(block, "is_null", False):
            self.reported += 1
            self._sink(block)
        return self._evict(block)

    def remove(self) -> None:
        """Restore the pool's own methods (idempotent)."""
        pool = self._pool
        if getattr(pool, _ATTR, None) is not self:
            return
        del pool.get_new_blocks
        del pool._maybe_evict_cached_block
        delattr(pool, _ATTR)
