"""What the offload connector's scheduler side sends its workers each step
(loads, stores, evictions), what workers send back, and the block keys both
sides index the store by (vLLM's block hashes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from .block_copier import PAYLOAD_ALIGN

try:  # vLLM >= 0.32
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata
except ImportError:  # pragma: no cover - older vLLM
    KVConnectorWorkerMetadata = object  # type: ignore[misc,assignment]

__all__ = ["ContinuumOffloadMetadata", "ContinuumOffloadWorkerMeta", "LoadJob"]

# ----------------------------------------------------------------------
# Scheduler -> worker metadata
# ----------------------------------------------------------------------
@dataclass
class LoadJob:
    req_id: str
    keys: list[bytes]
    block_ids: list[int]


@dataclass
class ContinuumOffloadMetadata(KVConnectorMetadata):
    """One step's work for the workers, applied in this order: ``clear``,
    ``evictions``, ``pre_stores`` (before the forward pass), ``loads``
    (before the forward pass), ``stores`` (after it)."""

    clear: bool = False
    evictions: list[bytes] = field(default_factory=list)
    pre_stores: list[tuple[bytes, int]] = field(default_factory=list)
    loads: list[LoadJob] = field(default_factory=list)
    stores: list[tuple[bytes, int]] = field(default_factory=list)
    # Requests whose delayed free waits for this step's stores.
    finished_store_reqs: list[str] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (
            self.clear
            or self.evictions
            or self.pre_stores
            or self.loads
            or self.stores
            or self.finished_store_reqs
        )


class ContinuumOffloadWorkerMeta(KVConnectorWorkerMetadata):  # type: ignore[misc,valid-type]
    """Worker -> scheduler: keys the index promised but a worker lacks."""

    def __init__(self, missing: set[bytes] | None = None) -> None:
        self.missing: set[bytes] = set(missing or ())

    def aggregate(self, other: Any) -> ContinuumOffloadWorkerMeta:
        if isinstance(other, ContinuumOffloadWorkerMeta):
            self.missing |= other.missing
        return self



# ----------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------
def _block_key(block_hash: Any) -> bytes:
    """The BlockHash of a KVCacheBlock's ``block_hash`` (which carries the
    KV cache group id in its last 4 bytes in vLLM >= 0.11)."""
    try:
        from vllm.v1.core.kv_cache_utils import get_block_hash

        return get_block_hash(block_hash)
    except ImportError:  # pragma: no cover
        return block_hash


def _block_bytes_estimate(kv_cache_config: Any) -> int:
    """Bytes of one block over all layers of KV cache group 0, from the spec
    (an upper bound of what a worker copies)."""
    group = kv_cache_config.kv_cache_groups[0]
    spec = group.kv_cache_spec
    per_layer = getattr(spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs
    if isinstance(per_layer, dict) and per_layer:
        total = sum(int(s.page_size_bytes) for s in per_layer.values())
    else:
        total = int(spec.page_size_bytes) * max(1, len(group.layer_names))
    # Each layer is padded to PAYLOAD_ALIGN bytes inside a payload.
    return total + PAYLOAD_ALIGN * max(1, len(group.layer_names))


def _world_size(vllm_config: Any) -> int:
    parallel = getattr(vllm_config, "parallel_config", None)
    return max(1, int(getattr(parallel, "world_size", 1) or 1)) if parallel is not None else 1
