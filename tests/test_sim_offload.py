"""The simulated worker of vLLM's native OffloadingConnector (pure logic):
asynchronous copies on the virtual clock, per-direction queues, deferred
stores, flushes, each completion reported once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    TransferJob,
)
from vllm.v1.kv_offload.base import GPULoadStoreSpec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from benchmarks.sim.offload import SimulatedNativeOffloadWorker

BLOCK = 16


def gpu(n: int) -> GPULoadStoreSpec:
    return GPULoadStoreSpec(list(range(n)), group_sizes=[n], block_indices=[0])


def load(req: str, blocks: int) -> TransferJob:
    return TransferJob(req, CPULoadStoreSpec(list(range(blocks))), gpu(blocks))


def store(req: str, blocks: int) -> TransferJob:
    return TransferJob(req, gpu(blocks), CPULoadStoreSpec(list(range(blocks))))


def step(loads: dict[int, TransferJob] | None = None, stores: dict[int, TransferJob] | None = None,
         flush: set[int] | None = None, tokens: int = 1) -> SimpleNamespace:
    meta = OffloadingConnectorMetadata(load_jobs=loads or {}, store_jobs=stores or {}, jobs_to_flush=flush or set())
    return SimpleNamespace(kv_connector_metadata=meta, total_num_scheduled_tokens=tokens)


def worker() -> SimulatedNativeOffloadWorker:
    # 1 ms per block of 16 tokens; 100 bytes per token.
    return SimulatedNativeOffloadWorker(BLOCK, lambda tokens: tokens / BLOCK * 1e-3, bytes_per_token=100)


def test_loads_complete_asynchronously_and_are_reported_once() -> None:
    w = worker()
    copies = w.submit(step(loads={1: load("a", 10), 2: load("b", 5)}), now_s=0.0)
    assert (copies.loaded_tokens, copies.synchronous, copies.stall_s) == (15 * BLOCK, False, 0.0)
    # FIFO on the host->GPU link: a ends at 10 ms, b at 15 ms.
    assert w.next_completion_s() == pytest.approx(0.010)
    assert w.report(0.005) is None
    out = w.report(0.012)
    assert out.finished_recving == {"a"} and set(out.kv_connector_worker_meta.completed_jobs) == {1}
    assert out.kv_connector_worker_meta.transfer_stats.load.bytes == 10 * BLOCK * 100
    out = w.report(0.020)
    assert out.finished_recving == {"b"} and set(out.kv_connector_worker_meta.completed_jobs) == {2}
    assert w.report(1.0) is None and w.next_completion_s() is None


def test_stores_start_with_the_next_step_and_do_not_delay_loads() -> None:
    w = worker()
    copies = w.submit(step(stores={1: store("a", 20)}), now_s=0.0)
    assert copies.stored_tokens == 0 and w.next_completion_s() is None  # deferred (prepare_store_kv)
    copies = w.submit(step(loads={2: load("b", 4)}), now_s=0.002)
    assert copies.stored_tokens == 20 * BLOCK and copies.loaded_tokens == 4 * BLOCK
    # Full duplex: the load does not queue behind the 20 ms store.
    out = w.report(0.006)
    assert out.finished_recving == {"b"} and set(out.kv_connector_worker_meta.completed_jobs) == {2}
    out = w.report(0.022)
    assert out.finished_recving is None and set(out.kv_connector_worker_meta.completed_jobs) == {1}


def test_an_idle_step_starts_its_stores_at_once() -> None:
    w = worker()
    w.submit(step(stores={1: store("a", 3)}, tokens=0), now_s=1.0)
    assert w.next_completion_s() == pytest.approx(1.003)


def test_a_flush_stalls_the_step_until_the_store_has_crossed() -> None:
    w = worker()
    w.submit(step(stores={1: store("a", 30)}), now_s=0.0)
    w.submit(step(), now_s=0.001)  # job 1 starts: ends at 31 ms
    copies = w.submit(step(flush={1}), now_s=0.010)
    assert copies.stall_s == pytest.approx(0.021)
    # A flushed job of this very step starts now and is waited for too.
    copies = w.submit(step(stores={7: store("b", 5)}, flush={7}), now_s=0.040)
    assert copies.stored_tokens == 5 * BLOCK and copies.stall_s == pytest.approx(0.005)


def test_a_job_without_a_gpu_side_is_an_error() -> None:
    w = worker()
    bad = TransferJob("x", CPULoadStoreSpec([0]), CPULoadStoreSpec([1]))
    with pytest.raises(TypeError, match="no GPU side"):
        w.submit(step(loads={1: bad}), now_s=0.0)
