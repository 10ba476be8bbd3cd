"""A finished job's own blocks are the prefix cache's first victims.

vLLM frees a request's blocks to the tail of the block pool's free queue:
they are the *last* to be evicted (LRU). That is right for a turn whose job
goes on, and wrong for a job's last turn: nobody will ask for the context of
a finished job again, yet it outlives, in the prefix cache, every other
context freed before it -- the contexts of jobs whose tools are still
running, which then lose their blocks first and re-prefill (or reload from a
second tier) when they return. The plugin knows when a job has ended
(``is_last_step``, a finish action, a final answer), so it moves the ended
job's own blocks to the front of the free queue.

"Own" excludes the prefix the job's first turn found in the cache: that
part (a system prompt, a tool list) was computed by earlier traffic and will
be asked for again by later jobs, so it keeps its LRU place.

The blocks stay free and cached: a request that happens to share them still
hits them until they are reused. Only their eviction order changes.

Invariants: only blocks that are free (``ref_cnt == 0``), cached (hashed)
and not the null block move; the free queue's length is unchanged; the
context's tail goes first (vLLM's own order for the blocks of one request).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["evict_first"]


def evict_first(block_pool: Any, blocks_by_group: Sequence[Sequence[Any]], skip_blocks: int) -> int:
    """Move the free, cached blocks among ``blocks_by_group`` (a request's
    blocks per KV cache group, in prompt order), except each group's first
    ``skip_blocks``, to the front of ``block_pool``'s free queue, the last
    block first. Returns how many moved."""
    if skip_blocks < 0:
        raise ValueError(f"skip_blocks must be >= 0, got {skip_blocks}")
    queue = block_pool.free_block_queue
    moved: list[Any] = []
    for blocks in blocks_by_group:
        own = [b for b in blocks[skip_blocks:] if b.ref_cnt == 0 and not b.is_null and b.block_hash is not None]
        for block in own:
            queue.remove(block)
        moved.extend(reversed(own))
    # One prepend keeps the groups' blocks together at the front, each
    # group's tail first; groups free together, so their order is moot.
    queue.prepend_n(moved)
    return len(moved)
