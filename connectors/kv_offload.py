"""``ContinuumOffloadConnector``: copy KV blocks to host memory and reload them.

Enable with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "ContinuumOffloadConnector",
        "kv_connector_module_path": "vllm_continuum_plugin.connectors.kv_offload",
        "kv_role": "kv_both", "kv_connector_extra_config": {"cpu_bytes": 2000000000}}'

How it works
------------
*Scheduler side* (EngineCore). An index of the blocks held by the store,
keyed by vLLM's own block hashes (``request.block_hashes``: each hash is
chained over its whole prefix, and covers LoRA / multimodal / cache-salt
extra keys), with the same byte budget and LRU order as the workers' stores.
``get_num_new_matched_tokens`` walks the request's hash chain from the end of
the GPU prefix-cache hit and returns the block-aligned tokens the store holds
(a synchronous load: ``(n, False)``), never the whole prompt (one token is
always computed). ``update_state_after_alloc`` pins those entries and records
a load job into the blocks vLLM allocated; ``build_connector_meta`` ships load
jobs, store jobs and the evictions that make room for them (pinned entries
are never evicted; an entry loaded in a step is not evicted in that step).

Eviction is LRU with *holds*: blocks the Continuum scheduler hands over for
a job that expects its next turn (an expired or pressure-released pin, a
ContextServe SLOW turn, a pin trimmed by the pin cap) are held for the job:
they are evicted only after every unheld entry, earliest deadline first.
A hold ends when the job's next turn is admitted (the entries become plain
recently-used ones), when the job's last turn finishes (they become the
next victims), or after ``hold_seconds`` (default 300 s; a job that never
returns).

What is stored (``store_mode``):

* ``eager`` (default): every full, hashed block, in the step that computes it
  (copied after the forward pass). Preempted, aborted and finished requests,
  expired pins and anything vLLM later evicts from the GPU can then be
  reloaded; nothing is delayed.
* ``finish``: a request's full blocks when it finishes
  (``request_finished`` returns ``delay_free=True`` until the worker reports
  the copy in ``get_finished``, so the blocks cannot be overwritten first).
* ``explicit``: only blocks handed over by the scheduler through
  :meth:`ContinuumOffloadConnector.save_blocks` / :meth:`save_request`
  (e.g. a Continuum pin released under pressure or by its TTL); the copy runs
  before the next forward pass, so the caller may free the blocks at once.

``save_blocks`` works in every mode (in ``eager`` mode it mostly refreshes
LRU positions, since the blocks are already stored).

*Worker side*. ``register_kv_caches`` finds the block dimension of every
layer's KV tensor (dimension of size ``num_blocks``, or ``num_blocks * k``
when vLLM splits blocks into kernel blocks) and copies whole blocks through
that dimension, so the attention backend's inner layout does not matter (CPU
and CUDA layouts differ). Each stored block is one host buffer holding every
layer's bytes (``cpu_store.BlockPayload``). The copies themselves are a
``block_copier.BlockCopier``: plain synchronous copies on CPU
(``HostCopier``); on CUDA (``DeviceCopier``) a side stream ordered against
the compute stream with stream waits (no host synchronisation), one batched
gather/scatter per layer through a device staging buffer and one
host<->device copy per block into pinned memory. Order within a step:
a fence (the compute stream waits for earlier stores), evictions and
stores of blocks the scheduler already freed in ``handle_preemptions``
(before the forward and before vLLM writes any block), loads in
``start_load_kv`` (before the forward: loads are synchronous, which sets
vLLM's ``has_sync_kv_loads``), stores of this step's newly full blocks in
``wait_for_save`` (after the forward; on CUDA they overlap the rest of the
step up to the next fence). Evicted host buffers are reused for new blocks.

A load whose entry is missing on a worker (it can only happen if a worker's
store diverged from the index) is reported through
``get_block_ids_with_load_errors``: vLLM recomputes those tokens, and the
index forgets the key.

Supported: models with one KV cache group (vLLM turns its hybrid allocator
off for connectors without ``SupportsHMA``), prefix caching on, any
attention backend whose per-layer KV tensor has a block dimension. Not
supported: pipeline parallelism (per-stage layers are not accounted for).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.core.sched.output import SchedulerOutput

from .block_copier import (
    PAYLOAD_ALIGN,
    BlockCopier,
    CopyTiming,
    make_copier,
    pack_layer_slots,
    payload_from_buffer,
)
from .cpu_store import BlockPayload, CPUStore
from .offload_metrics import ContinuumOffloadPromMetrics, ContinuumOffloadStats

try:  # vLLM >= 0.32
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata
except ImportError:  # pragma: no cover - older vLLM
    KVConnectorWorkerMetadata = object  # type: ignore[misc,assignment]

try:
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
except ImportError:  # pragma: no cover
    CacheHitSource = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger("vllm.continuum_plugin.kv_offload")

__all__ = [
    "ContinuumOffloadConnector",
    "ContinuumOffloadMetadata",
    "LoadJob",
    "OffloadSettings",
]

STORE_MODES = ("eager", "finish", "explicit")
STORE_BACKENDS = ("cpu", "lmcache")
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
    lmcache_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> OffloadSettings:
        extra = dict(extra or {})
        known = {
            "cpu_bytes", "store_mode", "store_backend", "min_load_blocks", "hold_seconds",
            "max_held_fraction", "max_job_held_fraction", "lmcache_config",
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
        lmcache_config = extra.get("lmcache_config") or {}
        if not isinstance(lmcache_config, dict):
            raise ValueError("ContinuumOffloadConnector: lmcache_config must be an object")
        return cls(
            cpu_bytes=cpu_bytes,
            store_mode=store_mode,
            store_backend=store_backend,
            min_load_blocks=max(1, min_load_blocks),
            hold_seconds=hold_seconds,
            max_held_fraction=max_held,
            max_job_held_fraction=max_job_held,
            lmcache_config=dict(lmcache_config),
        )


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


# ----------------------------------------------------------------------
# The connector
# ----------------------------------------------------------------------
def _recompute_failed_loads(vllm_config: Any) -> None:
    """The store is a cache: a block it promised but cannot deliver is a
    miss, recomputed, never a failed request. vLLM's default policy is
    ``fail`` (``KVTransferConfig.kv_load_failure_policy``) and the scheduler
    reads it right after building its connector, so the connector switches
    it to ``recompute`` here (logged; the setting has no other meaning for
    this connector)."""
    config = vllm_config.kv_transfer_config
    if getattr(config, "kv_load_failure_policy", "recompute") != "recompute":
        logger.info(
            "ContinuumOffloadConnector: kv_load_failure_policy=%r -> 'recompute' "
            "(a block the CPU store cannot deliver is recomputed)",
            config.kv_load_failure_policy,
        )
        config.kv_load_failure_policy = "recompute"


class ContinuumOffloadConnector(KVConnectorBase_V1):
    """CPU offload of KV blocks keyed by block hash (see module doc)."""

    if CacheHitSource is not None:
        _cache_hit_source = CacheHitSource.HOST

    @property
    def requires_kv_delivery(self) -> bool:
        # A best-effort cache: a dropped store is only a later miss.
        return False

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.settings = OffloadSettings.from_extra_config(
            self._kv_transfer_config.kv_connector_extra_config
        )
        self._enabled = bool(vllm_config.cache_config.enable_prefix_caching)
        if not self._enabled:
            logger.warning(
                "ContinuumOffloadConnector: prefix caching is disabled, so blocks have no "
                "hashes; nothing will be offloaded"
            )
        if kv_cache_config is not None and len(kv_cache_config.kv_cache_groups) > 1:
            raise ValueError(
                "ContinuumOffloadConnector supports one KV cache group; start vLLM with "
                "--disable-hybrid-kv-cache-manager"
            )
        self._world_size = _world_size(vllm_config)
        self._capacity_bytes = self.settings.cpu_bytes // self._world_size  # per worker
        self._block_size = int(vllm_config.cache_config.block_size)
        if kv_cache_config is not None and kv_cache_config.kv_cache_groups:
            self._block_size = int(kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size)
        self._sched: _SchedulerSide | None = None
        self._worker: _WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            _recompute_failed_loads(vllm_config)
            self._sched = _SchedulerSide(self, vllm_config, kv_cache_config)
        else:
            self._worker = _WorkerSide(self, vllm_config, kv_cache_config)
        logger.info(
            "ContinuumOffloadConnector (%s): store_mode=%s backend=%s budget=%.1f MiB per worker "
            "(%d worker(s)), block_size=%d",
            role.name,
            self.settings.store_mode,
            self.settings.store_backend,
            self._capacity_bytes / 2**20,
            self._world_size,
            self._block_size,
        )

    # ==================================================================
    # Worker side
    # ==================================================================
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if self._worker is not None:
            self._worker.register_kv_caches(kv_caches)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if self._worker is not None and isinstance(kv_connector_metadata, ContinuumOffloadMetadata):
            self._worker.before_forward(kv_connector_metadata)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        if self._worker is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if isinstance(meta, ContinuumOffloadMetadata):
            self._worker.before_forward(meta)  # no-op when handle_preemptions ran
            self._worker.load(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads complete (or are stream-ordered) before the forward pass

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        return  # whole blocks are copied once per step in wait_for_save

    def wait_for_save(self) -> None:
        if self._worker is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if isinstance(meta, ContinuumOffloadMetadata):
            self._worker.before_forward(meta)
            self._worker.load(meta)  # no-op when start_load_kv ran
            self._worker.after_forward(meta)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self._worker is None:
            return None, None
        return self._worker.get_finished(finished_req_ids), None

    def get_block_ids_with_load_errors(self) -> set[int]:
        if self._worker is None:
            return set()
        return self._worker.take_load_errors()

    def build_connector_worker_meta(self) -> Any:
        if self._worker is None:
            return None
        missing = self._worker.take_missing()
        return ContinuumOffloadWorkerMeta(missing) if missing else None

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()

    # ==================================================================
    # Scheduler side
    # ==================================================================
    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        if self._sched is not None:
            self._sched.block_pool = gpu_block_pool

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        if self._sched is None:
            return 0, False
        return self._sched.get_num_new_matched_tokens(request, num_computed_tokens), False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if self._sched is not None:
            self._sched.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        if self._sched is None:
            return ContinuumOffloadMetadata()
        return self._sched.build_connector_meta(scheduler_output)

    def on_new_request(self, request: Request) -> None:
        if self._sched is not None:
            self._sched.requests[request.request_id] = request

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        if self._sched is not None:
            self._sched.update_connector_output(connector_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        if self._sched is None:
            return False, None
        return self._sched.request_finished(request, block_ids), None

    def has_pending_push_work(self) -> bool:
        return self._sched is not None and self._sched.has_pending_work()

    def reset_cache(self) -> bool | None:
        if self._sched is None:
            return None
        self._sched.reset()
        return True

    def get_kv_connector_stats(self) -> ContinuumOffloadStats | None:
        side = self._sched if self._sched is not None else self._worker
        return side.take_stats() if side is not None else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> ContinuumOffloadStats:
        return ContinuumOffloadStats(data=data) if data is not None else ContinuumOffloadStats()

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[Any, Any],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> ContinuumOffloadPromMetrics:
        return ContinuumOffloadPromMetrics(
            vllm_config, metric_types, labelnames, per_engine_labelvalues
        )

    # ------------------------------------------------------------------
    # Public scheduler-side API for the plugin scheduler
    # ------------------------------------------------------------------
    def save_blocks(self, blocks: Iterable[Any], hold_job: str | None = None) -> int:
        """Store these GPU blocks (``KVCacheBlock``s with a hash) before the
        caller frees them. The copy runs before the next forward pass, so the
        caller may return the blocks to the pool right after this call.
        Blocks already stored are only marked recently used. With
        ``hold_job``, the entries are held for that job (kept ahead of plain
        LRU entries for ``hold_seconds``, until :meth:`end_hold`). Returns
        the number of blocks queued for copying."""
        return self._sched.save_blocks(blocks, hold_job) if self._sched is not None else 0

    def save_request(self, request: Request, hold_job: str | None = None) -> int:
        """``save_blocks`` for a request's own (full, hashed) blocks, before
        the scheduler frees them (e.g. a turn not pinned: TTL 0 / SLOW)."""
        return self._sched.save_request(request, hold_job) if self._sched is not None else 0

    def end_hold(self, job_id: str, demote: bool = False) -> int:
        """End ``job_id``'s hold: its next turn was admitted (its blocks
        become plain recently-used entries) or, with ``demote``, the job
        ended (its blocks become the next eviction victims). Returns the
        number of entries released."""
        return self._sched.end_hold(job_id, demote) if self._sched is not None else 0

    def demote_blocks(self, blocks: Iterable[Any]) -> int:
        """Make these blocks' store entries the next eviction victims (e.g.
        the job's last turn finished: nobody will reload them)."""
        return self._sched.demote_blocks(blocks) if self._sched is not None else 0

    def demote_request(self, request: Request) -> int:
        """``demote_blocks`` for the blocks only ``request`` uses (call
        before they are freed; blocks shared with other running requests,
        e.g. a common system prompt, are left where they are)."""
        return self._sched.demote_request(request) if self._sched is not None else 0

    def stored_prefix_tokens(self, request: Request, start_tokens: int = 0) -> int:
        """Tokens of ``request``'s prefix, from ``start_tokens`` on, that the
        store can reload now."""
        return self._sched.stored_prefix_tokens(request, start_tokens) if self._sched is not None else 0

    def reload_seconds_per_token(self) -> float | None:
        """Measured cost of reloading one token's KV (seconds): an EWMA over
        the steps that loaded (before the first load, over the steps that
        stored); None until a copy was measured."""
        return self._sched.reload_s_per_token if self._sched is not None else None

    def reload_seconds(self, num_tokens: int) -> float | None:
        per_token = self.reload_seconds_per_token()
        return None if per_token is None else per_token * max(0, num_tokens)

    def totals(self) -> dict[str, float]:
        """Cumulative counters since start (both sides; worker counters
        summed over workers) plus the index's occupancy now."""
        return self._sched.snapshot() if self._sched is not None else {}

    @property
    def store_capacity_bytes(self) -> int:
        return self._capacity_bytes

    @property
    def index(self) -> CPUStore | None:
        """The scheduler's view of the store (None on workers)."""
        return self._sched.index if self._sched is not None else None

    @property
    def worker_store(self) -> Any:
        """The worker's store (None on the scheduler side)."""
        return self._worker.store if self._worker is not None else None


