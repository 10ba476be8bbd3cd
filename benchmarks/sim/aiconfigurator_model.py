"""NVIDIA aiconfigurator's measured vLLM data behind the :class:`StepModel` interface.

aiconfigurator-core (PyPI, Apache-2.0; the optional extra ``sim``) ships
per-kernel timings collected on real GPUs under vLLM 0.24 (GEMMs, attention,
NCCL) and composes them, in Rust, into the time of one forward pass. SGLang's
and TensorRT-LLM's simulation modes price their steps the same way.

What we use of it, as verified in the installed 0.12.0 source
(``aiconfigurator_core/sdk/rust_engine_step.py`` and the extension's schema):

* ``RustForwardPassPerfModel.from_native(config)`` with ``config`` =
  ``schema_version``, ``model_name``, ``system_name``, ``backend``,
  ``backend_version``, ``tp_size``, ``pp_size``, ``enable_shared_layer``,
  ``strict_provenance``;
* ``estimate_forward_pass_time_ms({"scheduled_requests": {...}})`` with the
  Dynamo "forward pass metrics" fields: ``num_prefill_requests``,
  ``sum_prefill_tokens`` (tokens computed this step), ``sum_prefill_kv_tokens``
  (context already in the KV cache before the chunk: ``num_computed_tokens``),
  ``var_prefill_length`` (variance of prompt lengths), ``num_decode_requests``,
  ``sum_decode_kv_tokens`` (decode contexts before the step) and
  ``var_decode_kv_tokens``. It infers prefill / decode / mixed from which
  sums are non-zero, treats the prefills as ``num_prefill_requests`` equal
  requests (mean new tokens, mean cached context), and ignores both variances
  (checked: changing them leaves the estimate unchanged). Empty work is 0.0;
  a prefill token sum without a prefill request is an error.

The equal-requests reading misprices the batches chunked prefill builds
(one long chunk beside short ones): for Llama-3.1-8B on H100, chunks
(4000 new, 0 cached) + (100 new, 90000 cached) cost 245 ms with the literal
``sum_prefill_kv_tokens`` = 90000 (it prices 2 x 2050 x 45000 attention
pairs), against 95 ms from the roofline and 102 ms for the two chunks priced
one by one (an upper bound: it reads the weights twice). So by default we pass
an *attention-equivalent* cached sum ``K`` instead: the one for which
``n`` equal requests of ``S / n`` new tokens after ``K / n`` cached ones have
the batch's true attention work ``A = sum new * (cached + new / 2)``:
``K = (n * A - S**2 / 2) / S`` (>= 0 by Cauchy-Schwarz; equal to the literal
sum when the chunks are alike, and for one chunk). The example then costs
100 ms. ``literal_prefill_kv=True`` passes the literal sum.

It prices no host<->GPU KV copies; :func:`~.step_model.pcie_transfer_seconds`
adds them exactly as the roofline does. Estimates are memoised per reduced
shape (the sums above), since a replay asks for the same few shapes over and
over and one call costs ~10 us to ~1 ms.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from .batch import BatchShape
from .profiles import SimProfile
from .step_model import PCIE_EFFICIENCY, pcie_transfer_seconds

__all__ = [
    "AIC_INSTALL_HINT",
    "AiconfiguratorStepModel",
    "aiconfigurator_version",
    "attention_equivalent_kv",
    "fpm_for",
]

AIC_INSTALL_HINT = "pip install 'vllm-continuum-plugin[sim]'  (aiconfigurator-core==0.12.0)"

# The aiconfigurator shape a BatchShape reduces to: what the model reads.
_Key = tuple[int, int, int, int, int]


def aiconfigurator_version() -> str | None:
    """The installed aiconfigurator-core version, or None if it is not installed."""
    from importlib import metadata

    try:
        return metadata.version("aiconfigurator-core")
    except metadata.PackageNotFoundError:
        return None


def _variance(values: Iterable[int]) -> float:
    """Population variance (Dynamo's Welford accumulator divides by n)."""
    vals = list(values)
    if len(vals) < 2:
        return 0.0
    mean = sum(vals) / len(vals)
    return sum((v - mean) ** 2 for v in vals) / len(vals)


def attention_equivalent_kv(batch: BatchShape) -> int:
    """The cached-token sum that gives equal requests ``batch``'s prefill attention work.

    See the module docstring: ``K = (n * A - S**2 / 2) / S``, rounded; 0
    without prefills. Equals ``sum(cached)`` when all chunks have the same
    ``new_tokens`` (in particular for a single chunk).
    """
    n = len(batch.prefills)
    if n == 0:
        return 0
    if len({p.new_tokens for p in batch.prefills}) == 1:
        return sum(p.cached_tokens for p in batch.prefills)  # exact, no rounding
    s = batch.num_prefill_tokens
    a = sum(p.new_tokens * (p.cached_tokens + p.new_tokens / 2.0) for p in batch.prefills)
    return max(0, round((n * a - s * s / 2.0) / s))


def fpm_for(batch: BatchShape, *, literal_prefill_kv: bool = False) -> dict[str, Any]:
    """The ``scheduled_requests`` forward-pass metrics sent to aiconfigurator for ``batch``.

    ``sum_prefill_kv_tokens`` is :func:`attention_equivalent_kv` unless
    ``literal_prefill_kv``. The variances are Dynamo's (population variance
    of prompt lengths -- here cached + new -- and of decode contexts);
    aiconfigurator 0.12.0 ignores them.
    """
    kv = sum(p.cached_tokens for p in batch.prefills) if literal_prefill_kv else attention_equivalent_kv(batch)
    return {
        "scheduled_requests": {
            "num_prefill_requests": len(batch.prefills),
            "sum_prefill_tokens": batch.num_prefill_tokens,
            "var_prefill_length": _variance(p.cached_tokens + p.new_tokens for p in batch.prefills),
            "sum_prefill_kv_tokens": kv,
            "num_decode_requests": len(batch.decode_contexts),
            "sum_decode_kv_tokens": sum(batch.decode_contexts),
            "var_decode_kv_tokens": _variance(batch.decode_contexts),
        }
    }


class AiconfiguratorStepModel:
    """aiconfigurator-core's vLLM forward-pass estimate for ``profile``, plus PCIe transfers.

    Invariants: deterministic and pure as seen by callers (the memo only
    saves time); ``> 0`` for a non-empty batch (a non-positive or non-finite
    estimate raises ``RuntimeError`` naming the shape). Construction takes a
    few seconds (it compiles the engine and loads the profile's perf data).
    """

    def __init__(self, profile: SimProfile, *, cache_size: int = 65536, literal_prefill_kv: bool = False) -> None:
        try:
            from aiconfigurator_core.sdk.rust_engine_step import RustForwardPassPerfModel
        except ImportError as exc:
            raise ImportError(
                f"step model 'aiconfigurator' needs aiconfigurator-core: {AIC_INSTALL_HINT}"
            ) from exc
        if cache_size < 1:
            raise ValueError(f"cache_size must be >= 1, got {cache_size!r}")
        self.profile = profile
        self.literal_prefill_kv = literal_prefill_kv
        self.name = f"aiconfigurator[{profile.name}]"
        self.config: dict[str, Any] = {
            "schema_version": 1,
            "model_name": profile.aic_model_name,
            "system_name": profile.aic_system_name,
            "backend": "vllm",
            "backend_version": profile.aic_backend_version,
            "tp_size": profile.tp,
            "pp_size": 1,
            "enable_shared_layer": None,
            "strict_provenance": False,
        }
        # Loading the perf database warns about low-fidelity fallback rows of
        # MLA / DSA tables (DeepSeek-style attention): irrelevant to Llama, and
        # noise in every simulator run. Quiet that logger while building only.
        db_logger = logging.getLogger("aiconfigurator_core.sdk.perf_database")
        previous = db_logger.level
        db_logger.setLevel(logging.ERROR)
        try:
            self._model = RustForwardPassPerfModel.from_native(self.config)
        except Exception as exc:
            raise RuntimeError(
                f"aiconfigurator has no vLLM model for profile {profile.name!r} "
                f"(config {self.config}): {exc}"
            ) from exc
        finally:
            db_logger.setLevel(previous)
        self._estimate_ms = lru_cache(maxsize=cache_size)(self._estimate_ms_uncached)

    def __repr__(self) -> str:
        return f"AiconfiguratorStepModel({self.profile.name!r}, literal_prefill_kv={self.literal_prefill_kv})"

    def key(self, batch: BatchShape) -> _Key:
        """What aiconfigurator sees of ``batch`` (so also the memo key)."""
        # The sums only: the variances fpm_for adds are ignored by the model,
        # and computing them would cost more than a memo hit.
        if self.literal_prefill_kv:
            kv = sum(p.cached_tokens for p in batch.prefills)
        else:
            kv = attention_equivalent_kv(batch)
        return (len(batch.prefills), batch.num_prefill_tokens, kv,
                len(batch.decode_contexts), sum(batch.decode_contexts))

    def _estimate_ms_uncached(self, key: _Key) -> float:
        n_pre, pre_tokens, pre_kv, n_dec, dec_kv = key
        fpm = {
            "scheduled_requests": {
                "num_prefill_requests": n_pre,
                "sum_prefill_tokens": pre_tokens,
                "var_prefill_length": 0.0,  # ignored by the model (see the module docstring)
                "sum_prefill_kv_tokens": pre_kv,
                "num_decode_requests": n_dec,
                "sum_decode_kv_tokens": dec_kv,
                "var_decode_kv_tokens": 0.0,
            }
        }
        ms = self._model.estimate_forward_pass_time_ms(fpm)
        if ms is None or not math.isfinite(ms) or ms <= 0:
            raise RuntimeError(f"aiconfigurator returned {ms!r} ms for {self.profile.name!r} shape {fpm}")
        return float(ms)

    def forward_seconds(self, batch: BatchShape) -> float:
        """aiconfigurator's forward-pass time alone (no transfers)."""
        if batch.is_empty:
            return 0.0
        return self._estimate_ms(self.key(batch)) / 1e3

    def step_seconds(self, batch: BatchShape) -> float:
        return self.forward_seconds(batch) + pcie_transfer_seconds(self.profile, batch, PCIE_EFFICIENCY)

    def cache_info(self) -> Any:
        return self._estimate_ms.cache_info()
