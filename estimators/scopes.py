"""Learned state scoped to the client that taught it.

Everything the plugin learns from client traffic -- the tool-time history
behind the CDF rule (``ttl.ScopedToolHistory``), the round-trip margin
(``round_trip.RoundTripOverhead``), ContextServe's Bayesian posteriors
(``bayesian.BayesianLayer``) and its classifier's training buffer
(``xgb_classifier.XGBoostLayer``) -- is kept per *scope*: the client a
request comes from (its API key when the server has keys, else the
``continuum_scope`` field or ``X-Continuum-Scope`` header; untagged traffic
shares ``DEFAULT_SCOPE``; see ``metadata`` and docs/scoped-learning.md).
The rule we hold to is vLLM's own for retention: what a client sends may
make its own service better or worse, never anybody else's.

The model, shared by every scoped estimator:

* **Own scope first.** A scope whose own estimator is *warm* (enough
  samples, as the estimator defines it: the same threshold it uses today)
  decides from its own samples only, exactly as the unscoped estimator did.
* **A bounded, robust shared prior.** A cold scope asks the others: each
  warm scope among the ``PRIOR_CANDIDATES`` most recently active ones
  answers the same question from its own samples, and the prior is the
  (low) median of those answers (``shared_prior``). Each scope has one vote,
  however much traffic it sent (its weight is capped at one), at most
  ``MAX_PRIOR_VOTERS`` vote, and no prior exists below ``PRIOR_QUORUM``
  voters: one or two scopes cannot speak for everybody, and a minority of
  voters cannot move the median outside the range the others span.
  Only API-key scopes vote (``may_vote``): a name in a field or header costs
  nothing, so one client could send three and form a quorum on its own; a
  key is an identity the operator issued. Named scopes and the default
  scope learn for themselves and ask the key scopes' prior when cold.
* **Otherwise the estimator's own cold start**, as today.

Invariant (single tenant): with one scope there is never a voter other than
the asker, so every decision is the unscoped estimator's decision on the
same samples.

Memory: ``ScopeTable`` keeps at most ``max_scopes`` scopes (least recently
active dropped) and, optionally, at most ``max_units`` units (samples,
posteriors) summed over all scopes, so scoping never holds more than the
unscoped estimator could plus one scope's worth; ``FairShareBuffer`` keeps a
fixed number of samples in all, evicting from the scope that holds the most.
A dropped scope is cold again: its clients fall back to the prior or the
default, never to another scope's own answer.

Everything here runs on the scheduler thread; nothing locks.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from typing import Final, Generic, TypeVar

__all__ = [
    "DEFAULT_SCOPE",
    "FairShareBuffer",
    "is_key_scope",
    "key_scope",
    "may_vote",
    "MAX_PRIOR_VOTERS",
    "PRIOR_CANDIDATES",
    "PRIOR_QUORUM",
    "ScopeTable",
    "shared_prior",
]

# The scope of traffic that names none. Empty: no client can send it as a
# name (an empty name counts as no name), so it never collides with one.
DEFAULT_SCOPE: Final[str] = ""
# Fewest warm scopes (other than the asker) whose answers form a prior.
# With three, one hostile scope is always outvoted by two others.
PRIOR_QUORUM: Final[int] = 3
# Most voters per prior: each vote is one decision of that scope's own
# estimator, on the scheduler thread.
MAX_PRIOR_VOTERS: Final[int] = 15
# Most recently active scopes looked at for voters: bounds the scan of a
# cold scope's decision whatever ``max_scopes`` is.
PRIOR_CANDIDATES: Final[int] = 64

# The scope of a verified API key: this prefix and the first 32 hex digits
# of the key's SHA-256 (the key itself is never kept). It starts with a
# character no client can send in a scope name (names are printable), so a
# named scope never poses as a key's.
KEY_SCOPE_PREFIX: Final[str] = "\x00key:"
_KEY_SCOPE_HEX = 32
_HEX_DIGITS = frozenset("0123456789abcdef")

T = TypeVar("T")
S = TypeVar("S")


def key_scope(api_key: str) -> str:
    """The scope of requests authenticated with ``api_key``: a hash, so the
    key never reaches the engine, a log line or a metric."""
    return KEY_SCOPE_PREFIX + hashlib.sha256(api_key.encode("utf-8")).hexdigest()[:_KEY_SCOPE_HEX]


def is_key_scope(scope: str) -> bool:
    """Is ``scope`` one that ``key_scope`` makes (reserved: no client's name)?"""
    digest = scope[len(KEY_SCOPE_PREFIX):]
    return scope.startswith(KEY_SCOPE_PREFIX) and len(digest) == _KEY_SCOPE_HEX and set(digest) <= _HEX_DIGITS


def may_vote(scope: str) -> bool:
    """May ``scope`` vote in the shared prior? Only an API key's scope: any
    client can send any number of names, but not of keys."""
    return is_key_scope(scope)


def shared_prior(votes: Sequence[float]) -> float | None:
    """The prior from the voters' answers: their low median (an answer one
    of them gave), or None below ``PRIOR_QUORUM`` votes.

    Robustness: with ``k`` votes, the low median lies between the smallest
    and the largest of any ``k - floor((k - 1) / 2)`` of them, so fewer than
    half of the voters cannot move it outside the range the rest span.
    """
    if len(votes) < PRIOR_QUORUM:
        return None
    ordered = sorted(votes)
    return ordered[(len(ordered) - 1) // 2]


class ScopeTable(Generic[T]):
    """Per-scope estimators, created on first use, LRU over scopes.

    Invariants: at most ``max_scopes`` scopes are held; when ``max_units``
    is set, the units (``units(estimator)``, as last reported by
    ``update_units``) summed over all scopes exceed it only while the scope
    that was just updated alone exceeds it; eviction drops least recently
    touched scopes first and never the scope being touched or updated.
    """

    __slots__ = ("_entries", "_units", "_total_units", "_factory", "_units_of", "max_scopes", "max_units",
                 "evictions")

    def __init__(
        self,
        factory: Callable[[], T],
        max_scopes: int,
        max_units: int | None = None,
        units: Callable[[T], int] | None = None,
    ) -> None:
        if isinstance(max_scopes, bool) or not isinstance(max_scopes, int) or max_scopes < 1:
            raise ValueError(f"ScopeTable: max_scopes must be an integer >= 1, got {max_scopes!r}")
        if max_units is not None and (isinstance(max_units, bool) or not isinstance(max_units, int)
                                      or max_units < 1):
            raise ValueError(f"ScopeTable: max_units must be None or an integer >= 1, got {max_units!r}")
        if (max_units is None) != (units is None):
            raise ValueError("ScopeTable: max_units and units go together (both or neither)")
        self._entries: OrderedDict[str, T] = OrderedDict()
        self._units: dict[str, int] = {}
        self._total_units = 0
        self._factory = factory
        self._units_of = units
        self.max_scopes = max_scopes
        self.max_units = max_units
        # Scopes dropped to stay within the bounds (a metric for operators).
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, scope: object) -> bool:
        return scope in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    @property
    def total_units(self) -> int:
        return self._total_units

    def get(self, scope: str) -> T | None:
        """The scope's estimator, or None; a read neither creates nor
        refreshes it (a decision is not a sample)."""
        return self._entries.get(scope)

    def touch(self, scope: str) -> T:
        """The scope's estimator, created if new, made most recently active."""
        entry = self._entries.get(scope)
        if entry is not None:
            self._entries.move_to_end(scope)
            return entry
        entry = self._entries[scope] = self._factory()
        self._units[scope] = 0
        while len(self._entries) > self.max_scopes:
            self._evict_oldest(keep=scope)
        return entry

    def update_units(self, scope: str) -> None:
        """Re-count the scope's units after it changed, then drop least
        recently active other scopes while the total exceeds ``max_units``."""
        units_of = self._units_of
        entry = self._entries.get(scope)
        if units_of is None or entry is None:
            return
        units = units_of(entry)
        self._total_units += units - self._units[scope]
        self._units[scope] = units
        assert self.max_units is not None
        while self._total_units > self.max_units and len(self._entries) > 1:
            self._evict_oldest(keep=scope)

    def voters(self, exclude: str, is_warm: Callable[[T], bool]) -> list[tuple[str, T]]:
        """Warm scopes that may vote (``may_vote``), other than ``exclude``,
        among the ``PRIOR_CANDIDATES`` most recently active, newest first,
        at most ``MAX_PRIOR_VOTERS``."""
        found: list[tuple[str, T]] = []
        for looked, scope in enumerate(reversed(self._entries)):
            if looked >= PRIOR_CANDIDATES or len(found) >= MAX_PRIOR_VOTERS:
                break
            if scope != exclude and may_vote(scope):
                entry = self._entries[scope]
                if is_warm(entry):
                    found.append((scope, entry))
        return found

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(self._entries.items())

    def _evict_oldest(self, keep: str) -> None:
        for scope in self._entries:
            if scope != keep:
                del self._entries[scope]
                self._total_units -= self._units.pop(scope)
                self.evictions += 1
                return


class FairShareBuffer(Generic[S]):
    """A bounded FIFO of samples that scopes share fairly.

    Invariants: at most ``capacity`` samples in all, over at most
    ``max_scopes`` scopes (least recently active dropped, with its
    samples); when a new sample would exceed the capacity, the oldest sample
    of the scope holding the most goes (the appending scope's own when it is
    among the largest), so a scope that floods the buffer only pushes out its
    own samples once it holds its share. With one scope this is exactly
    ``deque(maxlen=capacity)``.
    """

    __slots__ = ("_scopes", "_size", "capacity", "max_scopes")

    def __init__(self, capacity: int, max_scopes: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"FairShareBuffer: capacity must be an integer >= 1, got {capacity!r}")
        if isinstance(max_scopes, bool) or not isinstance(max_scopes, int) or max_scopes < 1:
            raise ValueError(f"FairShareBuffer: max_scopes must be an integer >= 1, got {max_scopes!r}")
        self._scopes: OrderedDict[str, deque[S]] = OrderedDict()
        self._size = 0
        self.capacity = capacity
        self.max_scopes = max_scopes

    def __len__(self) -> int:
        return self._size

    def count(self, scope: str) -> int:
        samples = self._scopes.get(scope)
        return len(samples) if samples is not None else 0

    def append(self, scope: str, sample: S) -> None:
        samples = self._scopes.get(scope)
        if samples is None:
            samples = self._scopes[scope] = deque()
            while len(self._scopes) > self.max_scopes:
                oldest = next(iter(self._scopes))
                self._size -= len(self._scopes.pop(oldest))
        else:
            self._scopes.move_to_end(scope)
        if self._size >= self.capacity:
            # O(scopes), bounded by max_scopes: the largest share gives.
            largest = max(self._scopes, key=lambda name: len(self._scopes[name]))
            victim = scope if len(samples) >= len(self._scopes[largest]) else largest
            self._scopes[victim].popleft()
            self._size -= 1
            if victim != scope and not self._scopes[victim]:
                del self._scopes[victim]  # a scope whose samples all went holds nothing
        samples.append(sample)
        self._size += 1

    def snapshot(self) -> list[S]:
        """All samples, scope by scope (least recently active first), each
        scope's in arrival order."""
        return [sample for samples in self._scopes.values() for sample in samples]
