"""The offload connector's scheduler side: the store's index (the same LRU
decisions as the workers' stores, by byte size), planning loads and stores
per step, and the job holds the Continuum scheduler asks for (see
``kv_offload`` for the whole design)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput

from vllm_continuum_plugin.clock import SYSTEM_CLOCK, Clock
from .cpu_store import CPUStore
from .offload_metadata import (
    ContinuumOffloadMetadata,
    ContinuumOffloadWorkerMeta,
    LoadJob,
    _block_bytes_estimate,
    _block_key,
)
from .eviction_tap import EvictionTap
from .offload_metrics import ContinuumOffloadStats
from .offload_settings import (
    _EWMA_ALPHA,
    LOAD_COST_BLOCKS,
    LOAD_COST_SECONDS,
    STORE_COST_BLOCKS,
    STORE_COST_SECONDS,
    SideSpec,
)

try:
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
except ImportError:  # pragma: no cover
    CacheHitSource = None  # type: ignore[assignment]


logger = logging.getLogger("vllm.continuum_plugin.kv_offload")

__all__ = ["_SchedulerSide"]

# ----------------------------------------------------------------------
# Scheduler side
# ----------------------------------------------------------------------
class _SchedulerSide:
    def __init__(
        self,
        spec: SideSpec,
        vllm_config: Any,
        kv_cache_config: Any,
        kv_cache_manager: Callable[[], Any] = lambda: None,
    ) -> None:
        self.spec = spec
        # vLLM binds the scheduler's KV cache manager to the connector after
        # both exist (``bind_kv_cache_manager``): asked for when needed.
        self._kv_cache_manager = kv_cache_manager
        self.settings = spec.settings
        self.mode = spec.settings.store_mode
        self.block_size = spec.block_size
        hash_block_size = getattr(kv_cache_config, "hash_block_size", None) or self.block_size
        if self.block_size % hash_block_size:
            raise ValueError(
                f"ContinuumOffloadConnector: block size {self.block_size} is not a multiple of "
                f"the hash block size {hash_block_size}"
            )
        self.hash_ratio = self.block_size // hash_block_size
        self.block_bytes = _block_bytes_estimate(kv_cache_config) if kv_cache_config else 1
        # Hold deadlines are read from ``clock``: the system clock in a
        # server; the scheduler's own (``set_clock``) under Continuum, so a
        # simulation's virtual time decides when holds lapse.
        self.clock: Clock = SYSTEM_CLOCK
        self.index = CPUStore(spec.capacity_bytes, clock=self._now)
        if spec.capacity_bytes < self.block_bytes:
            logger.warning(
                "ContinuumOffloadConnector: cpu_bytes per worker (%d) is below one block (%d "
                "bytes); nothing will be stored",
                spec.capacity_bytes,
                self.block_bytes,
            )
        self.block_pool: Any = None
        # ``victim`` mode: the GPU prefix cache's evictions (``bind_block_pool``)
        # and the blocks of ended jobs, which are not worth a copy
        # (block id -> key; an entry goes when its block is evicted).
        self.eviction_tap: EvictionTap | None = None
        self.dead_blocks: dict[int, bytes] = {}
        # Holds of blocks handed over while the GPU still has them (key ->
        # deadline): applied when the tap stores the block.
        self.deferred_holds: dict[bytes, float] = {}
        self.requests: dict[str, Any] = {}
        self.stored_upto: dict[str, int] = {}
        self.last_match: dict[str, tuple[int, int]] = {}
        self.pending_loads: list[LoadJob] = []
        self.pinned_for_load: list[bytes] = []
        # Blocks to copy out before this step's forward pass (key -> block
        # id). They are copied before this step's loads too (the worker's
        # ``before_forward`` precedes ``load``), so a lookup in the same step
        # may load them: in ``victim`` mode a request waiting for room would
        # otherwise miss the block the step just evicted from its own
        # context and recompute everything behind it.
        self.pending_pre_stores: dict[bytes, int] = {}
        self.pending_final_stores: list[tuple[bytes, int]] = []
        self.pending_finished: list[str] = []
        self.clear_pending = False
        # Holds: job -> (deadline, its keys); keys handed over but not yet
        # in the index get their hold when admitted (build_connector_meta).
        self.hold_seconds = spec.settings.hold_seconds
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

    def _now(self) -> float:
        return self.clock.monotonic()

    def bind_block_pool(self, block_pool: Any) -> None:
        """The scheduler's GPU block pool; in ``victim`` mode its evictions
        are stored from now on (``_on_gpu_eviction``)."""
        self.block_pool = block_pool
        if self.mode == "victim" and self.spec.enabled and self.eviction_tap is None:
            self.eviction_tap = EvictionTap(block_pool, self._on_gpu_eviction)

    def _on_gpu_eviction(self, block: Any) -> None:
        """``victim`` mode: a cached block is about to be overwritten. Queue it
        as a pre-store (copied before this step's forward pass writes it)
        unless the store has it or it belonged to an ended job."""
        key = _block_key(block.block_hash)
        if self.dead_blocks.pop(block.block_id, None) == key:
            self.stats.inc("skipped_dead_blocks")
            return
        until = self.deferred_holds.pop(key, None)
        if until is not None and until > self._now():
            self.pending_holds[key] = until
        if key in self.index:
            # Stored before (a reloaded context): the copy is now the only
            # one, so it becomes the store's most recently used, like a fresh
            # victim. Untouched, it would keep the age of its last load and
            # the store's LRU would drop it before the context's newer tail
            # (evicted and stored after it): a hole that wastes every block
            # behind it, since a load matches a prefix only. The GPU evicts
            # a freed context tail first, so touching in eviction order
            # leaves the head most recent.
            self.index.touch(key)
            return
        self.stats.inc("victim_blocks")
        self.pending_pre_stores[key] = block.block_id

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
        if not self.spec.enabled or num_computed_tokens % self.block_size:
            return 0
        keys = self.keys_of(request)
        start = num_computed_tokens // self.block_size
        # Never the whole prompt: vLLM must compute at least one token.
        limit = min(len(keys), (request.num_tokens - 1) // self.block_size)
        n = 0
        index = self.index
        queued = self.pending_pre_stores
        for i in range(start, limit):
            if keys[i] not in index and keys[i] not in queued:
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
        if self.eviction_tap is not None:
            # A victim tier: every full block of a context that was just
            # computed either stays on the GPU or is copied when the GPU
            # evicts it, so a rebuild reloads it -- as much as the store holds.
            room = self.index.capacity_bytes // max(1, self.block_bytes)
            return max(0, min(len(keys) - start, room)) * self.block_size
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

        pre, self.pending_pre_stores = self.pending_pre_stores, {}
        for key, block_id in pre.items():
            self._admit(key, block_id, meta, meta.pre_stores, queued)
        finals, self.pending_final_stores = self.pending_final_stores, []
        for key, block_id in finals:
            self._admit(key, block_id, meta, meta.stores, queued)
        meta.finished_store_reqs, self.pending_finished = self.pending_finished, []
        if self.pending_holds:
            self._apply_pending_holds()

        if self.mode == "eager" and self.spec.enabled:
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
        manager = self._kv_cache_manager()
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
        if not self.spec.enabled or self.mode in ("explicit", "victim"):
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
        if not self.spec.enabled:
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
            until = self.clock.monotonic() + self.hold_seconds
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
            if self.eviction_tap is not None:
                # Victim mode: the GPU still has the block, and the tap
                # stores it when (if) the GPU evicts it; only the hold is
                # remembered until then.
                if hold:
                    self.deferred_holds[key] = until
                continue
            self.pending_pre_stores[key] = block.block_id
            if hold:
                self.pending_holds[key] = until
            n += 1
        return n

    def _hold_room(self, job_held: dict[bytes, None]) -> int:
        """Blocks that may still be held for a job holding ``job_held``:
        within ``max_job_held_fraction`` of the store for the job and
        ``max_held_fraction`` for all jobs (pending holds included)."""
        settings = self.settings
        capacity = self.index.capacity_bytes
        block = max(1, self.block_bytes)
        job_room = int(settings.max_job_held_fraction * capacity) // block - len(job_held)
        total_room = (int(settings.max_held_fraction * capacity) - self.index.held_bytes) // block
        return max(0, min(job_room, total_room - len(self.pending_holds) - len(self.deferred_holds)))

    def save_request(self, request: Any, hold_job: str | None = None) -> int:
        blocks = self._request_blocks(request)
        return self.save_blocks(blocks, hold_job) if blocks else 0

    def _request_blocks(self, request: Any) -> list[Any]:
        manager = self._kv_cache_manager()
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
            self.deferred_holds.pop(key, None)
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
        now = self.clock.monotonic()
        if now < self._next_hold_sweep:
            return
        self._next_hold_sweep = now + 1.0
        for job_id in [j for j, (until, _) in self.job_holds.items() if until <= now]:
            for key in self.job_holds.pop(job_id)[1]:
                self.deferred_holds.pop(key, None)
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
        own = [b for b in self._request_blocks(request) if b.ref_cnt <= 1]
        if self.eviction_tap is not None:
            # Its GPU copies go first out of the prefix cache: not stored.
            for block in own:
                if block.block_hash is not None:
                    self.dead_blocks[block.block_id] = _block_key(block.block_hash)
        return self.demote_blocks(own)

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
        self.deferred_holds.clear()
        self.dead_blocks.clear()
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
