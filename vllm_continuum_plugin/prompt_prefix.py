"""Does a new prompt continue an earlier one? The longest shared block prefix.

A turn's prompt is remembered as the chained hashes of its full KV blocks at
a few *checkpoints* (vLLM chains block hashes, so two prompts with an equal
hash at block ``i`` are equal in every block up to ``i``). A later request
shares the longest checkpointed prefix whose hash it has too, found by
binary search (equality is monotone in the index: O(log checkpoints)).

Real clients do not send the previous prompt verbatim: chat templates drop
earlier reasoning from history (Qwen3, DeepSeek-R1, gpt-oss's analysis
channel), Claude Code rewrites ``<system-reminder>`` blocks and cache-control
marks near the tail, AIPerf rebuilds each prompt from a trace's hash blocks
without the previous prompt's partial tail block. So "continues" does not
mean "holds the previous prompt's last block": a request continues a prompt
when it shares more than a *base* (the prefix the conversation shares with
others: a system prompt, a tool list) and at least :data:`CONTINUE_SHARE` of
the prompt's blocks beyond that base.

Why one half (``docs/prefix_share.md``, written by
``scripts/prefix_share.py``): on the shipped real Claude Code traces, 94% of
the main conversation's requests hold the previous one whole and 5% hold
90-99.9% of it (tail rewrites); 0.2% hold 50-90%, and the 0.7% that hold
less than half hold 4-41% (compaction: a summary replaces the history). A
side request (a title, a summary call) holds none of the conversation (91%)
or all of it.

Where the checkpoints lie: :data:`CHECKPOINTS` evenly spaced ones know a
shared prefix to within ``1 / CHECKPOINTS`` of the prompt, which is enough
for the one-half rule but not beside a large base. Parallel sub-agents
started together (Claude Code's Explore agents) send nearly the same first
prompt, so each one's base is nearly its whole prompt (720 of 731 blocks);
its next prompt with a rewritten tail shares 728, which evenly spaced
checkpoints round down to 686, at or below the base: the turn would not
continue its own conversation and would land in a sibling's. So
:data:`TAIL_CHECKPOINTS` more lie at ``n - 2**i`` from the end, which know a
prefix that stops ``d`` blocks short of the end to within another ``d + 1``
blocks: fine where the base is large, coarse only where nothing needs it.

Invariants: a prompt shorter than one block is continued by nothing; a
request sharing no more than the base never continues; at most
``CHECKPOINTS + TAIL_CHECKPOINTS`` hashes are kept per prompt, whatever its
length; the shared prefix is rounded down to a checkpoint (never more than is
really shared), to within ``1 / CHECKPOINTS`` of the prompt and, when it
stops ``d`` blocks short of the prompt's end, to within ``d + 1`` blocks.
Nothing here imports vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

__all__ = ["CHECKPOINTS", "CONTINUE_SHARE", "PromptPrefix", "TAIL_CHECKPOINTS"]

# Evenly spaced hashes kept per prompt: the shared prefix is known to 1/16
# of the prompt, far finer than the one-half rule needs.
CHECKPOINTS = 16
# Hashes kept near the prompt's end, at n - 1, n - 2, n - 4, ... (module doc):
# a base of nearly the whole prompt is still exceeded by a tail rewrite.
# 16 reach 32k blocks back, past any context a server holds.
TAIL_CHECKPOINTS = 16
# Up to this many blocks every block is a checkpoint (no more hashes than
# the two kinds of checkpoint together would keep).
_ALL_BLOCKS_UP_TO = CHECKPOINTS + TAIL_CHECKPOINTS
# The share of a prompt's own blocks (beyond the base) a request must hold
# to continue it (module doc).
CONTINUE_SHARE = 0.5


# Shared by every prompt of the same length, so a prompt holds only a
# reference; bounded, and cheap to recompute on a miss.
@lru_cache(maxsize=4096)
def _checkpoints(n: int) -> tuple[int, ...]:
    """The ascending block indices a prompt of ``n`` full blocks keeps."""
    if n <= _ALL_BLOCKS_UP_TO:
        return tuple(range(n))
    k = CHECKPOINTS
    # ceil((j + 1) * n / k) - 1 for j < k: evenly spaced, the last is n - 1.
    even = {((j + 1) * n + k - 1) // k - 1 for j in range(k)}
    # n - 1, n - 2, n - 4, ...: as far back as the prompt reaches.
    tail = {n - (1 << i) for i in range(TAIL_CHECKPOINTS) if (1 << i) <= n}
    return tuple(sorted(even | tail))


class PromptPrefix:
    """A prompt's full blocks, as hashes at up to :data:`CHECKPOINTS`
    evenly spaced indices and :data:`TAIL_CHECKPOINTS` indices ``n - 2**i``
    near its end (every index when the prompt has few blocks; the last full
    block always among them). Indices ascend, so equality with a request's
    hashes is monotone along them."""

    __slots__ = ("num_blocks", "_indices", "_hashes")

    def __init__(self, block_hashes: Sequence[Any], num_blocks: int) -> None:
        if num_blocks < 0 or num_blocks > len(block_hashes):
            raise ValueError(f"num_blocks must be in [0, {len(block_hashes)}], got {num_blocks}")
        self.num_blocks = num_blocks
        self._indices = _checkpoints(num_blocks)
        self._hashes = tuple(block_hashes[i] for i in self._indices)

    @classmethod
    def of_request(cls, request: Any, block_size: int) -> PromptPrefix:
        """The prefix of ``request``'s prompt (its full blocks only: the
        partial tail block has no hash)."""
        num_blocks = min(request.num_prompt_tokens // block_size, len(request.block_hashes))
        return cls(request.block_hashes, num_blocks)

    def shared_blocks(self, block_hashes: Sequence[Any]) -> int:
        """How many of this prompt's leading blocks a request with these
        block hashes holds, rounded down to a checkpoint."""
        indices = self._indices
        hashes = self._hashes
        lo, hi = 0, len(hashes)  # checkpoints [0, lo) match, [hi, k) do not
        while lo < hi:
            mid = (lo + hi) // 2
            index = indices[mid]
            if index < len(block_hashes) and block_hashes[index] == hashes[mid]:
                lo = mid + 1
            else:
                hi = mid
        return indices[lo - 1] + 1 if lo else 0

    def continued_by(self, block_hashes: Sequence[Any], base_blocks: int = 0) -> bool:
        """Does a request with these block hashes continue this prompt? (See
        module doc: it shares more than ``base_blocks`` -- at most all but
        the prompt's last block -- and :data:`CONTINUE_SHARE` of the blocks
        beyond it.)"""
        return self.continuation(block_hashes, base_blocks) is not None

    def continuation(self, block_hashes: Sequence[Any], base_blocks: int = 0) -> int | None:
        """The blocks shared when a request with these block hashes
        continues this prompt (:meth:`continued_by`), else None."""
        if self.num_blocks == 0:
            return None  # shorter than one block: nothing to continue
        shared = self.shared_blocks(block_hashes)
        # A base as long as the prompt (a resumed session whose first turn
        # hit everything) must not make the prompt impossible to continue:
        # its exact continuation still does.
        base = min(max(0, base_blocks), self.num_blocks - 1)
        if shared > base and shared - base >= CONTINUE_SHARE * (self.num_blocks - base):
            return shared
        return None

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, PromptPrefix) and other.num_blocks == self.num_blocks
                and other._hashes == self._hashes)

    def __hash__(self) -> int:
        return hash((self.num_blocks, self._hashes[-1] if self._hashes else None))

    def __repr__(self) -> str:
        return f"PromptPrefix(num_blocks={self.num_blocks})"
