"""Soft pins: memory pressure releases pins before vLLM preempts or blocks.

vLLM's scheduler calls ``kv_cache_manager.allocate_slots`` for every request
it schedules; ``None`` means "no room", and vLLM then preempts
``running[-1]`` (a running request) or stops admitting (a waiting one).
:class:`SoftPins` routes those calls through a wrapper that, when an
allocation fails and pins are held, releases pins (latest-ranked job first,
reason ``pressure``) and retries:

* a running request, or any request while nothing runs (a blocked admission
  would idle the engine), may take any pin;
* a waiting request only takes pins of jobs ranked after its own (job-level
  FCFS applied to memory: a new job does not evict the context of an older
  job in a tool gap) -- unless a dropped pin is cheap to rebuild
  (``pins_are_cheap``: a second KV tier holds it and its measured reload
  beats a prefill), when holding an older job's context must not keep a
  newer request out of the engine.

The wrapper costs a Python call per scheduled request, so :meth:`arm` installs
it (an instance attribute over the manager's method) only in steps where an
allocation could fail: pins are held and the free blocks are fewer than the
step can take -- its token budget, every scheduled request's next blocks, and
a whole ``max_model_len`` of prefix hits per possible admission. With a KV
connector or an encoder-decoder model (allocations that bound does not
cover) it stays installed.

Invariant: while armed, ``kv_cache_manager.allocate_slots`` is the wrapper;
otherwise the manager's own method.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm.v1.request import Request, RequestStatus

from .job_order import JobOrder
from .request_record import request_meta
from .pin_manager import PinManager

__all__ = ["SoftPins"]


class SoftPins:
    """The soft-pin wrapper over one scheduler's KV cache manager."""

    def __init__(
        self,
        scheduler: Any,
        pins: PinManager,
        order: JobOrder,
        pins_are_cheap: Callable[[], bool] = lambda: False,
    ) -> None:
        self._scheduler = scheduler
        self._pins = pins
        manager = scheduler.kv_cache_manager
        self._manager = manager
        original: Callable[..., Any] = manager.allocate_slots

        def allocate_slots(request: Request, *args: Any, **kwargs: Any) -> Any:
            blocks = original(request, *args, **kwargs)
            if blocks is not None or not pins:
                return blocks
            return pins.release_for(
                own_job=request_meta(request).job_id,
                own_arrival=order.ranked_arrival(request),
                any_pin=request.status == RequestStatus.RUNNING or not scheduler.running or pins_are_cheap(),
                retry=lambda: original(request, *args, **kwargs),
            )

        self._wrapper = allocate_slots
        self.armed = False
        groups = len(manager.coordinator.single_type_managers)
        bs = scheduler.block_size
        lookahead = getattr(scheduler, "num_lookahead_tokens", 0) or 0
        config = scheduler.scheduler_config
        self._max_num_seqs = config.max_num_seqs
        # Blocks one step can take from the free queue at most, besides the
        # prefix hits of admissions.
        self._step_blocks = groups * (-(-config.max_num_batched_tokens // bs) + self._max_num_seqs * (2 + -(-lookahead // bs)))
        self._admission_blocks = groups * (-(-scheduler.vllm_config.model_config.max_model_len // bs) + 1)
        self._always = scheduler.connector is not None or bool(getattr(scheduler, "is_encoder_decoder", False))

    def arm(self) -> None:
        """Install or remove the wrapper for the coming step (see module doc)."""
        armed = bool(self._pins)
        if armed and not self._always:
            s = self._scheduler
            waiting = len(s.waiting) + len(s.kv_holding_waiting)
            admissions = min(waiting, max(0, self._max_num_seqs - len(s.running)))
            need = self._step_blocks + admissions * self._admission_blocks
            armed = self._manager.block_pool.get_num_free_blocks() < need
        if armed != self.armed:
            if armed:
                self._manager.allocate_slots = self._wrapper
            else:
                del self._manager.allocate_slots  # the class's own method again
            self.armed = armed
