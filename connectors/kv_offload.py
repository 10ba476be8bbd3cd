"""``ContinuumOffloadConnector``: copy KV blocks to host memory and reload them.

Enable with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "ContinuumOffloadConnector",
        "kv_connector_module_path": "vllm_continuum_plugin.connectors.kv_offload",
        "kv_role": "kv_both", "kv_connector_extra_config": {"cpu_bytes": 2000000000}}'

Modules: this one (the connector vLLM loads), ``offload_settings``
(``kv_connector_extra_config``), ``offload_metadata`` (what crosses from the
scheduler to the workers and back), ``offload_scheduler`` (the scheduler
side) and ``offload_worker`` (the worker side); ``cpu_store`` and
``block_copier`` underneath.

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
* ``victim``: ``explicit``, and every prefix-cached block vLLM's GPU pool
  evicts to make room (``eviction_tap``), copied before the step's forward
  pass overwrites it; blocks of a job that ended are not. The host tier then
  holds what the GPU no longer does: GPU and host together keep up to their
  sum in distinct blocks, where write-through keeps the larger of the two.
  Works under the stock scheduler too.

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
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.core.sched.output import SchedulerOutput

from vllm_continuum_plugin.clock import Clock
from .cpu_store import CPUStore
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

# (Re-exported: the connector's public names and the sides' own modules.)
from .offload_metadata import (  # noqa: F401
    ContinuumOffloadMetadata,
    ContinuumOffloadWorkerMeta,
    LoadJob,
    _block_bytes_estimate,
    _block_key,
    _world_size,
)
from .offload_scheduler import _SchedulerSide
from .offload_settings import (  # noqa: F401
    DEFAULT_CPU_BYTES,
    DEFAULT_HOLD_SECONDS,
    LOAD_COST_BLOCKS,
    LOAD_COST_SECONDS,
    STORE_BACKENDS,
    STORE_COST_BLOCKS,
    STORE_COST_SECONDS,
    STORE_MODES,
    OffloadSettings,
    SideSpec,
)
from .offload_worker import _WorkerSide, block_major_view  # noqa: F401

logger = logging.getLogger("vllm.continuum_plugin.kv_offload")

__all__ = [
    "ContinuumOffloadConnector",
    "ContinuumOffloadMetadata",
    "LoadJob",
    "OffloadSettings",
]

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
        spec = SideSpec(self.settings, self._block_size, self._capacity_bytes, self._enabled)
        if role == KVConnectorRole.SCHEDULER:
            _recompute_failed_loads(vllm_config)
            self._sched = _SchedulerSide(spec, vllm_config, kv_cache_config, lambda: self._kv_cache_manager)
        else:
            self._worker = _WorkerSide(spec, vllm_config, kv_cache_config)
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
            self._sched.bind_block_pool(gpu_block_pool)

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
    def set_clock(self, clock: Clock) -> None:
        """Read hold deadlines from ``clock`` (the Continuum scheduler hands
        in its own, so holds and pins share one time source)."""
        if self._sched is not None:
            self._sched.clock = clock

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
