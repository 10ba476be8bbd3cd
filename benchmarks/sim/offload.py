"""The worker side of the offload connectors, in simulation.

Under an offload arm the real scheduler runs a connector's scheduler side
unchanged; only the copies between GPU and host memory are simulated. Two
workers, one per connector:

* :class:`SimulatedOffloadWorker` -- the plugin's ``ContinuumOffloadConnector``.
  Its copies are synchronous (the plugin's worker copies before the forward
  pass and after it), so a step's loaded and stored tokens are priced in that
  step over PCIe. It reports the requests whose final stores the step ran
  (``finished_sending``: vLLM frees their blocks then) and the copies' cost
  (the connector's measured-cost counters, from which the plugin prices a
  context's rebuild).
* :class:`SimulatedNativeOffloadWorker` -- vLLM's own ``OffloadingConnector``
  (``--kv-offloading-size``, its ``OffloadingConnectorScheduler`` and
  ``CPUOffloadingManager``). On a GPU its worker copies asynchronously on
  CUDA streams: a step's store jobs start at the next step (``prepare_store_kv``
  defers them), load jobs start at once, neither holds up the forward pass,
  and a request whose prefix is being loaded waits in
  ``WAITING_FOR_REMOTE_KVS`` until its load is reported (``finished_recving``).
  Here each direction of the host link is a FIFO queue on the virtual clock;
  a job completes when its copy has crossed the link, and is reported (in
  ``OffloadingWorkerMetadata.completed_jobs``) by the first step that ends
  after that. A flush (``jobs_to_flush``: a block about to be reused while its
  store is in flight) waits for those stores, which stalls the step.

Each step the engine calls :meth:`submit` with the ``SchedulerOutput`` before
pricing the step, then :meth:`report` with the step's end time to build the
``KVConnectorOutput``; between steps it wakes for :meth:`next_completion_s`.

Invariant: a simulated copy never fails, so the scheduler's store index is
exactly what the workers hold (no ``missing`` keys, no failed loads).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
    TransferJob,
)
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_offload.base import GPULoadStoreSpec
from vllm.v1.outputs import KVConnectorOutput

from vllm_continuum_plugin.connectors.offload_metadata import ContinuumOffloadMetadata
from vllm_continuum_plugin.connectors.offload_metrics import ContinuumOffloadStats
from vllm_continuum_plugin.connectors.offload_settings import (
    LOAD_COST_BLOCKS,
    LOAD_COST_SECONDS,
    STORE_COST_BLOCKS,
    STORE_COST_SECONDS,
)

__all__ = ["OffloadCopies", "OffloadWorker", "SimulatedNativeOffloadWorker", "SimulatedOffloadWorker"]


@dataclass(frozen=True)
class OffloadCopies:
    """What one step copies. ``synchronous``: the step waits for the copies
    (they are priced in it); otherwise they overlap compute and only
    ``stall_s`` (a flush) is added to the step."""

    loaded_tokens: int = 0
    stored_tokens: int = 0
    synchronous: bool = True
    stall_s: float = 0.0
    # Requests whose prefix starts loading in this step, asynchronously (they
    # wait in WAITING_FOR_REMOTE_KVS until the load is reported done).
    load_requests: tuple[str, ...] = ()


class OffloadWorker(Protocol):
    """A connector's worker side as the replay engine drives it."""

    def submit(self, output: SchedulerOutput, now_s: float) -> OffloadCopies:
        """The step that ``output`` schedules starts at ``now_s``."""
        ...

    def report(self, end_s: float) -> KVConnectorOutput | None:
        """What the workers report with the step that ends at ``end_s``."""
        ...

    def next_completion_s(self) -> float | None:
        """When the next copy in flight completes (``None``: none in flight)."""
        ...


class SimulatedOffloadWorker:
    """The plugin's connector: a step's offload metadata as copy sizes (priced
    in the step) and worker reports.

    ``copy_seconds(tokens)``: what copying that many tokens' KV over the host
    link costs (reported as the connector's measured cost)."""

    def __init__(self, block_size: int, copy_seconds: Callable[[int], float]) -> None:
        self.block_size = block_size
        self.copy_seconds = copy_seconds
        self._pending: KVConnectorOutput | None = None

    def submit(self, output: SchedulerOutput, now_s: float) -> OffloadCopies:
        meta = output.kv_connector_metadata
        self._pending = None
        if not isinstance(meta, ContinuumOffloadMetadata) or meta.is_empty():
            return OffloadCopies()
        loaded_blocks = sum(len(job.keys) for job in meta.loads)
        stored_blocks = len(meta.pre_stores) + len(meta.stores)
        stats = ContinuumOffloadStats()
        if loaded_blocks:
            stats.inc(LOAD_COST_SECONDS, self.copy_seconds(loaded_blocks * self.block_size))
            stats.inc(LOAD_COST_BLOCKS, loaded_blocks)
        if stored_blocks:
            stats.inc(STORE_COST_SECONDS, self.copy_seconds(stored_blocks * self.block_size))
            stats.inc(STORE_COST_BLOCKS, stored_blocks)
        finished = set(meta.finished_store_reqs)
        self._pending = KVConnectorOutput(finished_sending=finished or None, kv_connector_stats=stats)
        return OffloadCopies(loaded_blocks * self.block_size, stored_blocks * self.block_size)

    def report(self, end_s: float) -> KVConnectorOutput | None:
        out, self._pending = self._pending, None
        return out

    def next_completion_s(self) -> float | None:
        return None  # every copy completes within its step


