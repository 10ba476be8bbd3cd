"""In-process CPU store for KV blocks: a byte budget with LRU eviction.

Keys are vLLM block hashes (``bytes``; each one is chained over its whole
prefix, so equal keys mean equal KV). Values are, for the connector's worker
side, one ``BlockPayload`` per block: the per-layer CPU tensors of that block
(views into one contiguous, optionally pinned, buffer). The scheduler side
uses the same class as its *index* with ``value=None`` and an explicit byte
size, so both sides make the same LRU decisions.

Guarantees (checked by ``tests/test_connector.py``):

* ``used_bytes <= capacity_bytes`` at all times: room is made by evicting
  least-recently-used, unpinned entries *before* an insert, and an item that
  cannot fit (bigger than the budget, or the rest is pinned) is refused
  without evicting anything.
* pinned entries (promised to an in-flight load) are never evicted.
* ``get``/``touch`` make an entry most recently used; ``demote`` makes it the
  next eviction victim.
* held entries (``hold(key, until)``: blocks of an agent job whose next turn
  is expected before ``until``) are evicted only when no unheld, unpinned
  entry is left, earliest deadline first. A hold whose deadline passed ends
  on its own and leaves the entry at the LRU end (the turn did not come), so
  a job that never returns cannot keep its blocks.

Eviction order: unheld entries from least to most recently used, then held
entries by deadline (``keys_lru`` lists exactly this order).

Not thread-safe: each vLLM process drives its store from one thread.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["BlockPayload", "CPUStore", "StoreCounters", "payload_nbytes"]


@dataclass
class BlockPayload:
    """One KV block on the host: ``buffer`` holds every layer's bytes
    back to back; ``layers[i]`` is layer ``i``'s tensor for this block (a view
    into ``buffer``, shaped and typed like the device block)."""

    buffer: torch.Tensor
    layers: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        return int(self.buffer.numel() * self.buffer.element_size())


def payload_nbytes(value: Any) -> int:
    """Bytes held by ``value``: a BlockPayload, a tensor, or a sequence of
    tensors (summed)."""
    if value is None:
        return 0
    if isinstance(value, BlockPayload):
        return value.nbytes
    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size())
    if isinstance(value, Sequence):
        return sum(payload_nbytes(v) for v in value)
    raise TypeError(f"cannot size a store value of type {type(value).__name__}; pass nbytes=")


@dataclass
class StoreCounters:
    """Cumulative counters (never reset by the store itself)."""

    inserted_items: int = 0
    inserted_bytes: int = 0
    evicted_items: int = 0
    evicted_bytes: int = 0
    refused_items: int = 0
    hits: int = 0
    misses: int = 0


class _Entry:
    __slots__ = ("value", "nbytes", "pins", "hold_until")

    def __init__(self, value: Any, nbytes: int) -> None:
        self.value = value
        self.nbytes = nbytes
        self.pins = 0
        self.hold_until = 0.0  # 0: not held


class CPUStore:
    """Byte-budgeted LRU map ``key -> value`` (see module doc).

    Invariants: ``used_bytes`` is the sum of the entries' sizes and never
    exceeds ``capacity_bytes``; ``pinned_bytes``/``held_bytes`` are the
    sums over pinned / held entries; every entry is in exactly one of the
    unheld LRU list and the held set.
    """

    def __init__(
        self,
        capacity_bytes: int,
        on_evict: Callable[[Hashable, int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = int(capacity_bytes)
        self.used_bytes = 0
        self.pinned_bytes = 0
        self.held_bytes = 0
        self.counters = StoreCounters()
        self._on_evict = on_evict
        self._clock = clock
        self._entries: dict[Hashable, _Entry] = {}
        # Unheld keys, least recently used first.
        self._lru: OrderedDict[Hashable, None] = OrderedDict()
        # (hold_until, seq, key) of held entries; stale tuples (hold ended
        # or extended) are skipped when popped.
        self._holds: list[tuple[float, int, Hashable]] = []
        self._num_held = 0
        self._seq = itertools.count()

    # ------------------------------------------------------------------
    # Queries
    # ------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Hashable]:
        """Keys in eviction order (see ``keys_lru``)."""
        return iter(self.keys_lru())

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    @property
    def num_held(self) -> int:
        return self._num_held

    def keys_lru(self) -> list[Hashable]:
        """Keys in eviction order: unheld from least to most recently used,
        then held by deadline."""
        return list(self._lru) + [key for _, key in self._live_holds()]

    def nbytes_of(self, key: Hashable) -> int | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.nbytes

    def is_pinned(self, key: Hashable) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.pins > 0

    def is_held(self, key: Hashable) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.hold_until > 0.0

    def can_fit(self, nbytes: int) -> bool:
        """Whether an item of ``nbytes`` could be inserted now (possibly after
        evicting unpinned entries, held ones included)."""
        return nbytes <= self.capacity_bytes - self.pinned_bytes

    def get(self, key: Hashable, touch: bool = True) -> Any:
        """The value of ``key`` (None when absent); marks it recently used."""
        entry = self._entries.get(key)
        if entry is None:
            self.counters.misses += 1
            return None
        self.counters.hits += 1
        if touch and entry.hold_until == 0.0:
            self._lru.move_to_end(key)
        return entry.value

    def peek(self, key: Hashable) -> Any:
        entry = self._entries.get(key)
        return None if entry is None else entry.value

    def prefix_hits(self, keys: Iterable[Hashable]) -> int:
        """Number of leading ``keys`` present (a prefix-chain lookup)."""
        n = 0
        for key in keys:
            if key not in self._entries:
                break
            n += 1
        return n

    # ------------------------------------------------------------------
    # Updates
    # ------------------------------------------------------------------
    def touch(self, key: Hashable) -> bool:
        """Mark ``key`` recently used (a held entry keeps its hold)."""
        entry = self._entries.get(key)
        if entry is None:
            return False
        if entry.hold_until == 0.0:
            self._lru.move_to_end(key)
        return True

    def demote(self, key: Hashable) -> bool:
        """Make ``key`` the first eviction candidate (ends its hold)."""
        entry = self._entries.get(key)
        if entry is None:
            return False
        if entry.hold_until:
            self._end_hold(key, entry)
        self._lru.move_to_end(key, last=False)
        return True

    def hold(self, key: Hashable, until: float) -> bool:
        """Keep ``key`` ahead of unheld entries until ``until`` (on this
        store's clock); a later deadline extends an existing hold."""
        entry = self._entries.get(key)
        if entry is None:
            return False
        if until <= self._clock():
            return False
        if entry.hold_until == 0.0:
            del self._lru[key]
            self._num_held += 1
            self.held_bytes += entry.nbytes
        elif until <= entry.hold_until:
            return True
        entry.hold_until = until
        heapq.heappush(self._holds, (until, next(self._seq), key))
        if len(self._holds) > 2 * self._num_held + 64:
            self._holds = [t for t in self._holds if self._live(t)]
            heapq.heapify(self._holds)
        return True

    def release_hold(self, key: Hashable) -> bool:
        """End ``key``'s hold; it becomes the most recently used entry (its
        job's turn arrived, or the caller decided it is no longer needed)."""
        entry = self._entries.get(key)
        if entry is None or entry.hold_until == 0.0:
            return False
        self._end_hold(key, entry)
        return True

    def expire_holds(self, now: float | None = None) -> int:
        """End the holds whose deadline passed; those entries go to the LRU
        end (first victims), in the order they were held: the first held
        goes first. Callers hold a context's blocks tail first (what the
        scheduler hands over, what the GPU evicts), so a lapsed context
        leaves the store from its tail and what is left of it still matches
        a prefix; the other order would drop its head first and leave a tail
        no load can reach. Returns how many ended."""
        now = self._clock() if now is None else now
        lapsed: list[Hashable] = []
        holds = self._holds
        while holds and holds[0][0] <= now:
            t = heapq.heappop(holds)
            if not self._live(t):
                continue
            key = t[2]
            self._end_hold(key, self._entries[key])
            lapsed.append(key)
        for key in reversed(lapsed):
            self._lru.move_to_end(key, last=False)
        return len(lapsed)

    def put(self, key: Hashable, value: Any, nbytes: int | None = None) -> bool:
        """Insert ``key`` (evicting entries first when needed).

        Returns True when the key is present afterwards. An existing key is
        only marked recently used (same key, same KV). Returns False, and
        changes nothing, when the item cannot fit: bigger than the budget, or
        the room is held by pinned entries.
        """
        if key in self._entries:
            self.touch(key)
            return True
        size = payload_nbytes(value) if nbytes is None else int(nbytes)
        if size < 0:
            raise ValueError(f"nbytes must be >= 0, got {size}")
        if not self.can_fit(size):
            self.counters.refused_items += 1
            return False
        self._make_room(size)
        self._entries[key] = _Entry(value, size)
        self._lru[key] = None
        self.used_bytes += size
        self.counters.inserted_items += 1
        self.counters.inserted_bytes += size
        assert self.used_bytes <= self.capacity_bytes
        return True

    def evict_for(self, nbytes: int) -> list[Hashable]:
        """Evict entries until ``nbytes`` more would fit; returns the evicted
        keys (nothing is evicted when it cannot succeed)."""
        if not self.can_fit(nbytes):
            return []
        return self._make_room(nbytes)

    def pop(self, key: Hashable) -> Any:
        """Remove ``key`` (even when pinned); returns its value or None.
        Not counted as an eviction."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._remove(key, entry)
        return entry.value

    def discard(self, key: Hashable) -> bool:
        """Remove ``key`` as an eviction (counted, ``on_evict`` called)."""
        entry = self._entries.get(key)
        if entry is None:
            return False
        self._evict(key, entry)
        return True

    def pin(self, key: Hashable) -> bool:
        entry = self._entries.get(key)
        if entry is None:
            return False
        if entry.pins == 0:
            self.pinned_bytes += entry.nbytes
        entry.pins += 1
        return True

    def unpin(self, key: Hashable) -> bool:
        entry = self._entries.get(key)
        if entry is None or entry.pins == 0:
            return False
        entry.pins -= 1
        if entry.pins == 0:
            self.pinned_bytes -= entry.nbytes
        return True

    def clear(self) -> int:
        """Drop everything (pins and holds included); returns the number of
        entries."""
        n = len(self._entries)
        self._entries.clear()
        self._lru.clear()
        self._holds.clear()
        self._num_held = 0
        self.used_bytes = 0
        self.pinned_bytes = 0
        self.held_bytes = 0
        return n

    # ------------------------------------------------------------------
    def _live(self, t: tuple[float, int, Hashable]) -> bool:
        entry = self._entries.get(t[2])
        return entry is not None and entry.hold_until == t[0]

    def _live_holds(self) -> list[tuple[float, Hashable]]:
        """Held entries by deadline (each key once)."""
        seen: set[Hashable] = set()
        out: list[tuple[float, Hashable]] = []
        for t in sorted(self._holds):
            if t[2] not in seen and self._live(t):
                seen.add(t[2])
                out.append((t[0], t[2]))
        return out

    def _end_hold(self, key: Hashable, entry: _Entry) -> None:
        entry.hold_until = 0.0
        self._num_held -= 1
        self.held_bytes -= entry.nbytes
        self._lru[key] = None  # most recently used

    def _make_room(self, nbytes: int) -> list[Hashable]:
        if self.used_bytes + nbytes <= self.capacity_bytes:
            return []
        if self._holds:
            self.expire_holds()
        victims: list[Hashable] = []
        room = self.capacity_bytes - self.used_bytes
        # Pinned entries are skipped; they are few (in-flight loads), so the
        # scan stays short.
        for key in self._lru:
            if room >= nbytes:
                break
            entry = self._entries[key]
            if entry.pins:
                continue
            victims.append(key)
            room += entry.nbytes
        if room < nbytes and self._num_held:
            # Earliest deadline first, straight off the heap: O(k log n) for
            # k victims, never a sort of every hold.
            skipped: list[tuple[float, int, Hashable]] = []
            holds = self._holds
            while room < nbytes and holds:
                t = heapq.heappop(holds)
                if not self._live(t):
                    continue
                entry = self._entries[t[2]]
                if entry.pins:
                    skipped.append(t)
                    continue
                victims.append(t[2])
                room += entry.nbytes
            for t in skipped:
                heapq.heappush(holds, t)
        for key in victims:
            self._evict(key, self._entries[key])
        return victims

    def _remove(self, key: Hashable, entry: _Entry) -> None:
        del self._entries[key]
        if entry.hold_until:
            entry.hold_until = 0.0
            self._num_held -= 1
            self.held_bytes -= entry.nbytes
        else:
            del self._lru[key]
        self.used_bytes -= entry.nbytes
        if entry.pins:
            self.pinned_bytes -= entry.nbytes

    def _evict(self, key: Hashable, entry: _Entry) -> None:
        self._remove(key, entry)
        self.counters.evicted_items += 1
        self.counters.evicted_bytes += entry.nbytes
        if self._on_evict is not None:
            self._on_evict(key, entry.nbytes)
