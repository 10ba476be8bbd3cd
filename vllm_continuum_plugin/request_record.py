"""What the plugin keeps on one vLLM ``Request``: one typed record.

vLLM's ``Request`` is vLLM's; the plugin adds exactly one attribute to it,
a :class:`RequestRecord`, and reads and writes its own per-request state
only through the accessors here:

* the job metadata the scheduler parsed at ``add_request``
  (:func:`parse_request_metadata`, then :func:`request_meta` /
  :func:`set_request_meta`);
* the job id the client named when the request does not continue that
  job's context (:attr:`RequestRecord.unbound_job_id`: served as stock);
* where the request ranks (``job_order.JobOrder``): its ranked arrival, its
  credit to the pinned-job tier, whether its job had finished turns before
  it (a protected last step), and its cached preemption key.

Invariants: a request has at most one record, created by the first write
and never replaced; reading never creates one (a request the scheduler has
not seen reads as untagged, uncredited, ranked by its own arrival). Nothing
here imports vLLM.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .metadata import UNTAGGED, JobMetadata, MetadataError, parse_metadata

logger = logging.getLogger("vllm.continuum_plugin")

__all__ = [
    "RequestRecord",
    "parse_request_metadata",
    "peek_record",
    "request_meta",
    "request_record",
    "set_request_meta",
]

# The one attribute the plugin sets on a vLLM Request. (The name is the one
# the parsed metadata had before the record gathered the other fields;
# debuggers and tests know it.)
_RECORD_ATTR = "_continuum_meta"


@dataclass(slots=True)
class RequestRecord:
    """The plugin's state of one request (see module doc)."""

    # Parsed job metadata. ``meta.job_id`` is the job the request acts on:
    # None for untagged requests and for requests that name a job whose
    # context they do not continue (``unbound_job_id``).
    meta: JobMetadata = UNTAGGED
    # The job id the client named, when the request does not continue that
    # job's context: it is served as stock and never acts on the job (nor
    # becomes an implicit job). None otherwise.
    unbound_job_id: str | None = None
    # Job order (``JobOrder.credit``): the arrival the request ranks by (None:
    # its own), whether it may use its job's pinned-job tier, and whether its
    # job had finished turns when it arrived (only then does its last-step
    # flag protect it from preemption).
    ranked_arrival: float | None = None
    credit: bool = False
    veteran: bool = False
    # ``JobOrder.running_key``, computed once (its inputs are fixed at arrival).
    run_key: tuple[bool, float, float] | None = None

    @property
    def job_id(self) -> str | None:
        """The job this request acts on (None: served without a job)."""
        return self.meta.job_id


def peek_record(request: Any) -> RequestRecord | None:
    """``request``'s record, or None if nothing was recorded for it yet."""
    return getattr(request, _RECORD_ATTR, None)


def request_record(request: Any) -> RequestRecord:
    """``request``'s record, created (empty) on first use."""
    record = getattr(request, _RECORD_ATTR, None)
    if record is None:
        record = RequestRecord()
        setattr(request, _RECORD_ATTR, record)
    return record


def request_meta(request: Any) -> JobMetadata:
    """The job metadata the scheduler parsed for ``request`` (UNTAGGED when
    none)."""
    record = getattr(request, _RECORD_ATTR, None)
    return UNTAGGED if record is None else record.meta


def set_request_meta(request: Any, meta: JobMetadata) -> None:
    request_record(request).meta = meta


def parse_request_metadata(request: Any) -> JobMetadata:
    """The job metadata ``request`` carries (``SamplingParams.extra_args``,
    vLLM's ``session_id`` and ``kv_hints``; see ``metadata``). Never raises:
    a malformed field makes the request untagged, with a warning."""
    params = request.sampling_params
    extra_args = params.extra_args if params is not None else None
    try:
        return parse_metadata(extra_args, getattr(request, "session_id", None), getattr(request, "kv_hints", None))
    except MetadataError as e:
        # The API server rejects these with HTTP 400; only offline callers
        # reach here. Never fail the engine: serve as an untagged request.
        logger.warning(
            "vllm-continuum-plugin: request %s has %s; serving it without job metadata", request.request_id, e
        )
        return UNTAGGED
