"""Plugin metrics, exported on the API server's own ``/metrics``.

The scheduler lives in the EngineCore process, ``/metrics`` in the API server
process, and only vLLM's fixed ``SchedulerStats`` fields cross between them.
So the engine side (``EngineMetrics``) keeps plain counters and histograms and
writes a JSON snapshot (atomic rename) to a directory that ``register()``
creates in the first process and hands to its children through the private
``_CONTINUUM_PLUGIN_METRICS_DIR`` variable; the API side
(``SnapshotCollector``, registered on prometheus_client's default registry)
reads the snapshots at scrape time. No user flag or environment variable is
needed, and vLLM's own metrics are untouched.

Snapshots are written by a daemon thread at most every ``flush_interval_s``
(and on shutdown), so the scheduler's step never does file I/O.
"""

from __future__ import annotations

import bisect
import json
import os
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

__all__ = [
    "METRICS_DIR_ENV",
    "EngineMetrics",
    "Histogram",
    "SnapshotCollector",
    "RELEASE_REASONS",
    "RETENTION_OUTCOMES",
    "count_refused_directives",
    "refused_directives",
]

METRICS_DIR_ENV = "_CONTINUUM_PLUGIN_METRICS_DIR"
PREFIX = "vllm_continuum:"
# "pressure": an allocation fell short; "cap": an older job's new pin needed
# room under max_pinned_fraction.
RELEASE_REASONS = (
    "handoff", "ttl", "pressure", "cap", "last_step", "finish_action", "abort", "reset", "shutdown",
)
# How a job's last turn was known: the client's is_last_step flag, a finish
# action in its reply (mini-swe-agent's echo, `submit`, a `finish` or
# `final_answer` tool), or a final answer: a reply without a tool call in an
# implicit job, or in an explicit job that called tools and sent no flag.
JOB_END_REASONS = ("last_step", "finish_action", "final_answer")
# Implicit jobs: "started" (an untagged turn that called a tool, an answer
# where the scope's answers come back, or a request that continued an
# answer), "continued" (an untagged request recognised as a job's next turn).
IMPLICIT_EVENTS = ("started", "continued")
# Declared retention: requests whose directives reached the scheduler
# ("accepted"), declared holds that lasted or were taken over by their job
# ("honoured") or that memory took first ("overridden").
RETENTION_OUTCOMES = ("accepted", "honoured", "overridden")
# What became of prefetches (prefetch.Prefetcher).
PREFETCH_OUTCOMES = ("started", "loaded", "failed", "dropped")
TTL_BUCKETS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
TOOL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ERROR_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    """Cumulative-at-export histogram with fixed upper bounds."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # last = +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def to_json(self) -> dict[str, Any]:
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.sum, "count": self.count}


class EngineMetrics:
    """Counters of one scheduler; thread-safe snapshotting."""

    def __init__(self, policy: str, engine_index: int = 0, flush_interval_s: float = 0.1) -> None:
        self.policy = policy
        self.engine_index = engine_index
        self._lock = threading.Lock()
        self.pins_created = 0
        self.pins_released = dict.fromkeys(RELEASE_REASONS, 0)
        self.pin_hit_tokens = 0
        # Tail blocks of new pins that did not fit under the cap (freed).
        self.pin_blocks_trimmed = 0
        self.pinned_blocks = 0
        self.pinned_jobs = 0
        self.ttl_seconds = Histogram(TTL_BUCKETS)
        self.tool_seconds = Histogram(TOOL_BUCKETS)
        # ContextServe: decisions by (class, layer), |predicted - measured|
        # tool time, and what became of FAST pins.
        self.decisions: dict[str, int] = {}
        self.prediction_error_seconds = Histogram(ERROR_BUCKETS)
        self.fast_pins: dict[str, int] = {"in_time": 0, "expired": 0, "other": 0}
        self.jobs_ended = dict.fromkeys(JOB_END_REASONS, 0)
        self.implicit_turns = dict.fromkeys(IMPLICIT_EVENTS, 0)
        # New jobs' first turns the admission gate holds back now.
        self.admission_held = 0
        # Requests that named a session whose conversations were all busy
        # without continuing one (served as stock, see conversations).
        self.context_mismatches = 0
        # Conversations started under a session id that already had one
        # (sub-agents, side requests, branches, another client's requests).
        self.conversations_started = 0
        # Steps whose long prefills were cut so that a job's next turn ran
        # in them (prefill_chunks).
        self.prefill_cuts = 0
        self.turn_room_preemptions = 0
        # Requests passed over at the head of the waiting queue (backfill; a
        # request passed over in k steps counts k).
        self.backfill_passes = 0
        # Host-tier blocks of ended jobs ranked first for eviction
        # (host_tier_order, under vLLM's native offloading).
        self.tier_evicted_first_blocks = 0
        # Prefetches from a foreign host tier by outcome (prefetch).
        self.prefetches = dict.fromkeys(PREFETCH_OUTCOMES, 0)
        self.retention = dict.fromkeys(RETENTION_OUTCOMES, 0)
        # Blocks that directives' low priorities sent to the front of the
        # free queue.
        self.retention_evicted_first_blocks = 0
        self._dirty = True
        self._path: str | None = None
        directory = os.environ.get(METRICS_DIR_ENV)
        if directory and os.path.isdir(directory):
            self._path = os.path.join(directory, f"engine-{engine_index}-{os.getpid()}.json")
        self._stop = threading.Event()
        self._flush_interval_s = flush_interval_s
        self._thread: threading.Thread | None = None
        if self._path is not None:
            self._thread = threading.Thread(
                target=self._flush_loop, name="continuum-metrics", daemon=True
            )
            self._thread.start()

    # -- updates (scheduler thread) ---------------------------------------
    def on_pin(self, ttl_s: float, num_blocks: int, pinned_blocks: int, pinned_jobs: int) -> None:
        with self._lock:
            self.pins_created += 1
            self.ttl_seconds.observe(ttl_s)
            self.pinned_blocks = pinned_blocks
            self.pinned_jobs = pinned_jobs
            self._dirty = True

    def on_blocks_trimmed(self, num_blocks: int) -> None:
        if num_blocks:
            with self._lock:
                self.pin_blocks_trimmed += num_blocks
                self._dirty = True

    def on_ttl_decision(self, ttl_s: float) -> None:
        """A TTL of 0 (no pin) is still a decision worth seeing."""
        with self._lock:
            self.ttl_seconds.observe(ttl_s)
            self._dirty = True

    def on_decision(self, speed: str | None, layer: str | None) -> None:
        if speed is None:
            return  # Continuum: the TTL histogram tells the story
        with self._lock:
            key = f"{speed}/{layer}"
            self.decisions[key] = self.decisions.get(key, 0) + 1
            self._dirty = True

    def on_release(
        self, reason: str, hit_tokens: int, pinned_blocks: int, pinned_jobs: int, speed: str | None = None
    ) -> None:
        with self._lock:
            if speed == "fast":
                outcome = "in_time" if reason == "handoff" else "expired" if reason == "ttl" else "other"
                self.fast_pins[outcome] += 1
            self.pins_released[reason] += 1
            self.pin_hit_tokens += hit_tokens
            self.pinned_blocks = pinned_blocks
            self.pinned_jobs = pinned_jobs
            self._dirty = True

    def on_job_end(self, reason: str) -> None:
        with self._lock:
            self.jobs_ended[reason] += 1
            self._dirty = True

    def on_admission(self, held: int) -> None:
        if held != self.admission_held:
            with self._lock:
                self.admission_held = held
                self._dirty = True

    def on_implicit_turn(self, event: str) -> None:
        with self._lock:
            self.implicit_turns[event] += 1
            self._dirty = True

    def on_context_mismatch(self) -> None:
        with self._lock:
            self.context_mismatches += 1
            self._dirty = True

    def on_prefill_cut(self) -> None:
        with self._lock:
            self.prefill_cuts += 1
            self._dirty = True

    def on_turn_room_preemptions(self, count: int) -> None:
        with self._lock:
            self.turn_room_preemptions += count
            self._dirty = True

    def on_backfill(self, count: int) -> None:
        with self._lock:
            self.backfill_passes += count
            self._dirty = True

    def on_tier_evicted_first(self, count: int) -> None:
        with self._lock:
            self.tier_evicted_first_blocks += count
            self._dirty = True

    def on_prefetch(self, outcome: str, count: int) -> None:
        with self._lock:
            self.prefetches[outcome] = self.prefetches.get(outcome, 0) + count
            self._dirty = True

    def on_new_conversation(self) -> None:
        with self._lock:
            self.conversations_started += 1
            self._dirty = True

    def on_directives(self, evicted_first: int = 0) -> None:
        """A finished request carried retention directives (``evicted_first``
        of its blocks were sent to the front of the free queue)."""
        with self._lock:
            self.retention["accepted"] += 1
            self.retention_evicted_first_blocks += evicted_first
            self._dirty = True

    def on_declared_release(self, honoured: bool) -> None:
        with self._lock:
            self.retention["honoured" if honoured else "overridden"] += 1
            self._dirty = True

    def on_tool_time(self, seconds: float, predicted_s: float | None = None) -> None:
        with self._lock:
            self.tool_seconds.observe(seconds)
            if predicted_s is not None:
                self.prediction_error_seconds.observe(abs(predicted_s - seconds))
            self._dirty = True

    # -- export -----------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            self._dirty = False
            return {
                "policy": self.policy,
                "engine": str(self.engine_index),
                "pins_created": self.pins_created,
                "pins_released": dict(self.pins_released),
                "pin_hit_tokens": self.pin_hit_tokens,
                "pin_blocks_trimmed": self.pin_blocks_trimmed,
                "pinned_blocks": self.pinned_blocks,
                "pinned_jobs": self.pinned_jobs,
                "ttl_seconds": self.ttl_seconds.to_json(),
                "tool_seconds": self.tool_seconds.to_json(),
                "decisions": dict(self.decisions),
                "prediction_error_seconds": self.prediction_error_seconds.to_json(),
                "fast_pins": dict(self.fast_pins),
                "jobs_ended": dict(self.jobs_ended),
                "implicit_turns": dict(self.implicit_turns),
                "admission_held": self.admission_held,
                "context_mismatches": self.context_mismatches,
                "conversations_started": self.conversations_started,
                "prefill_cuts": self.prefill_cuts,
                "turn_room_preemptions": self.turn_room_preemptions,
                "backfill_passes": self.backfill_passes,
                "tier_evicted_first_blocks": self.tier_evicted_first_blocks,
                "prefetches": dict(self.prefetches),
                "retention": dict(self.retention),
                "retention_evicted_first_blocks": self.retention_evicted_first_blocks,
            }

    def flush(self) -> None:
        if self._path is None:
            return
        data = json.dumps(self.snapshot())
        directory = os.path.dirname(self._path)
        try:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                f.write(data)
            os.replace(tmp, self._path)
        except OSError:
            pass  # directory removed at server shutdown: nothing to report to

    def _flush_loop(self) -> None:
        while not self._stop.wait(self._flush_interval_s):
            if self._dirty:
                self.flush()

    def close(self) -> None:
        self._stop.set()
        if self._path is not None:
            try:  # a stopped engine has nothing to report
                os.remove(self._path)
            except OSError:
                pass


def _pid_of(name: str) -> int | None:
    try:
        return int(name.rsplit("-", 1)[1].split(".", 1)[0])
    except (IndexError, ValueError):
        return None


def _parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            # "pid (comm) state ppid ..."; comm may contain spaces.
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _belongs_to_this_server(pid: int) -> bool:
    """Whether an engine's snapshot is this server's to export.

    Accepted: an engine in this very process (in-process engines), a live
    descendant of this process (``vllm serve``: API server -> EngineCore),
    or a live sibling (several API servers: launcher -> API servers +
    EngineCore). Snapshots of dead engines, or of other servers that
    inherited the same directory from a common parent, are ignored.
    """
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if not os.path.isdir("/proc"):
        return True  # no process tree to check: liveness only
    parent = _parent_pid(pid)
    if parent == os.getppid():
        return True
    for _ in range(8):
        if parent is None or parent <= 1:
            return False
        if parent == os.getpid():
            return True
        parent = _parent_pid(parent)
    return False


# Requests this (API server) process refused for malformed retention
# directives; exported by its collector.
_refused_directives = 0
_refused_lock = threading.Lock()


def count_refused_directives() -> None:
    global _refused_directives
    with _refused_lock:
        _refused_directives += 1


def refused_directives() -> int:
    return _refused_directives


class SnapshotCollector:
    """prometheus_client collector reading the engines' snapshots."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def _snapshots(self) -> Iterator[dict[str, Any]]:
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return
        for name in names:
            if not name.startswith("engine-") or not name.endswith(".json"):
                continue
            pid = _pid_of(name)
            if pid is None or not _belongs_to_this_server(pid):
                continue
            try:
                with open(os.path.join(self.directory, name)) as f:
                    yield json.load(f)
            except (OSError, ValueError):
                continue

    def describe(self) -> Iterable[Any]:
        return []  # no fixed set of samples before the engine writes

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        labels = ["engine", "policy"]
        pinned = GaugeMetricFamily(
            PREFIX + "pinned_blocks", "Distinct KV blocks currently held by pins (a shared prefix counts once).",
            labels=labels,
        )
        jobs = GaugeMetricFamily(PREFIX + "pinned_jobs", "Jobs currently holding a pin.", labels=labels)
        created = CounterMetricFamily(PREFIX + "pins_created", "Pins created.", labels=labels)
        released = CounterMetricFamily(
            PREFIX + "pins_released", "Pins released, by reason.", labels=labels + ["reason"]
        )
        hits = CounterMetricFamily(
            PREFIX + "pin_hit_tokens", "Prompt tokens of next turns served from pinned blocks.", labels=labels
        )
        trimmed = CounterMetricFamily(
            PREFIX + "pin_blocks_trimmed", "Tail blocks of new pins freed because they did not fit under the pin cap.",
            labels=labels,
        )
        ttl = HistogramMetricFamily(PREFIX + "ttl_seconds", "TTL chosen per finished non-final turn (0 = no pin).", labels=labels)
        tool = HistogramMetricFamily(
            PREFIX + "tool_seconds", "Measured tool time (next turn arrival - previous turn finish).", labels=labels
        )
        decisions = CounterMetricFamily(
            PREFIX + "decisions", "ContextServe decisions by class and deciding layer.",
            labels=labels + ["speed", "layer"],
        )
        error = HistogramMetricFamily(
            PREFIX + "prediction_error_seconds",
            "ContextServe |predicted - measured| tool time.", labels=labels,
        )
        fast = CounterMetricFamily(
            PREFIX + "fast_pins", "ContextServe FAST pins by outcome (in_time: the next turn took them over).",
            labels=labels + ["outcome"],
        )
        ended = CounterMetricFamily(
            PREFIX + "jobs_ended", "Jobs whose last turn finished, by how it was known.",
            labels=labels + ["reason"],
        )
        implicit = CounterMetricFamily(
            PREFIX + "implicit_turns", "Untagged agent turns: implicit jobs started and continued.",
            labels=labels + ["event"],
        )
        held = GaugeMetricFamily(
            PREFIX + "admission_held_requests",
            "New jobs' first turns the admission gate holds back while the jobs under way fill the KV pool.",
            labels=labels,
        )
        mismatches = CounterMetricFamily(
            PREFIX + "context_mismatches",
            "Requests that named a session none of whose conversations they continue, while all of them were "
            "busy (served as stock, the session untouched).",
            labels=labels,
        )
        conversations = CounterMetricFamily(
            PREFIX + "session_conversations",
            "Conversations started under a session id that already had one (sub-agents, side requests, branches).",
            labels=labels,
        )
        cuts = CounterMetricFamily(
            PREFIX + "prefill_cuts",
            "Steps whose long prefills were cut to a share of the token budget so that a job's next turn, "
            "waiting, ran in them.",
            labels=labels,
        )
        room = CounterMetricFamily(
            PREFIX + "turn_room_preemptions",
            "Decodes preempted so that a job's next turn, waiting for GPU room with its context in a host "
            "tier, ran (the tier reloads them when they resume).",
            labels=labels,
        )
        backfill = CounterMetricFamily(
            PREFIX + "backfill_passes",
            "Requests that could not be allocated at the head of the waiting queue and were passed over in a "
            "step so that requests behind them that fit ran (a request passed over in k steps counts k).",
            labels=labels,
        )
        tier_first = CounterMetricFamily(
            PREFIX + "tier_evicted_first_blocks",
            "Host-tier blocks of ended jobs ranked first for eviction under vLLM's native offloading "
            "(tier_finished_first).",
            labels=labels,
        )
        prefetches = CounterMetricFamily(
            PREFIX + "prefetches",
            "Prefetches of jobs' contexts from a foreign host tier before their tools return, by outcome: "
            "started (a load began), loaded (its blocks were pinned for the job), failed (the load failed), "
            "dropped (aborted in flight: the job ended or the engine reset).",
            labels=labels + ["outcome"],
        )
        retention = CounterMetricFamily(
            PREFIX + "retention_directives",
            "Requests with retention directives by outcome: accepted (reached the scheduler), honoured (a "
            "declared hold lasted or its job took it over), overridden (memory took it first); refused "
            "(HTTP 400, counted by the API server that refused it, engine label 'api').",
            labels=labels + ["outcome"],
        )
        evicted_first = CounterMetricFamily(
            PREFIX + "retention_evicted_first_blocks",
            "KV blocks that directives' low priorities sent to the front of the free queue.", labels=labels,
        )
        refused = refused_directives()
        if refused:
            retention.add_metric(["api", "", "refused"], refused)
        for snap in self._snapshots():
            values = [snap.get("engine", "0"), snap.get("policy", "")]
            for outcome, count in snap.get("retention", {}).items():
                retention.add_metric(values + [outcome], count)
            evicted_first.add_metric(values, snap.get("retention_evicted_first_blocks", 0))
            mismatches.add_metric(values, snap.get("context_mismatches", 0))
            conversations.add_metric(values, snap.get("conversations_started", 0))
            cuts.add_metric(values, snap.get("prefill_cuts", 0))
            room.add_metric(values, snap.get("turn_room_preemptions", 0))
            backfill.add_metric(values, snap.get("backfill_passes", 0))
            tier_first.add_metric(values, snap.get("tier_evicted_first_blocks", 0))
            for outcome, count in snap.get("prefetches", {}).items():
                prefetches.add_metric(values + [outcome], count)
            held.add_metric(values, snap.get("admission_held", 0))
            pinned.add_metric(values, snap["pinned_blocks"])
            jobs.add_metric(values, snap["pinned_jobs"])
            created.add_metric(values, snap["pins_created"])
            for reason, count in snap["pins_released"].items():
                released.add_metric(values + [reason], count)
            hits.add_metric(values, snap["pin_hit_tokens"])
            trimmed.add_metric(values, snap.get("pin_blocks_trimmed", 0))
            for key, count in snap.get("decisions", {}).items():
                speed, _, layer = key.partition("/")
                decisions.add_metric(values + [speed, layer], count)
            for outcome, count in snap.get("fast_pins", {}).items():
                fast.add_metric(values + [outcome], count)
            for reason, count in snap.get("jobs_ended", {}).items():
                ended.add_metric(values + [reason], count)
            for event, count in snap.get("implicit_turns", {}).items():
                implicit.add_metric(values + [event], count)
            histograms = [(ttl, "ttl_seconds"), (tool, "tool_seconds")]
            if snap.get("policy") == "context_serve":
                histograms.append((error, "prediction_error_seconds"))
            for family, key in histograms:
                h = snap[key]
                cumulative, buckets = 0, []
                for bound, count in zip(list(h["bounds"]) + [float("inf")], h["counts"]):
                    cumulative += count
                    buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
                family.add_metric(values, buckets, h["sum"])
        return [
            pinned, jobs, created, released, hits, trimmed, ttl, tool, decisions, error, fast, ended, implicit, held,
            mismatches,
            conversations,
            cuts,
            room,
            backfill,
            tier_first,
            prefetches,
            retention,
            evicted_first,
        ]
