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

from .metadata import METADATA_FIELDS, MetadataError, parse_metadata

__all__ = ["PATCHED_ATTR", "patch_request_class"]

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
