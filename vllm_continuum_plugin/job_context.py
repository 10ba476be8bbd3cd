"""Job state bound to its context: which requests may act on a job.

A job id is a name any client can send (``job_id``, ``X-Session-ID``, a
harness's session header). A request that names a job acts on it -- ends it
(``is_last_step``, a finish action, a final answer), has its arrival measured
as the job's tool time, ranks by the job's first arrival, takes its pin over
-- only if it continues the job's context, the way the pin hand-over already
checks (``PinManager.held_for``). Any other request that names the job is
served as stock: untagged, with a DEBUG line and the ``context_mismatches``
counter.

"Continues the job's context" (:meth:`JobContexts.binds`), in order:

1. the job is unknown, or none of its turns has finished yet: binds (a
   job's first turns have no context to continue; concurrent first turns of
   one job all bind);
2. the job holds a pin and the request continues it: binds;
3. the request continues the prompt of one of the job's last
   ``MAX_ANCHORS`` finished turns: binds. This covers a job that holds no
   pin (it lapsed, was offloaded, the TTL was 0) and overlapping turns of
   several branches (each continues its own previous turn);
4. the job has been idle longer than ``job_idle_reset_s`` with nothing in
   flight: binds (the id starts a new activity period, as
   ``JobTracker.on_arrival`` restarts its order; the old context is stale);
5. nothing to compare with (the remembered prompts were shorter than one
   block, or the job's turns were forgotten): binds, as before this rule.

Otherwise the request does not bind. What a turn's prompt is compared by
is its *anchor*: the index and hash of its prompt's last full block (block
hashes chain, so one equal hash means an equal prefix: O(1) per anchor).

Invariants: at most ``max_jobs`` jobs and ``MAX_ANCHORS`` anchors per job are
remembered (least recently used jobs go first); only a turn that bound and
finished normally without ending its job is remembered; a job that ends is
forgotten. Nothing here imports vLLM.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from .estimators.history import JobState
from .metadata import JobMetadata
from .request_record import request_record

logger = logging.getLogger("vllm.continuum_plugin")

__all__ = ["MAX_ANCHORS", "Anchor", "JobContexts", "anchor_continued", "prompt_anchor"]

# Finished turns remembered per job: overlapping branches of one job (an
# agent's sub-agents under one session id) each continue their own.
MAX_ANCHORS = 4

# (index, hash) of a prompt's last full block.
Anchor = tuple[int, Any]


def prompt_anchor(request: Any, block_size: int) -> Anchor | None:
    """(index, hash) of the last full block of ``request``'s prompt; None
    when the prompt is shorter than one block."""
    index = min(request.num_prompt_tokens // block_size, len(request.block_hashes)) - 1
    return (index, request.block_hashes[index]) if index >= 0 else None


def anchor_continued(anchor: Anchor | None, block_hashes: Sequence[Any]) -> bool:
    """Does a request with these block hashes continue the prompt ``anchor``
    was taken from (None: nothing to compare, so yes)?"""
    if anchor is None:
        return True
    index, block_hash = anchor
    return index < len(block_hashes) and block_hashes[index] == block_hash


class JobContexts:
    """The recent finished turns' anchors of each job (see module doc)."""

    def __init__(
        self, block_size: int, max_jobs: int, idle_reset_s: float, on_mismatch: Callable[[], None] = lambda: None,
    ) -> None:
        if max_jobs < 1:
            raise ValueError(f"max_jobs must be >= 1, got {max_jobs}")
        self._block_size = block_size
        self._max_jobs = max_jobs
        self._idle_reset_s = idle_reset_s
        # Called for each request that names a job without binding (a counter).
        self._on_mismatch = on_mismatch
        # job id -> anchors of its last finished turns, oldest first (None:
        # a prompt shorter than one block).
        self._anchors: OrderedDict[str, list[Anchor | None]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._anchors)

    def bind(self, request: Any, meta: JobMetadata, job: JobState | None, continues_pin: bool | None) -> JobMetadata:
        """``meta`` when ``request`` may act on the job it names (``job``'s
        state; ``continues_pin`` as for :meth:`binds`); else ``meta`` without
        the job: the request is served as stock, its record keeps the name
        (``unbound_job_id``), and the mismatch is counted and logged."""
        job_id = meta.job_id
        assert job_id is not None
        if self.binds(job_id, job, continues_pin, request.block_hashes, request.arrival_time):
            return meta
        request_record(request).unbound_job_id = job_id
        self._on_mismatch()
        logger.debug("continuum: request %s names job %s but does not continue its context; served as stock",
                     request.request_id, job_id)
        return dataclasses.replace(meta, job_id=None)

    def binds(
        self, job_id: str, job: JobState | None, continues_pin: bool | None, block_hashes: Sequence[Any],
        arrival_time: float,
    ) -> bool:
        """May a request arriving at ``arrival_time`` with these block hashes
        act on ``job_id`` (state ``job``; ``continues_pin`` None when the
        job holds no pin)? See the module doc for the rule."""
        if job is None or job.turns_finished == 0 or continues_pin:
            return True
        anchors = self._anchors.get(job_id)
        if not anchors:
            return True
        if any(anchor_continued(anchor, block_hashes) for anchor in anchors):
            self._anchors.move_to_end(job_id)
            return True
        last_finish = job.last_finish_time
        return job.in_flight == 0 and last_finish is not None and arrival_time - last_finish > self._idle_reset_s

    def remember(self, job_id: str, request: Any, first: bool) -> None:
        """A bound turn of ``job_id`` finished normally and its job goes on;
        ``first``: the job's first finished turn (anchors of an earlier job
        under the same id are dropped)."""
        anchor = prompt_anchor(request, self._block_size)
        anchors = self._anchors.get(job_id)
        if anchors is None or first:
            self._anchors[job_id] = [anchor]
        else:
            if anchor in anchors:
                anchors.remove(anchor)
            anchors.append(anchor)
            del anchors[:-MAX_ANCHORS]
        self._anchors.move_to_end(job_id)
        if len(self._anchors) > self._max_jobs:
            self._anchors.popitem(last=False)

    def forget(self, job_id: str) -> None:
        """The job ended: its id is free for a new job."""
        self._anchors.pop(job_id, None)
