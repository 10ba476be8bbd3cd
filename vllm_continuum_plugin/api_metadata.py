"""API-server side of job metadata: accept top-level fields, reject bad ones.

Stock vLLM keeps unknown top-level body fields (``"job_id": ...`` sent through
the OpenAI client's ``extra_body``) in ``request.model_extra`` and drops them.
``patch_request_class`` wraps a protocol class's ``to_sampling_params`` so that

* top-level ``job_id`` / ``is_last_step`` / tool hints are copied into
  ``SamplingParams.extra_args`` (``vllm_xargs`` values win when both exist);
* the merged metadata is validated with the engine's parser, and a bad value
  raises vLLM's ``VLLMValidationError`` -> HTTP 400 naming the field.

The protocol modules are heavy and only the API server needs them, so the
patch is applied by a post-import hook (see ``registration``), never by
importing them from ``register()``.
"""

from __future__ import annotations

import functools
from typing import Any

from .metadata import JOB_ID, METADATA_FIELDS, MetadataError, parse_job_id, parse_metadata

__all__ = ["PATCHED_ATTR", "patch_request_class", "patch_session_lookup"]

PATCHED_ATTR = "_continuum_patched"


def _validation_error(error: MetadataError) -> Exception:
    try:
        from vllm.exceptions import VLLMValidationError

        return VLLMValidationError(str(error), parameter=error.field, value=error.value)
    except Exception:  # older layouts: a ValueError also becomes HTTP 400
        return ValueError(str(error))


def patch_request_class(cls: type) -> None:
    original = cls.__dict__.get("to_sampling_params")
    if original is None or getattr(original, PATCHED_ATTR, False):
        return

    @functools.wraps(original)
    def to_sampling_params(self: Any, *args: Any, **kwargs: Any) -> Any:
        params = original(self, *args, **kwargs)
        extra_fields = getattr(self, "model_extra", None) or {}
        top_level = {k: extra_fields[k] for k in METADATA_FIELDS if k in extra_fields}
        extra_args = getattr(params, "extra_args", None)
        if top_level:
            merged = dict(top_level)
            merged.update(extra_args or {})
            params.extra_args = extra_args = merged
        if extra_args or getattr(self, "session_id", None):
            try:
                parse_metadata(extra_args, getattr(self, "session_id", None))
            except MetadataError as e:
                raise _validation_error(e) from None
        return params

    setattr(to_sampling_params, PATCHED_ATTR, True)
    cls.to_sampling_params = to_sampling_params


def _names_job_id(request: Any) -> bool:
    extra_fields = getattr(request, "model_extra", None) or {}
    xargs = getattr(request, "vllm_xargs", None) or {}
    return extra_fields.get(JOB_ID) is not None or xargs.get(JOB_ID) is not None


def patch_session_lookup(cls: type) -> None:
    """Validate the session id vLLM found (body ``session_id``,
    ``X-Session-ID`` header, ``vllm_xargs.session_id``) when it becomes the
    job id (no ``job_id`` given): a bad one is an HTTP 400 naming
    ``session_id``, not a request silently served untagged."""
    original = cls.__dict__.get("_get_session_id")
    if not isinstance(original, staticmethod) or getattr(original.__func__, PATCHED_ATTR, False):
        return
    lookup = original.__func__

    @functools.wraps(lookup)
    def _get_session_id(request: Any, raw_request: Any) -> Any:
        value = lookup(request, raw_request)
        if value is not None and not _names_job_id(request):
            try:
                parse_job_id(value, "session_id")
            except MetadataError as e:
                raise _validation_error(e) from None
        return value

    setattr(_get_session_id, PATCHED_ATTR, True)
    cls._get_session_id = staticmethod(_get_session_id)
