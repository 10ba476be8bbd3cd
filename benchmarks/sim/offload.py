"""The worker side of the plugin's CPU offload connector, in simulation.

Under an offload arm the real scheduler runs the plugin's
``ContinuumOffloadConnector`` scheduler side unchanged: its store index (LRU
by bytes, job holds), the matches it reports to vLLM
(``get_num_new_matched_tokens``), the loads and stores it plans per step and
the delayed frees of finished requests. Only the copies are simulated: this
module reads each step's ``ContinuumOffloadMetadata`` and

* counts the tokens loaded (host → GPU, before the forward pass) and stored
  (GPU → host) so the step model prices them over PCIe;
* reports the requests whose final stores the step ran
  (``finished_sending``: vLLM frees their blocks then), and the copies'
  cost (the connector's measured-cost counters, from which the plugin prices
  a context's rebuild).

Invariant: a simulated copy never fails, so the scheduler's store index is
exactly what the workers hold (no ``missing`` keys to report).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import KVConnectorOutput

from vllm_continuum_plugin.connectors.offload_metadata import ContinuumOffloadMetadata
from vllm_continuum_plugin.connectors.offload_metrics import ContinuumOffloadStats
from vllm_continuum_plugin.connectors.offload_settings import (
    LOAD_COST_BLOCKS,
    LOAD_COST_SECONDS,
    STORE_COST_BLOCKS,
    STORE_COST_SECONDS,
)

__all__ = ["OffloadIO", "SimulatedOffloadWorker"]


@dataclass(frozen=True)
class OffloadIO:
    """One step's copies and what the workers report for it."""

    loaded_tokens: int
    stored_tokens: int
    connector_output: KVConnectorOutput | None


class SimulatedOffloadWorker:
    """Turns a step's offload metadata into copy sizes and worker reports.

    ``copy_seconds(tokens)``: what copying that many tokens' KV over the
    host link costs (reported as the connector's measured cost)."""

    def __init__(self, block_size: int, copy_seconds: Callable[[int], float]) -> None:
        self.block_size = block_size
        self.copy_seconds = copy_seconds

    def step(self, output: SchedulerOutput) -> OffloadIO:
        meta = output.kv_connector_metadata
        if not isinstance(meta, ContinuumOffloadMetadata) or meta.is_empty():
            return OffloadIO(0, 0, None)
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
        return OffloadIO(
            loaded_blocks * self.block_size,
            stored_blocks * self.block_size,
            KVConnectorOutput(finished_sending=finished or None, kv_connector_stats=stats),
        )