class _Link:
    """One direction of the host link: copies cross it one after another."""

    def __init__(self) -> None:
        self.busy_until_s = 0.0

    def enqueue(self, now_s: float, seconds: float) -> float:
        """A copy of ``seconds`` submitted at ``now_s``; returns when it ends."""
        self.busy_until_s = max(now_s, self.busy_until_s) + seconds
        return self.busy_until_s


class SimulatedNativeOffloadWorker:
    """vLLM's ``OffloadingConnectorWorker`` with its copies on the virtual
    clock (see the module docstring for the semantics it keeps).

    ``copy_seconds(tokens)``: one copy's time on the host link, per
    direction (PCIe is full duplex: loads and stores do not queue behind each
    other); ``bytes_per_token``: KV bytes per token and GPU, for the transfer
    statistics the scheduler side aggregates.

    A step that schedules nothing starts its stores at once: vLLM defers a
    step's stores to the next step only so that they start after that step's
    sampling, and an idle engine has none (it keeps stepping while the
    connector has work, ``has_pending_push_work``).

    Invariants: every submitted job is reported completed exactly once, by
    the first report at or after its end; a load's request is reported in
    ``finished_recving`` with its job.
    """

    def __init__(self, block_size: int, copy_seconds: Callable[[int], float], bytes_per_token: int) -> None:
        self.block_size = block_size
        self.copy_seconds = copy_seconds
        self.bytes_per_token = bytes_per_token
        self._h2d = _Link()
        self._d2h = _Link()
        self._deferred_stores: dict[int, TransferJob] = {}  # start with the next step
        # heap of copies in flight: (end_s, job_id, the load's req_id or None, bytes, seconds)
        self._in_flight: list[tuple[float, int, str | None, int, float]] = []

    def _blocks(self, job: TransferJob) -> int:
        """GPU blocks the job copies (its GPU side's block ids; the host side
        counts chunks, which may hold several blocks)."""
        spec = job.dst_spec if isinstance(job.dst_spec, GPULoadStoreSpec) else job.src_spec
        if not isinstance(spec, GPULoadStoreSpec):
            raise TypeError(f"transfer job {job!r} has no GPU side")
        return len(spec.block_ids)

    def _start(self, job_id: int, job: TransferJob, now_s: float, is_load: bool) -> tuple[int, float]:
        """Queues one job's copy; returns (tokens, end time)."""
        tokens = self._blocks(job) * self.block_size
        seconds = self.copy_seconds(tokens)
        end = (self._h2d if is_load else self._d2h).enqueue(now_s, seconds)
        heapq.heappush(self._in_flight, (end, job_id, job.req_id if is_load else None,
                                         tokens * self.bytes_per_token, seconds))
        return tokens, end

    def submit(self, output: SchedulerOutput, now_s: float) -> OffloadCopies:
        meta = output.kv_connector_metadata
        if not isinstance(meta, OffloadingConnectorMetadata):
            return OffloadCopies(synchronous=False)
        stored = loaded = 0
        # handle_preemptions + start_kv_transfers: the last step's stores,
        # then this step's loads, start now.
        for job_id, job in self._deferred_stores.items():
            stored += self._start(job_id, job, now_s, is_load=False)[0]
        self._deferred_stores = {}
        stores = dict(meta.store_jobs)
        flush = meta.jobs_to_flush or set()
        for job_id in sorted(flush & stores.keys()):
            stored += self._start(job_id, stores.pop(job_id), now_s, is_load=False)[0]
        for job_id, job in meta.load_jobs.items():
            loaded += self._start(job_id, job, now_s, is_load=True)[0]
        load_requests = tuple(dict.fromkeys(job.req_id for job in meta.load_jobs.values()))
        # The step waits for the flushed stores (a block is about to be reused).
        stall_until = max((end for end, job_id, *_ in self._in_flight if job_id in flush), default=now_s)
        # prepare_store_kv: this step's stores start with the next step.
        if output.total_num_scheduled_tokens == 0:
            for job_id, job in stores.items():
                stored += self._start(job_id, job, now_s, is_load=False)[0]
        else:
            self._deferred_stores = stores
        return OffloadCopies(loaded, stored, synchronous=False, stall_s=max(0.0, stall_until - now_s),
                             load_requests=load_requests)

    def report(self, end_s: float) -> KVConnectorOutput | None:
        """get_finished + build_connector_worker_meta: every job whose copy
        ended by ``end_s``."""
        done = OffloadingWorkerMetadata()
        recving: set[str] = set()
        while self._in_flight and self._in_flight[0][0] <= end_s + 1e-9:  # float sums of step times
            _, job_id, req_id, nbytes, seconds = heapq.heappop(self._in_flight)
            done.mark_completed(job_id)
            stats = done.transfer_stats.store if req_id is None else done.transfer_stats.load
            stats.record(nbytes, seconds)
            if req_id is not None:
                recving.add(req_id)
        if not done.completed_jobs:
            return None
        return KVConnectorOutput(finished_recving=recving or None, kv_connector_worker_meta=done)

    def next_completion_s(self) -> float | None:
        return self._in_flight[0][0] if self._in_flight else None
