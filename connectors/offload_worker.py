"""The offload connector's worker side: the host store of KV blocks and the
copies between it and the device's KV cache (see ``kv_offload`` for the
order of operations within a step)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from .block_copier import BlockCopier, CopyTiming, make_copier, pack_layer_slots, payload_from_buffer
from .cpu_store import BlockPayload, CPUStore
from .offload_metadata import ContinuumOffloadMetadata, LoadJob, _block_bytes_estimate
from .offload_metrics import ContinuumOffloadStats
from .offload_settings import (
    _MAX_SPARE_PAYLOADS,
    LOAD_COST_BLOCKS,
    LOAD_COST_SECONDS,
    STORE_COST_BLOCKS,
    STORE_COST_SECONDS,
    SideSpec,
)


logger = logging.getLogger("vllm.continuum_plugin.kv_offload")

__all__ = ["_WorkerSide", "block_major_view"]

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

    def __init__(self, spec: SideSpec, vllm_config: Any, kv_cache_config: Any) -> None:
        self.spec = spec
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
            self.spec.capacity_bytes // max(1, self.block_nbytes),
        )

    def _make_store(self) -> Any:
        capacity = self.spec.capacity_bytes
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
