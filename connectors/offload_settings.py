"""Settings of the CPU offload connector (``kv_connector_extra_config``),
validated on construction: a bad value raises ``ValueError`` naming it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_CPU_BYTES",
    "DEFAULT_HOLD_SECONDS",
    "LOAD_COST_BLOCKS",
    "LOAD_COST_SECONDS",
    "STORE_BACKENDS",
    "STORE_COST_BLOCKS",
    "STORE_COST_SECONDS",
    "STORE_MODES",
    "OffloadSettings",
    "SideSpec",
]

STORE_MODES = ("eager", "finish", "explicit", "victim")
STORE_BACKENDS = ("cpu",)
DEFAULT_CPU_BYTES = 4 * 2**30
DEFAULT_HOLD_SECONDS = 300.0
_MAX_SPARE_PAYLOADS = 256
_EWMA_ALPHA = 0.2
# Internal counters (not exported): timed loads, for the reload-cost EWMA.
LOAD_COST_SECONDS = "_load_cost_seconds"
LOAD_COST_BLOCKS = "_load_cost_blocks"
STORE_COST_SECONDS = "_store_cost_seconds"
STORE_COST_BLOCKS = "_store_cost_blocks"



# ----------------------------------------------------------------------
# Settings
# ----------------------------------------------------------------------
@dataclass(frozen=True)
class OffloadSettings:
    """``kv_connector_extra_config`` of the connector."""

    cpu_bytes: int = DEFAULT_CPU_BYTES  # host memory for the store, all workers together
    store_mode: str = "eager"
    store_backend: str = "cpu"
    min_load_blocks: int = 1  # do not load fewer blocks than this
    # How long blocks handed over for a job that expects its next turn are
    # kept ahead of plain LRU entries (ends early at the turn or job end).
    hold_seconds: float = DEFAULT_HOLD_SECONDS
    # Largest share of the store that holds may take, in all and per job:
    # beyond it a job's blocks are stored as plain LRU entries, so no client
    # (e.g. one claiming hour-long tools on every turn) can take the store.
    max_held_fraction: float = 0.5
    max_job_held_fraction: float = 0.25

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> OffloadSettings:
        extra = dict(extra or {})
        if "lmcache_config" in extra or extra.get("store_backend") == "lmcache":
            raise ValueError(
                "ContinuumOffloadConnector: the LMCache 0.3 store backend was removed; run LMCache 0.5 as "
                "its own server and select vLLM's LMCacheMPConnector (--kv-offloading-backend lmcache), "
                "see docs/offload.md (LMCache)")
        known = {
            "cpu_bytes", "store_mode", "store_backend", "min_load_blocks", "hold_seconds",
            "max_held_fraction", "max_job_held_fraction",
        }
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(
                f"ContinuumOffloadConnector: unknown kv_connector_extra_config key(s) {unknown}; "
                f"known: {sorted(known)}"
            )
        def number(name: str, default: float, cast: Any) -> Any:
            value = extra.get(name, default)
            try:
                return cast(value)
            except (TypeError, ValueError, OverflowError) as e:
                raise ValueError(
                    f"ContinuumOffloadConnector: {name} must be a number, got {value!r}"
                ) from e

        cpu_bytes = number("cpu_bytes", DEFAULT_CPU_BYTES, lambda v: int(float(v)))
        min_load_blocks = number("min_load_blocks", 1, int)
        hold_seconds = number("hold_seconds", DEFAULT_HOLD_SECONDS, float)
        max_held = number("max_held_fraction", 0.5, float)
        max_job_held = number("max_job_held_fraction", 0.25, float)
        for name, value in (("max_held_fraction", max_held), ("max_job_held_fraction", max_job_held)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"ContinuumOffloadConnector: {name} must be in [0, 1], got {value!r}")
        store_mode = str(extra.get("store_mode", "eager"))
        store_backend = str(extra.get("store_backend", "cpu"))
        if cpu_bytes < 0:
            raise ValueError(f"ContinuumOffloadConnector: cpu_bytes must be >= 0, got {cpu_bytes}")
        if not math.isfinite(hold_seconds) or hold_seconds < 0:
            raise ValueError(
                f"ContinuumOffloadConnector: hold_seconds must be a finite number >= 0, "
                f"got {hold_seconds}"
            )
        if store_mode not in STORE_MODES:
            raise ValueError(
                f"ContinuumOffloadConnector: store_mode {store_mode!r} not in {STORE_MODES}"
            )
        if store_backend not in STORE_BACKENDS:
            raise ValueError(
                f"ContinuumOffloadConnector: store_backend {store_backend!r} not in {STORE_BACKENDS}"
            )
        return cls(
            cpu_bytes=cpu_bytes,
            store_mode=store_mode,
            store_backend=store_backend,
            min_load_blocks=max(1, min_load_blocks),
            hold_seconds=hold_seconds,
            max_held_fraction=max_held,
            max_job_held_fraction=max_job_held,
        )


@dataclass(frozen=True)
class SideSpec:
    """What the connector's scheduler and worker sides are built from:
    values the connector settled at start-up, so neither side reads the
    connector (and no module of the three imports another in a circle).

    Invariants: ``block_size >= 1``; ``capacity_bytes`` is this worker's
    share of the store (the configured bytes over the world size)."""

    settings: OffloadSettings
    block_size: int
    capacity_bytes: int
    # Prefix caching is on: blocks have hashes to store and find them by.
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {self.capacity_bytes}")
