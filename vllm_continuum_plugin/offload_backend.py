"""What the scheduler needs from an offload backend, and where to find it.

The plugin's scheduler stores what leaves a pin (TTL, pressure, cap) or a
SLOW turn in a host-memory tier and prices a rebuild by its reload time,
when such a tier is configured. :class:`OffloadBackend` is that boundary
(``connectors.kv_offload.ContinuumOffloadConnector`` implements it);
:func:`find_offload_backend` finds it among the engine's KV connectors --
the one configured, or one of the children of vLLM's ``MultiConnector``,
which is how users combine connectors (the plugin's offload with LMCache,
or with NIXL for disaggregation). It logs what it found once, at start-up,
so a tier that is not used is never silent.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from .clock import Clock

logger = logging.getLogger("vllm.continuum_plugin")

__all__ = ["OffloadBackend", "find_offload_backend"]


@runtime_checkable
class OffloadBackend(Protocol):
    """The scheduler side of a host-memory KV tier the plugin drives."""

    def set_clock(self, clock: Clock) -> None:
        """Holds lapse on the scheduler's (injected) clock."""

    def save_blocks(self, blocks: Iterable[Any], hold_job: str | None = None) -> int:
        """Store these blocks before they are freed; ``hold_job``: keep them
        for that job's next turn. Returns how many were scheduled (a victim
        tier schedules none: it copies a block when the GPU evicts it, and
        applies the hold then)."""

    def save_request(self, request: Any, hold_job: str | None = None) -> int:
        """``save_blocks`` for a finished request's own full blocks."""

    def end_hold(self, job_id: str, demote: bool = False) -> int:
        """The job's next turn came (or the job ended: ``demote``)."""

    def demote_request(self, request: Any) -> int:
        """A finished job's blocks go first when the store needs room."""

    def stored_prefix_tokens(self, request: Any, start_tokens: int = 0) -> int:
        """Tokens of the request's prefix a rebuild would reload: what the
        store holds (a victim tier: every full block, up to its capacity,
        since what the GPU evicts is copied)."""

    def reload_seconds_per_token(self) -> float | None:
        """Measured reload cost, or None before any reload was timed."""


def _children(connector: Any) -> list[Any]:
    """A ``MultiConnector``'s sub-connectors (its public property), else []."""
    try:
        children = getattr(connector, "sub_connectors", None)
    except Exception:  # a property of a foreign connector may raise
        return []
    return list(children) if isinstance(children, (list, tuple)) else []


def find_offload_backend(connector: Any) -> OffloadBackend | None:
    """The plugin-driven offload backend among ``connector`` and, inside a
    ``MultiConnector``, its children (depth first, the first found wins);
    None when there is none. Logs the outcome when a connector is set."""
    if connector is None:
        return None
    stack = [connector]
    while stack:
        candidate = stack.pop(0)
        if isinstance(candidate, OffloadBackend):
            if candidate is not connector:
                logger.info(
                    "vllm-continuum-plugin: offload backend %s found inside %s",
                    type(candidate).__name__, type(connector).__name__,
                )
            return candidate
        stack[:0] = _children(candidate)
    logger.info(
        "vllm-continuum-plugin: KV connector %s has no plugin offload backend; pins are freed, not offloaded",
        type(connector).__name__,
    )
    return None
