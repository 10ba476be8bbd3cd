"""How many GPU blocks' worth of context a KV offload tier can hold.

The admission gate bounds the contexts of the jobs under way by what the
server can keep without recomputing them. Without a connector that is the
GPU pool; with a host tier it is what the pool and the tier keep together,
which depends on how the connector fills the tier:

* vLLM's native ``OffloadingConnector`` (``--kv-offloading-size``) stores
  every computed block as it goes (write-through): the tier holds a copy of
  what the GPU holds, so together they keep ``max(pool, tier)``;
* the plugin's ``ContinuumOffloadConnector`` stores what leaves the GPU
  (a pin's release, a freed turn): together they keep ``pool + tier``;
* any other connector (LMCache, a remote store): its capacity is not the
  scheduler's to read, so the gate stays off (``None``).

The tier's size is read from the connector's documented settings
(``cpu_bytes_to_use``, the plugin's ``cpu_bytes``), in bytes for all
workers, and converted at the KV layout's bytes per block: each group's page
size times its layers, times the workers (a tensor-parallel worker holds its
share of every block's heads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .connectors.offload_settings import OffloadSettings

__all__ = ["TierCapacity", "tier_capacity"]

_NATIVE = ("OffloadingConnector",)
_PLUGIN = ("ContinuumOffloadConnector",)


@dataclass(frozen=True)
class TierCapacity:
    """A host tier's size in GPU blocks and how it is filled."""

    connector: str
    blocks: int
    # Write-through: the tier holds copies of the GPU's blocks too.
    write_through: bool

    def retained_blocks(self, pool_blocks: int) -> int:
        """GPU blocks' worth of context the pool and the tier keep together."""
        return max(pool_blocks, self.blocks) if self.write_through else pool_blocks + self.blocks


def bytes_per_block(kv_cache_config: Any, world_size: int) -> int:
    """Bytes one block of every layer takes on all workers together."""
    per_worker = sum(g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in kv_cache_config.kv_cache_groups)
    return per_worker * max(1, world_size)


def tier_capacity(vllm_config: Any, kv_cache_config: Any) -> TierCapacity | None:
    """The configured connector's host tier (module doc), or None when there
    is no connector or its capacity is not known to the scheduler."""
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    name = getattr(transfer, "kv_connector", None)
    if transfer is None or name is None:
        return None
    extra = transfer.kv_connector_extra_config or {}
    try:
        if name in _NATIVE:
            size, write_through = int(float(extra.get("cpu_bytes_to_use", 0))), True
        elif name in _PLUGIN:
            # The connector's own parser: the same default and validation.
            size, write_through = OffloadSettings.from_extra_config(extra).cpu_bytes, False
        else:
            return None
    except (TypeError, ValueError):
        return None  # the connector itself refuses it at start-up
    world = getattr(getattr(vllm_config, "parallel_config", None), "world_size", 1) or 1
    per_block = bytes_per_block(kv_cache_config, world)
    if size <= 0 or per_block <= 0:
        return None
    return TierCapacity(name, size // per_block, write_through)