# ----------------------------------------------------------------------
# Scheduler side
# ----------------------------------------------------------------------
class _SchedulerSide:
    def __init__(self, conn: ContinuumOffloadConnector, vllm_config: Any, kv_cache_config: Any) -> None:
        self.conn = conn
        self.settings = conn.settings
        self.mode = conn.settings.store_mode
        self.block_size = conn._block_size
        hash_block_size = getattr(kv_cache_config, "hash_block_size", None) or self.block_size
        if self.block_size % hash_block_size:
            raise ValueError(
                f"ContinuumOffloadConnector: block size {self.block_size} is not a multiple of "
                f"the hash block size {hash_block_size}"
            )
        self.hash_ratio = self.block_size // hash_block_size
        self.block_bytes = _block_bytes_estimate(kv_cache_config) if kv_cache_config else 1
        self.index = CPUStore(conn._capacity_bytes)
        if conn._capacity_bytes < self.block_bytes:
            logger.warning(
                "ContinuumOffloadConnector: cpu_bytes per worker (%d) is below one block (%d "
                "bytes); nothing will be stored",
                conn._capacity_bytes,
                self.block_bytes,
            )
        self.block_pool: Any = None
        self.requests: dict[str, Any] = {}
        self.stored_upto: dict[str, int] = {}
        self.last_match: dict[str, tuple[int, int]] = {}
        self.pending_loads: list[LoadJob] = []
        self.pinned_for_load: list[bytes] = []
        self.pending_pre_stores: list[tuple[bytes, int]] = []
        self.pending_final_stores: list[tuple[bytes, int]] = []
        self.pending_finished: list[str] = []
        self.clear_pending = False
        # Holds: job -> (deadline, its keys); keys handed over but not yet
        # in the index get their hold when admitted (build_connector_meta).
        self.hold_seconds = conn.settings.hold_seconds
        # (Key order: tail first, as handed over; see save_blocks.)
        self.job_holds: dict[str, tuple[float, dict[bytes, None]]] = {}
        self.pending_holds: dict[bytes, float] = {}
        self._next_hold_sweep = 0.0
        self.stats = ContinuumOffloadStats()
        # Cumulative counters of both sides (worker stats arrive through
        # update_connector_output), for totals() and tests.
        self.totals: dict[str, float] = {}
        self._last_gauges: tuple[int, int, int] | None = None
        self.load_s_per_token: float | None = None
        self.store_s_per_token: float | None = None

    # --- keys -------------------------------------------------------------
    def keys_of(self, request: Any) -> Sequence[bytes]:
        hashes = request.block_hashes
        r = self.hash_ratio
        if r == 1:
            return hashes
        return [hashes[(i + 1) * r - 1] for i in range(len(hashes) // r)]

    # --- lookups ----------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> int:
        self.requests.setdefault(request.request_id, request)
        if not self.conn._enabled or num_computed_tokens % self.block_size:
            return 0
        keys = self.keys_of(request)
        start = num_computed_tokens // self.block_size
        # Never the whole prompt: vLLM must compute at least one token.
        limit = min(len(keys), (request.num_tokens - 1) // self.block_size)
        n = 0
        index = self.index
        for i in range(start, limit):
            if keys[i] not in index:
                break
            n += 1
        if n < self.settings.min_load_blocks:
            self.last_match.pop(request.request_id, None)
            return 0
        self.last_match[request.request_id] = (start, n)
        return n * self.block_size

    def stored_prefix_tokens(self, request: Any, start_tokens: int = 0) -> int:
        keys = self.keys_of(request)
        start = start_tokens // self.block_size
        n = 0
        for i in range(start, len(keys)):
            if keys[i] not in self.index:
                break
            n += 1
        return n * self.block_size

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        req_id = request.request_id
        match = self.last_match.pop(req_id, None)
        if num_external_tokens <= 0:
            return
        n_ext = num_external_tokens // self.block_size
        if match is None or num_external_tokens % self.block_size or n_ext > match[1]:
            # Cannot happen with vLLM's scheduler; never load what was not
            # matched (the worker would report every block as failed).
            logger.error(
                "ContinuumOffloadConnector: unexpected external token count %d for %s (match %s)",
                num_external_tokens, req_id, match,
            )
            return
        start = match[0]
        keys = list(self.keys_of(request)[start : start + n_ext])
        block_ids = list(blocks.get_block_ids()[0][start : start + n_ext])
        for key in reversed(keys):  # the head ends most recently used
            self.index.pin(key)
            self.index.touch(key)
        self.pinned_for_load.extend(keys)
        self.pending_loads.append(LoadJob(req_id, keys, block_ids))
        self.stats.inc("load_hit_tokens", num_external_tokens)

    # --- per-step metadata -------------------------------------------------
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> ContinuumOffloadMetadata:
        meta = ContinuumOffloadMetadata(clear=self.clear_pending)
        self.clear_pending = False
        meta.loads, self.pending_loads = self.pending_loads, []
        queued: set[bytes] = set()

        pre, self.pending_pre_stores = self.pending_pre_stores, []
        for key, block_id in pre:
            self._admit(key, block_id, meta, meta.pre_stores, queued)
        finals, self.pending_final_stores = self.pending_final_stores, []
        for key, block_id in finals:
            self._admit(key, block_id, meta, meta.stores, queued)
        meta.finished_store_reqs, self.pending_finished = self.pending_finished, []
        if self.pending_holds:
            self._apply_pending_holds()

        if self.mode == "eager" and self.conn._enabled:
            self._plan_eager_stores(scheduler_output, meta, queued)
        if self.job_holds:
            self._sweep_job_holds()

        # Keys queued in this step were pinned so that a later admission of
        # the same step could not evict them (workers apply a step's
        # evictions before its stores). An entry loaded in this step may be
        # evicted from the next step on: workers apply a step's loads before
        # any later step's evictions.
        for key in queued:
            self.index.unpin(key)
        for key in self.pinned_for_load:
            self.index.unpin(key)
        self.pinned_for_load = []
        return meta

    def _plan_eager_stores(
        self, scheduler_output: SchedulerOutput, meta: ContinuumOffloadMetadata, queued: set[bytes]
    ) -> None:
        cached = scheduler_output.scheduled_cached_reqs
        # A preempted request lost its blocks: walk its chain again when it
        # resumes (blocks already stored are only touched).
        for req_id in getattr(cached, "resumed_req_ids", None) or ():
            self.stored_upto.pop(req_id, None)
        for req_id in getattr(scheduler_output, "preempted_req_ids", None) or ():
            self.stored_upto.pop(req_id, None)
        block_state = getattr(scheduler_output, "kv_connector_block_state", None)
        for req_id, num_new in scheduler_output.num_scheduled_tokens.items():
            request = self.requests.get(req_id)
            if request is None:
                continue
            computed_after = request.num_computed_tokens + num_new
            keys = self.keys_of(request)
            upto = min(computed_after // self.block_size, len(keys))
            done = self.stored_upto.get(req_id, 0)
            if upto <= done:
                continue
            block_ids = self._block_ids(req_id, block_state)
            if block_ids is None:
                continue
            upto = min(upto, len(block_ids))
            # Tail first, so the chain's head is the most recently used: LRU
            # then evicts a chain from its end, and what is left of it still
            # matches a prefix (a missing head would orphan the whole chain).
            for i in range(upto - 1, done - 1, -1):
                self._admit(keys[i], block_ids[i], meta, meta.stores, queued)
            self.stored_upto[req_id] = max(done, upto)

    def _block_ids(self, req_id: str, block_state: Any) -> list[int] | None:
        if block_state is not None:
            ids = block_state.get_block_ids(req_id)
            if ids is not None:
                return ids[0]
        manager = self.conn._kv_cache_manager
        if manager is not None:
            try:
                return manager.get_block_ids(req_id)[0]
            except (KeyError, IndexError):
                return None
        return None

    def _admit(
        self,
        key: bytes,
        block_id: int,
        meta: ContinuumOffloadMetadata,
        target: list[tuple[bytes, int]],
        queued: set[bytes],
    ) -> None:
        if block_id <= 0:  # the null block holds no KV
            return
        index = self.index
        if key in index:
            if key not in queued:
                index.touch(key)
            return
        evicted = index.evict_for(self.block_bytes)
        if not index.put(key, None, nbytes=self.block_bytes):
            self.stats.inc("dropped_store_blocks")
            return
        if evicted:
            meta.evictions.extend(evicted)
            self.stats.inc("evicted_blocks", len(evicted))
            self.stats.inc("evicted_bytes", len(evicted) * self.block_bytes)
        index.pin(key)  # until the end of this step's planning
        queued.add(key)
        target.append((key, block_id))

    # --- finish / explicit saves ------------------------------------------
    def request_finished(self, request: Any, block_ids: list[int]) -> bool:
        req_id = request.request_id
        self.requests.pop(req_id, None)
        self.last_match.pop(req_id, None)
        done = self.stored_upto.pop(req_id, 0)
        if not self.conn._enabled or self.mode == "explicit":
            return False
        keys = self.keys_of(request)
        upto = min(request.num_computed_tokens // self.block_size, len(keys), len(block_ids))
        start = done if self.mode == "eager" else 0
        items: list[tuple[bytes, int]] = []
        for i in range(upto - 1, start - 1, -1):  # tail first (see _plan_eager_stores)
            key = keys[i]
            if key in self.index:
                self.index.touch(key)
            elif block_ids[i] > 0:
                items.append((key, block_ids[i]))
        if not items:
            return False
        self.pending_final_stores.extend(items)
        self.pending_finished.append(req_id)
        return True

    def save_blocks(self, blocks: Iterable[Any], hold_job: str | None = None) -> int:
        if not self.conn._enabled:
            return 0
        blocks = [b for b in blocks if getattr(b, "block_hash", None) is not None
                  and not getattr(b, "is_null", False) and b.block_id > 0]
        held: dict[bytes, None] | None = None
        until = 0.0
        index = self.index
        # Blocks [0, num_held) are held for the job (the head: what a reload
        # needs first), the rest are plain LRU entries.
        num_held = 0
        if hold_job is not None and self.hold_seconds > 0:
            until = time.monotonic() + self.hold_seconds
            held = self.job_holds.get(hold_job, (0.0, {}))[1]
            self.job_holds[hold_job] = (until, held)
            num_held = min(len(blocks), self._hold_room(held))
        n = 0
        # Blocks come in prefix order; tail first, so the head ends most
        # recently used and, among held entries, is evicted last.
        for i in range(len(blocks) - 1, -1, -1):
            block = blocks[i]
            key = _block_key(block.block_hash)
            hold = held is not None and (i < num_held or key in held)
            if hold:
                held[key] = None  # type: ignore[index]
            if key in index:
                index.touch(key)
                if hold:
                    index.hold(key, until)
                continue
            self.pending_pre_stores.append((key, block.block_id))
            if hold:
                self.pending_holds[key] = until
            n += 1
        return n

    def _hold_room(self, job_held: dict[bytes, None]) -> int:
        """Blocks that may still be held for a job holding ``job_held``:
        within ``max_job_held_fraction`` of the store for the job and
        ``max_held_fraction`` for all jobs (pending holds included)."""
        settings = self.conn.settings
        capacity = self.index.capacity_bytes
        block = max(1, self.block_bytes)
        job_room = int(settings.max_job_held_fraction * capacity) // block - len(job_held)
        total_room = (int(settings.max_held_fraction * capacity) - self.index.held_bytes) // block
        return max(0, min(job_room, total_room - len(self.pending_holds)))

    def save_request(self, request: Any, hold_job: str | None = None) -> int:
        blocks = self._request_blocks(request)
        return self.save_blocks(blocks, hold_job) if blocks else 0

    def _request_blocks(self, request: Any) -> list[Any]:
        manager = self.conn._kv_cache_manager
        if manager is None:
            return []
        try:
            return list(manager.get_blocks(request.request_id).blocks[0])
        except (KeyError, IndexError, AttributeError):
            return []

    def end_hold(self, job_id: str, demote: bool) -> int:
        hold = self.job_holds.pop(job_id, None)
        if hold is None:
            return 0
        n = 0
        index = self.index
        # Keys are tail first: released in that order the head ends most
        # recently used; demoted head first, the tail ends first in line.
        for key in (reversed(hold[1]) if demote else hold[1]):
            self.pending_holds.pop(key, None)
            if demote:
                n += index.demote(key)
            else:
                n += index.release_hold(key)
        return n

    def _apply_pending_holds(self) -> None:
        # Called after this step's pre-stores were admitted into the index.
        index = self.index
        for key, until in self.pending_holds.items():
            index.hold(key, until)
        self.pending_holds.clear()

    def _sweep_job_holds(self) -> None:
        """Forget the key sets of holds whose deadline passed (the index
        ended those holds on its own): a job that never returns must not
        leak its bookkeeping. At most once per second."""
        now = time.monotonic()
        if now < self._next_hold_sweep:
            return
        self._next_hold_sweep = now + 1.0
        for job_id in [j for j, (until, _) in self.job_holds.items() if until <= now]:
            del self.job_holds[job_id]
        self.index.expire_holds(now)

    def demote_blocks(self, blocks: Iterable[Any]) -> int:
        n = 0
        for block in blocks:
            block_hash = getattr(block, "block_hash", None)
            if block_hash is not None and self.index.demote(_block_key(block_hash)):
                n += 1
        return n

    def demote_request(self, request: Any) -> int:
        # Blocks other requests still use (a shared system prompt) keep
        # their place: only this request's own context is done with.
        return self.demote_blocks(b for b in self._request_blocks(request) if b.ref_cnt <= 1)

    def has_pending_work(self) -> bool:
        return bool(
            self.pending_pre_stores
            or self.pending_final_stores
            or self.pending_finished
            or self.clear_pending
        )

    def reset(self) -> None:
        n = self.index.clear()
        self.stored_upto.clear()
        self.job_holds.clear()
        self.pending_holds.clear()
        self.clear_pending = True
        logger.info("ContinuumOffloadConnector: store reset (%d blocks dropped)", n)

    # --- worker feedback ----------------------------------------------------
    def update_connector_output(self, output: Any) -> None:
        worker_meta = getattr(output, "kv_connector_worker_meta", None)
        if isinstance(worker_meta, ContinuumOffloadWorkerMeta) and worker_meta.missing:
            for key in worker_meta.missing:
                self.index.pop(key)
        stats = getattr(output, "kv_connector_stats", None)
        if isinstance(stats, ContinuumOffloadStats):
            self._accumulate(stats)
            # Workers copy in parallel: sum(seconds)/sum(blocks) is the
            # per-worker cost of one block.
            self.load_s_per_token = self._ewma(
                self.load_s_per_token, stats.counter(LOAD_COST_SECONDS), stats.counter(LOAD_COST_BLOCKS)
            )
            self.store_s_per_token = self._ewma(
                self.store_s_per_token, stats.counter(STORE_COST_SECONDS), stats.counter(STORE_COST_BLOCKS)
            )

    def _ewma(self, prev: float | None, seconds: float, blocks: float) -> float | None:
        if seconds <= 0 or blocks <= 0:
            return prev
        per_token = seconds / (blocks * self.block_size)
        return per_token if prev is None else (1 - _EWMA_ALPHA) * prev + _EWMA_ALPHA * per_token

    @property
    def reload_s_per_token(self) -> float | None:
        """Measured reload cost; before any load, the measured store cost
        (the same copy in the other direction) stands in."""
        return self.load_s_per_token if self.load_s_per_token is not None else self.store_s_per_token

    def _accumulate(self, stats: ContinuumOffloadStats) -> None:
        totals = self.totals
        for name, value in stats.data["counters"].items():
            totals[name] = totals.get(name, 0) + value

    def snapshot(self) -> dict[str, float]:
        out = dict(self.totals)
        for name, value in self.stats.data["counters"].items():  # not drained yet
            out[name] = out.get(name, 0) + value
        out.update(
            store_used_bytes=self.index.used_bytes,
            store_blocks=len(self.index),
            store_capacity_bytes=self.index.capacity_bytes,
            store_pinned_bytes=self.index.pinned_bytes,
            store_held_bytes=self.index.held_bytes,
            held_jobs=len(self.job_holds),
        )
        return out

    def take_stats(self) -> ContinuumOffloadStats | None:
        self._accumulate(self.stats)
        gauges = (self.index.used_bytes, len(self.index), self.index.held_bytes)
        if gauges != self._last_gauges or not self.stats.is_empty():
            self._last_gauges = gauges
            self.stats.set_gauge("store_used_bytes", gauges[0])
            self.stats.set_gauge("store_blocks", gauges[1])
            self.stats.set_gauge("store_held_bytes", gauges[2])
            self.stats.set_gauge("store_capacity_bytes", self.index.capacity_bytes)
        if self.stats.is_empty():
            return None
        out, self.stats = self.stats, ContinuumOffloadStats()
        return out


# ----------------------------------------------------------------------
# Worker side
# ----------------------------------------------------------------------
def block_major_view(tensor: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """A view of ``tensor`` whose dim 0 indexes vLLM blocks.

    vLLM 0.32 hands connectors ``[B, H, N, C]`` views (B = blocks, or
    ``blocks * k`` when a block is split into k kernel blocks); older
    backends used e.g. ``[2, B, ...]``. The first dimension of size
    ``num_blocks`` is the block dimension; failing that, a dim 0 of size
    ``num_blocks * k`` is grouped by k.
    """
    if tensor.dim() == 0:
        raise ValueError("scalar KV cache tensor")
    if tensor.shape[0] == num_blocks:
        return tensor
    for dim in range(1, tensor.dim()):
        if tensor.shape[dim] == num_blocks:
            return tensor.movedim(dim, 0)
    if tensor.shape[0] > num_blocks and tensor.shape[0] % num_blocks == 0:
        return tensor.unflatten(0, (num_blocks, tensor.shape[0] // num_blocks))
    raise ValueError(
        f"no block dimension of size {num_blocks} in a KV cache tensor of shape "
        f"{tuple(tensor.shape)}"
    )


class _WorkerSide:
    """Applies each step's metadata to this worker's KV cache and store.

    Per step (see ``BlockCopier`` for the stream contract): ``before_forward``
    (fence, evictions, stores of blocks the scheduler already freed),
    ``load`` (before the forward pass), ``after_forward`` (stores of this
    step's newly full blocks, which the compute stream waits for only at the
    next step's fence). Each phase runs once per metadata object, whichever
    hook calls it first.
    """

    def __init__(self, conn: ContinuumOffloadConnector, vllm_config: Any, kv_cache_config: Any) -> None:
        self.conn = conn
        self.kv_cache_config = kv_cache_config
        self.copier: BlockCopier | None = None
        self.block_nbytes = 0
        self.device: torch.device | None = None
        self.store: Any = None
        self._before_done: ContinuumOffloadMetadata | None = None
        self._load_done: ContinuumOffloadMetadata | None = None
        self._after_done: ContinuumOffloadMetadata | None = None
        self._expected_sends: set[str] = set()
        self._done_sends: set[str] = set()
        self._seen_finished: set[str] = set()
        self._load_errors: set[int] = set()
        self._missing: set[bytes] = set()
        self._spare: list[BlockPayload] = []
        self._recycle = False
        self.stats = ContinuumOffloadStats()

    # --- set-up -------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        num_blocks = int(self.kv_cache_config.num_blocks)
        seen: set[tuple[Any, ...]] = set()
        views: list[tuple[str, torch.Tensor]] = []
        for name, tensor in kv_caches.items():
            if not isinstance(tensor, torch.Tensor):
                raise ValueError(
                    f"ContinuumOffloadConnector: KV cache of layer {name} is a "
                    f"{type(tensor).__name__}, not a tensor"
                )
            ident = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
            if ident in seen:  # cross-layer KV sharing: one copy per storage
                continue
            seen.add(ident)
            try:
                views.append((name, block_major_view(tensor, num_blocks)))
            except ValueError as e:
                raise ValueError(f"ContinuumOffloadConnector: layer {name}: {e}") from e
            if self.device is None:
                self.device = tensor.device
        if not views:
            raise ValueError("ContinuumOffloadConnector: no KV cache tensors to offload")
        assert self.device is not None
        layers, self.block_nbytes = pack_layer_slots(views)
        self.copier = make_copier(layers, self.block_nbytes, self.device)
        self.store = self._make_store()
        # Evicted payloads are reused for new blocks (saves an allocation
        # per stored block); not with stores that own their memory.
        self._recycle = type(self.store) is CPUStore
        estimate = _block_bytes_estimate(self.kv_cache_config)
        if self.block_nbytes > estimate:
            logger.warning(
                "ContinuumOffloadConnector: a block payload (%d bytes) exceeds the scheduler's "
                "estimate (%d); the worker store may evict on its own (reloads then fall back "
                "to recompute)",
                self.block_nbytes, estimate,
            )
        logger.info(
            "ContinuumOffloadConnector worker: %d KV tensors, %d bytes per block, device %s, "
            "%s, store capacity %d blocks",
            len(layers), self.block_nbytes, self.device, type(self.copier).__name__,
            self.conn._capacity_bytes // max(1, self.block_nbytes),
        )

    def _make_store(self) -> Any:
        capacity = self.conn._capacity_bytes
        if self.conn.settings.store_backend == "lmcache":
            from .lmcache_store import LMCacheStore

            return LMCacheStore(
                capacity,
                block_nbytes=self.block_nbytes,
                config=self.conn.settings.lmcache_config,
                on_evict=self._on_store_evict,
            )
        return CPUStore(capacity, on_evict=self._on_store_evict)

    def _on_store_evict(self, key: Any, nbytes: int) -> None:
        # The store evicted on its own: the scheduler's index diverged.
        self._missing.add(key)

    # --- step phases ----------------------------------------------------------
    def before_forward(self, meta: ContinuumOffloadMetadata) -> None:
        if self._before_done is meta:
            return
        self._before_done = meta
        if meta.finished_store_reqs:
            self._expected_sends.update(meta.finished_store_reqs)
        if self.store is None or self.copier is None:
            return
        # Stores queued after the previous forward read blocks the scheduler
        # may since have freed and reallocated: order them before this step.
        self.copier.fence()
        if (meta.clear or meta.evictions) and not self._recycle:
            # A store that owns its memory may hand it out again at once.
            self.copier.payloads_ready()
        if meta.clear:
            self.store.clear()
        recycle = self._recycle
        for key in meta.evictions:
            payload = self.store.pop(key)
            if recycle and payload is not None and len(self._spare) < _MAX_SPARE_PAYLOADS:
                # Reused by a later copy on the same stream: ordered after
                # any copy still reading or writing it.
                self._spare.append(payload)
        if meta.pre_stores:
            # The scheduler freed these blocks already; this step's forward
            # may overwrite them.
            self._copy_out(meta.pre_stores, before_reuse=True)

    def load(self, meta: ContinuumOffloadMetadata) -> None:
        if self._load_done is meta:
            return
        self._load_done = meta
        if meta.loads and self.store is not None:
            self._copy_in(meta.loads)

    def after_forward(self, meta: ContinuumOffloadMetadata) -> None:
        if self._after_done is meta:
            return
        self._after_done = meta
        if meta.stores and self.store is not None:
            # Blocks of running (or delayed-free finished) requests: nothing
            # writes them before the scheduler frees them, and every later
            # step starts with a fence.
            self._copy_out(meta.stores, before_reuse=False)
        if meta.finished_store_reqs:
            self._done_sends.update(meta.finished_store_reqs)

    def get_finished(self, finished_req_ids: set[str]) -> set[str] | None:
        for req_id in finished_req_ids:
            if req_id in self._expected_sends:
                self._seen_finished.add(req_id)
        ready = self._done_sends & self._seen_finished
        if not ready:
            return None
        self._done_sends -= ready
        self._seen_finished -= ready
        self._expected_sends -= ready
        return ready

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def take_missing(self) -> set[bytes]:
        missing, self._missing = self._missing, set()
        return missing

    def take_stats(self) -> ContinuumOffloadStats | None:
        if self.copier is not None:
            for timing in self.copier.take_timings():
                self._observe(timing)
        # (Occupancy gauges come from the scheduler's index.)
        if self.stats.is_empty():
            return None
        out, self.stats = self.stats, ContinuumOffloadStats()
        return out

    def shutdown(self) -> None:
        if self.copier is not None:
            self.copier.synchronize()
        if self.store is not None:
            self.store.clear()

    # --- copies -----------------------------------------------------------------
    def _new_payload(self) -> BlockPayload:
        assert self.copier is not None
        if self._spare:
            return self._spare.pop()
        allocate = getattr(self.store, "allocate_buffer", None)
        if allocate is not None:  # e.g. LMCache-owned memory
            buf = allocate(self.block_nbytes, self.device is not None and self.device.type == "cuda")
            return payload_from_buffer(buf, self.copier.layers)
        return self.copier.new_payload()

    def _copy_out(self, items: list[tuple[bytes, int]], before_reuse: bool) -> None:
        """KV cache blocks -> store."""
        assert self.copier is not None
        store = self.store
        todo = [(k, b) for k, b in items if k not in store]
        for k, _ in items:
            store.touch(k)
        if not todo:
            return
        payloads = [self._new_payload() for _ in todo]
        self.copier.copy_out([b for _, b in todo], payloads, before_reuse=before_reuse)
        stored = 0
        for (key, _), payload in zip(todo, payloads):
            if store.put(key, payload, nbytes=self.block_nbytes):
                stored += 1
            else:
                self._missing.add(key)
        self.stats.inc("stored_blocks", stored)
        self.stats.inc("stored_bytes", stored * self.block_nbytes)

    def _copy_in(self, jobs: list[LoadJob]) -> None:
        """Store -> KV cache blocks."""
        assert self.copier is not None
        store = self.store
        block_ids: list[int] = []
        payloads: list[BlockPayload] = []
        failed = 0
        for job in jobs:
            for key, block_id in zip(job.keys, job.block_ids):
                payload = store.get(key)
                if payload is None:
                    self._load_errors.add(block_id)
                    self._missing.add(key)
                    failed += 1
                    continue
                block_ids.append(block_id)
                payloads.append(payload)
        if failed:
            self.stats.inc("load_failed_blocks", failed)
            logger.warning(
                "ContinuumOffloadConnector: %d promised block(s) missing; vLLM recomputes them",
                failed,
            )
        if not payloads:
            return
        self.copier.copy_in(block_ids, payloads)
        self.stats.inc("loaded_blocks", len(payloads))
        self.stats.inc("loaded_bytes", len(payloads) * self.block_nbytes)

    def _observe(self, timing: CopyTiming) -> None:
        if timing.kind == "load":
            self.stats.observe("load_seconds", timing.seconds)
            self.stats.inc(LOAD_COST_SECONDS, timing.seconds)
            self.stats.inc(LOAD_COST_BLOCKS, timing.blocks)
        else:
            self.stats.observe("store_seconds", timing.seconds)
            self.stats.inc(STORE_COST_SECONDS, timing.seconds)
            self.stats.inc(STORE_COST_BLOCKS, timing.blocks)
