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

Not thread-safe: each vLLM process drives its store from one thread.
"""

from __future__ import annotations

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
    __slots__ = ("value", "nbytes", "pins")

    def __init__(self, value: Any, nbytes: int) -> None:
        self.value = value
        self.nbytes = nbytes
        self.pins = 0


class CPUStore:
    """Byte-budgeted LRU map ``key -> value`` (see module doc)."""

    def __init__(
        self,
        capacity_bytes: int,
        on_evict: Callable[[Hashable, int], None] | None = None,
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = int(capacity_bytes)
        self.used_bytes = 0
        self.pinned_bytes = 0
        self.counters = StoreCounters()
        self._on_evict = on_evict
        # Least recently used first.
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()

    # ------------------------------------------------------------------
    # Queries
    # ------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Hashable]:
        """Keys from least to most recently used."""
        return iter(list(self._entries))

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    def keys_lru(self) -> list[Hashable]:
        """Keys from least to most recently used (the eviction order)."""
        return list(self._entries)

    def nbytes_of(self, key: Hashable) -> int | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.nbytes

    def is_pinned(self, key: Hashable) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.pins > 0

    def can_fit(self, nbytes: int) -> bool:
        """Whether an item of ``nbytes`` could be inserted now (possibly after
        evicting unpinned entries)."""
        return nbytes <= self.capacity_bytes - self.pinned_bytes

    def get(self, key: Hashable, touch: bool = True) -> Any:
        """The value of ``key`` (None when absent); marks it recently used."""
        entry = self._entries.get(key)
        if entry is None:
            self.counters.misses += 1
            return None
        self.counters.hits += 1
        if touch:
            self._entries.move_to_end(key)
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
        if key not in self._entries:
            return False
        self._entries.move_to_end(key)
        return True

    def demote(self, key: Hashable) -> bool:
        """Make ``key`` the first eviction candidate."""
        if key not in self._entries:
            return False
        self._entries.move_to_end(key, last=False)
        return True

    def put(self, key: Hashable, value: Any, nbytes: int | None = None) -> bool:
        """Insert ``key`` (evicting LRU entries first when needed).

        Returns True when the key is present afterwards. An existing key is
        only marked recently used (same key, same KV). Returns False, and
        changes nothing, when the item cannot fit: bigger than the budget, or
        the room is held by pinned entries.
        """
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return True
        size = payload_nbytes(value) if nbytes is None else int(nbytes)
        if size < 0:
            raise ValueError("nbytes must be >= 0")
        if not self.can_fit(size):
            self.counters.refused_items += 1
            return False
        self._make_room(size)
        self._entries[key] = _Entry(value, size)
        self.used_bytes += size
        self.counters.inserted_items += 1
        self.counters.inserted_bytes += size
        assert self.used_bytes <= self.capacity_bytes
        return True

    def evict_for(self, nbytes: int) -> list[Hashable]:
        """Evict LRU unpinned entries until ``nbytes`` more would fit; returns
        the evicted keys (nothing is evicted when it cannot succeed)."""
        if not self.can_fit(nbytes):
            return []
        return self._make_room(nbytes)

    def pop(self, key: Hashable) -> Any:
        """Remove ``key`` (even when pinned); returns its value or None.
        Not counted as an eviction."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self.used_bytes -= entry.nbytes
        if entry.pins:
            self.pinned_bytes -= entry.nbytes
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
        """Drop everything (pins included); returns the number of entries."""
        n = len(self._entries)
        self._entries.clear()
        self.used_bytes = 0
        self.pinned_bytes = 0
        return n

    # ------------------------------------------------------------------
    def _make_room(self, nbytes: int) -> list[Hashable]:
        evicted: list[Hashable] = []
        if self.used_bytes + nbytes <= self.capacity_bytes:
            return evicted
        for key in list(self._entries):
            if self.used_bytes + nbytes <= self.capacity_bytes:
                break
            entry = self._entries[key]
            if entry.pins:
                continue
            self._evict(key, entry)
            evicted.append(key)
        return evicted

    def _evict(self, key: Hashable, entry: _Entry) -> None:
        del self._entries[key]
        self.used_bytes -= entry.nbytes
        if entry.pins:
            self.pinned_bytes -= entry.nbytes
        self.counters.evicted_items += 1
        self.counters.evicted_bytes += entry.nbytes
        if self._on_evict is not None:
            self._on_evict(key, entry.nbytes)
