"""Typed stats channel of ``ContinuumOffloadConnector``.

vLLM moves connector stats from the worker (``get_kv_connector_stats`` of the
worker-side connector, in ``KVConnectorOutput``) and from the scheduler
(``get_kv_connector_stats`` of the scheduler-side connector) into
``SchedulerStats.kv_connector_stats`` as ``stats.data`` (a plain dict), and
rebuilds them in the API process with ``build_kv_connector_stats(data)``, where
``build_prom_metrics`` exports them on ``/metrics``.

The payload only holds str keys and numbers / lists of numbers, so it
survives msgpack/pickle IPC unchanged::

    {"counters": {name: number}, "gauges": {name: number},
     "hists": {name: [seconds, ...]}}

Counters are summed when aggregating (across steps and across workers),
histogram samples are concatenated, gauges keep the latest value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)

__all__ = [
    "COUNTERS",
    "GAUGES",
    "HISTOGRAMS",
    "ContinuumOffloadPromMetrics",
    "ContinuumOffloadStats",
]

_PREFIX = "vllm_continuum:kv_offload_"

# name -> (help text); the Prometheus name is _PREFIX + name (+ "_total").
COUNTERS: dict[str, str] = {
    "stored_bytes": "Bytes copied from the KV cache into the CPU store (summed over workers).",
    "stored_blocks": "KV blocks copied into the CPU store (summed over workers).",
    "loaded_bytes": "Bytes copied from the CPU store back into the KV cache (summed over workers).",
    "loaded_blocks": "KV blocks reloaded from the CPU store (summed over workers).",
    "load_failed_blocks": "Promised blocks missing on a worker at load time (recomputed instead).",
    "evicted_bytes": "Bytes evicted from the CPU store to stay within its budget (per worker).",
    "evicted_blocks": "Blocks evicted from the CPU store to stay within its budget.",
    "load_hit_tokens": "Prompt tokens served by reloading from the CPU store instead of recomputing.",
    "dropped_store_blocks": "Blocks not stored because the store had no unpinned room.",
    "victim_blocks": "Blocks the GPU prefix cache evicted, queued for storing (store_mode victim).",
    "skipped_dead_blocks": "GPU evictions not stored because their job had ended (store_mode victim).",
}
GAUGES: dict[str, str] = {
    "store_used_bytes": "Bytes held by the CPU store (per worker).",
    "store_blocks": "Blocks held by the CPU store.",
    "store_capacity_bytes": "Byte budget of the CPU store (per worker).",
    "store_held_bytes": (
        "Bytes of the CPU store held for agent jobs whose next turn is expected "
        "(evicted only after every unheld entry)."
    ),
}
HISTOGRAMS: dict[str, str] = {
    "load_seconds": "Time of one step's reload from the CPU store (per worker).",
    "store_seconds": "Time of one step's copy into the CPU store (per worker).",
}
_SECONDS_BUCKETS = [
    1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
]


def _empty() -> dict[str, Any]:
    return {"counters": {}, "gauges": {}, "hists": {}}


@dataclass
class ContinuumOffloadStats(KVConnectorStats):
    """Stats of the Continuum CPU offload connector (see module doc)."""

    def __post_init__(self) -> None:
        if not isinstance(self.data, dict) or "counters" not in self.data:
            data = self.data if isinstance(self.data, dict) else {}
            self.data = _empty()
            # Accept a flat dict of counters (tests, older payloads).
            for key, value in data.items():
                if key in COUNTERS:
                    self.data["counters"][key] = value
                elif key in GAUGES:
                    self.data["gauges"][key] = value
                elif key in HISTOGRAMS:
                    self.data["hists"][key] = list(value)
        # Own copies: vLLM hands the same dict to several stat loggers, and
        # aggregate() mutates in place.
        self.data = {
            "counters": dict(self.data.get("counters") or {}),
            "gauges": dict(self.data.get("gauges") or {}),
            "hists": {k: list(v) for k, v in (self.data.get("hists") or {}).items()},
        }

    # --- recording -----------------------------------------------------
    def inc(self, name: str, value: int | float = 1) -> None:
        if value:
            counters = self.data["counters"]
            counters[name] = counters.get(name, 0) + value

    def set_gauge(self, name: str, value: int | float) -> None:
        self.data["gauges"][name] = value

    def observe(self, name: str, seconds: float) -> None:
        self.data["hists"].setdefault(name, []).append(float(seconds))

    def counter(self, name: str) -> int | float:
        return self.data["counters"].get(name, 0)

    def samples(self, name: str) -> list[float]:
        return self.data["hists"].get(name, [])

    # --- KVConnectorStats API -----------------------------------------
    def reset(self) -> None:
        self.data = _empty()

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        if other is None or other.is_empty():
            return self
        if not isinstance(other, ContinuumOffloadStats):
            other = ContinuumOffloadStats(data=dict(other.data))
        for name, value in other.data["counters"].items():
            self.inc(name, value)
        self.data["gauges"].update(other.data["gauges"])
        for name, values in other.data["hists"].items():
            self.data["hists"].setdefault(name, []).extend(values)
        return self

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {}
        counters = self.data["counters"]
        for name in COUNTERS:
            if counters.get(name):
                out[name] = counters[name]
        for name, values in self.data["hists"].items():
            if values:
                out[f"{name}_avg_ms"] = round(1000.0 * sum(values) / len(values), 3)
        gauges = self.data["gauges"]
        if "store_used_bytes" in gauges:
            cap = gauges.get("store_capacity_bytes") or 0
            out["store_used_MiB"] = round(gauges["store_used_bytes"] / 2**20, 2)
            if cap:
                out["store_used_pct"] = round(100.0 * gauges["store_used_bytes"] / cap, 1)
        return out

    def is_empty(self) -> bool:
        d = self.data
        return not (
            any(d["counters"].values()) or d["gauges"] or any(d["hists"].values())
        )


class ContinuumOffloadPromMetrics(KVConnectorPromMetrics):
    """Prometheus metrics (``vllm_continuum:kv_offload_*``) on vLLM's own
    ``/metrics``, labelled like vLLM's per-engine metrics."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters = {
            name: self._counter_cls(
                name=f"{_PREFIX}{name}", documentation=doc, labelnames=labelnames
            )
            for name, doc in COUNTERS.items()
        }
        self._gauges = {
            name: self._gauge_cls(
                name=f"{_PREFIX}{name}",
                documentation=doc,
                labelnames=labelnames,
                multiprocess_mode="mostrecent",
            )
            for name, doc in GAUGES.items()
        }
        self._hists = {
            name: self._histogram_cls(
                name=f"{_PREFIX}{name}",
                documentation=doc,
                labelnames=labelnames,
                buckets=_SECONDS_BUCKETS,
            )
            for name, doc in HISTOGRAMS.items()
        }
        self._children: dict[tuple[str, int], Any] = {}

    def _child(self, metric: Any, name: str, engine_idx: int) -> Any:
        key = (name, engine_idx)
        child = self._children.get(key)
        if child is None:
            child = metric.labels(*self.per_engine_labelvalues[engine_idx])
            self._children[key] = child
        return child

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        stats = ContinuumOffloadStats(data=dict(transfer_stats_data))
        for name, value in stats.data["counters"].items():
            metric = self._counters.get(name)
            if metric is not None and value:
                self._child(metric, name, engine_idx).inc(value)
        for name, value in stats.data["gauges"].items():
            metric = self._gauges.get(name)
            if metric is not None:
                self._child(metric, name, engine_idx).set(value)
        for name, values in stats.data["hists"].items():
            metric = self._hists.get(name)
            if metric is not None:
                child = self._child(metric, name, engine_idx)
                for v in values:
                    child.observe(v)
