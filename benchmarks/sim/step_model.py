"""Step-time models: what one scheduled batch would cost on a GPU.

The simulator's clock advances by ``model.step_seconds(batch)`` per engine
step. Three models share the :class:`StepModel` interface:

* :class:`RooflineStepModel` -- dependency-free physics (FLOPs against peak
  compute, bytes against HBM / NVLink / PCIe bandwidth), with efficiency
  constants calibrated against aiconfigurator (``docs/step_models.md``); the
  default for CI and for machines without the ``sim`` extra;
* ``AiconfiguratorStepModel`` (``aiconfigurator_model``) -- NVIDIA's measured
  vLLM kernel data for the same profiles;
* :class:`CpuStepModel` -- a linear model fitted to step times measured on a
  live (CPU) vLLM engine, so that the simulator can be checked against the
  real thing on this machine.

:func:`~.step_model_factory.make_step_model` picks one by name.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Protocol, runtime_checkable

import numpy as np

from .batch import BatchShape
from .profiles import SimProfile

__all__ = [
    "STEP_MODEL_KINDS",
    "CpuStepModel",
    "RooflineConstants",
    "RooflineStepModel",
    "StepBreakdown",
    "StepModel",
    "nnls",
    "pcie_transfer_seconds",
]

STEP_MODEL_KINDS = ("roofline", "aiconfigurator", "cpu")


@runtime_checkable
class StepModel(Protocol):
    """Prices one engine step.

    Contract for every implementation: ``step_seconds`` is pure and
    deterministic (the same batch gives the same float, whatever was asked
    before), finite, ``> 0`` for a non-empty batch, and ``>= 0`` for an empty
    one (only KV transfers, if the model prices them, can cost anything then).
    """

    name: str

    def step_seconds(self, batch: BatchShape) -> float: ...


# ---------------------------------------------------------------------------
# PCIe transfers (shared by the roofline and the aiconfigurator model)
# ---------------------------------------------------------------------------

# Fraction of PCIe Gen5 x16's 64 GB/s that host<->GPU copies of KV blocks
# reach. Pinned cudaMemcpy on H100 measures ~52-55 GB/s per direction
# (nvbandwidth / bandwidthTest class numbers); KV offload copies many blocks
# of 16 tokens, not one large buffer, so we take 0.8 (51 GB/s) rather than
# the large-copy best case.
PCIE_EFFICIENCY = 0.8


def pcie_transfer_seconds(profile: SimProfile, batch: BatchShape, efficiency: float = PCIE_EFFICIENCY) -> float:
    """Seconds to copy the step's loaded + stored KV tokens over PCIe.

    Each TP rank moves its own KV heads over its own host link, in parallel,
    so the bytes are per GPU. Loads (host -> GPU) and stores (GPU -> host) are
    added, not overlapped: PCIe is full duplex, but vLLM's offloading copies
    for one step are ordered around the forward pass, and serialising them is
    the conservative choice. Linear in bytes by construction.
    """
    tokens = batch.loaded_tokens + batch.stored_tokens
    if tokens < 0 or batch.loaded_tokens < 0 or batch.stored_tokens < 0:
        raise ValueError(f"negative transfer token counts in {batch!r}")
    if tokens == 0:
        return 0.0
    nbytes = tokens * profile.kv_bytes_per_token_per_gpu()
    return nbytes / (profile.gpu.pcie_host_bytes_per_s * efficiency)


# ---------------------------------------------------------------------------
# Roofline
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RooflineConstants:
    """Achieved fractions of the datasheet peaks, and fixed costs.

    Calibrated once against aiconfigurator-core 0.12.0's vLLM data for
    H100 SXM (Llama-3.1-8B TP1 and 70B TP4) by
    ``scripts/compare_step_models.py --calibrate``; see docs/step_models.md
    for the resulting error table. Each value is a property of the hardware +
    kernels, not of one shape, so one set serves both profiles.
    """

    # Dense GEMM throughput as a fraction of peak BF16 (cuBLAS on Hopper at
    # large M reaches ~70-80% of the 989 TFLOPS datasheet number).
    # Calibrated: 0.72.
    linear_mfu: float = 0.72
    # FlashAttention prefill throughput as a fraction of peak (FA2/FA3 on
    # H100 forward: ~50-75% depending on head dim and sequence length).
    # Calibrated: 0.66.
    attention_mfu: float = 0.66
    # Fraction of HBM bandwidth when streaming weights (GEMV-like decode
    # GEMMs); aiconfigurator's system yaml uses 0.8 for all memory-bound ops.
    # Calibrated: 0.78 (2.6 TB/s of 3.35).
    weight_bandwidth_eff: float = 0.78
    # Fraction of HBM bandwidth when paged attention streams KV blocks
    # (long contiguous reads: a little better than the weights'). Calibrated: 0.86.
    kv_bandwidth_eff: float = 0.86
    # How sharply compute- and memory-bound times combine in the dense part:
    # time = (compute**p + memory**p) ** (1/p). p = inf is the textbook
    # max(); real GEMMs near the ridge point are slower than either bound
    # (tile quantisation, imperfect overlap), which a finite p captures.
    # Calibrated: 2 (of 1 .. inf).
    roofline_sharpness: float = 2.0
    # Fraction of NVLink per-direction bandwidth a ring all-reduce reaches.
    # Calibrated: 0.65 (~290 GB/s of 450: one layer's activations, 1-130 MB,
    # are too small for NCCL's large-message bus bandwidth).
    nvlink_eff: float = 0.65
    # Fixed cost per all-reduce (NCCL / vLLM custom all-reduce launch and
    # sync; aiconfigurator's yaml puts p2p latency at 10 us). Calibrated: 6 us.
    allreduce_latency_s: float = 6e-6
    # Per-step cost outside the kernels: the scheduler, input preparation,
    # sampler and launch gaps that vLLM's async scheduling and CUDA graphs do
    # not hide, and the small non-GEMM kernels (norms, RoPE, activations).
    # Calibrated: 0.7 ms, jointly with the efficiencies (small prefills and
    # mid-size decode batches set it; 1-token decodes come out ~5% above
    # aiconfigurator's, whose kernel data has no host-side cost).
    step_overhead_s: float = 7e-4
    # See PCIE_EFFICIENCY.
    pcie_eff: float = PCIE_EFFICIENCY

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, (int, float)) and value >= 0 and not math.isnan(value)):
                raise ValueError(f"RooflineConstants.{f.name} must be a number >= 0, got {value!r}")
        for name in ("linear_mfu", "attention_mfu", "weight_bandwidth_eff", "kv_bandwidth_eff",
                     "nvlink_eff", "pcie_eff"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"RooflineConstants.{name} must be in (0, 1], got {value!r}")
        if self.roofline_sharpness < 1.0:
            raise ValueError(f"RooflineConstants.roofline_sharpness must be >= 1, got {self.roofline_sharpness!r}")


@dataclass(frozen=True)
class StepBreakdown:
    """Seconds per component of one step; ``total`` is their sum.

    ``linear`` covers every token of the step at once (a mixed batch runs one
    GEMM over prefill and decode tokens, reading the weights once);
    ``attention_prefill`` and ``attention_decode`` are priced separately and
    added (different kernels over disjoint requests).
    """

    overhead: float = 0.0
    linear: float = 0.0
    attention_prefill: float = 0.0
    attention_decode: float = 0.0
    allreduce: float = 0.0
    transfer: float = 0.0

    @property
    def total(self) -> float:
        return (self.overhead + self.linear + self.attention_prefill + self.attention_decode
                + self.allreduce + self.transfer)


def _blend(compute_s: float, memory_s: float, p: float) -> float:
    """Roofline combination of a compute- and a memory-bound time (p-norm)."""
    if math.isinf(p):
        return max(compute_s, memory_s)
    hi = max(compute_s, memory_s)
    if hi == 0.0:
        return 0.0
    # Factor out the larger term so that large p does not overflow.
    return hi * ((compute_s / hi) ** p + (memory_s / hi) ** p) ** (1.0 / p)


class RooflineStepModel:
    """FLOPs and bytes per step against a profile's peaks, per TP rank.

    Per step (all quantities per GPU: compute and memory divide by ``tp``):

    * ``linear``: the dense layers over all ``T`` tokens of the step
      (prefill tokens + one per decode). FLOPs ``2 * layer_params * layers *
      T`` plus the LM head for one row per request; bytes: every weight but
      the input embedding (rows are gathered, not read whole), once per step.
      Combined as a roofline (see ``roofline_sharpness``).
    * ``attention_prefill``: per chunk, ``4 * layers * heads * head_dim *
      new * (cached + (new + 1) / 2)`` FLOPs (QK^T and PV, causal over the
      new tokens, full over the cached ones) against reading its
      ``cached + new`` tokens of KV; the larger of the two, summed over chunks.
    * ``attention_decode``: the KV of ``context + 1`` tokens per decode read
      from HBM (its FLOPs are checked too but never dominate).
    * ``allreduce`` (tp > 1): two ring all-reduces per layer of ``T *
      hidden`` activations over NVLink, plus a fixed latency each.
    * ``transfer``: :func:`pcie_transfer_seconds`.
    * ``overhead``: ``step_overhead_s``, once per non-empty step.

    Mixed batches add their prefill and decode attention and share one dense
    pass: ``step(mixed) = overhead + linear(T_p + T_d) + attn_p + attn_d``,
    which is ``step(prefill) + step(decode) - overhead - (linear(T_p) +
    linear(T_d) - linear(T_p + T_d))``: the sum of the parts less the second
    weight read. Monotone (non-decreasing) in every token and context count.
    """

    def __init__(self, profile: SimProfile, constants: RooflineConstants | None = None) -> None:
        self.profile = profile
        self.constants = constants if constants is not None else RooflineConstants()
        self.name = f"roofline[{profile.name}]"
        m, tp, gpu, c = profile.model, profile.tp, profile.gpu, self.constants
        # Per-GPU rates and sizes, computed once: step_seconds is on the hot path.
        self._flops_linear = gpu.peak_flops_bf16 * c.linear_mfu
        self._flops_attn = gpu.peak_flops_bf16 * c.attention_mfu
        self._bw_weights = gpu.hbm_bytes_per_s * c.weight_bandwidth_eff
        self._bw_kv = gpu.hbm_bytes_per_s * c.kv_bandwidth_eff
        self._layer_flops_per_token = 2.0 * m.num_layers * m.layer_params() / tp
        self._head_flops_per_row = 2.0 * (m.lm_head_params() or m.embedding_params()) / tp
        self._weight_bytes = (m.params() - m.embedding_params()) * m.dtype_bytes / tp
        if m.lm_head_params() == 0:  # tied: the LM head reads the embedding table
            self._weight_bytes += m.embedding_params() * m.dtype_bytes / tp
        self._attn_flops_per_pair = 4.0 * m.num_layers * m.num_heads * m.head_dim / tp
        self._kv_bytes_per_token = float(profile.kv_bytes_per_token_per_gpu())
        self._allreduces = 2 * m.num_layers if tp > 1 else 0
        self._ring_factor = 2.0 * (tp - 1) / tp
        self._act_bytes_per_token = m.hidden_size * m.dtype_bytes
        self._nvlink = gpu.nvlink_bytes_per_s * c.nvlink_eff

    def __repr__(self) -> str:
        return f"RooflineStepModel({self.profile.name!r}, {self.constants!r})"

    def breakdown(self, batch: BatchShape) -> StepBreakdown:
        """Seconds per component (see the class docstring); pure."""
        c = self.constants
        transfer = pcie_transfer_seconds(self.profile, batch, c.pcie_eff)
        if batch.is_empty:
            return StepBreakdown(transfer=transfer)
        n_decode = len(batch.decode_contexts)
        tokens = batch.num_prefill_tokens + n_decode
        rows = len(batch.prefills) + n_decode  # one sampled row per request (upper bound)

        linear_flops = self._layer_flops_per_token * tokens + self._head_flops_per_row * rows
        linear = _blend(linear_flops / self._flops_linear, self._weight_bytes / self._bw_weights,
                        c.roofline_sharpness)

        attn_prefill = 0.0
        for chunk in batch.prefills:
            if chunk.new_tokens < 1 or chunk.cached_tokens < 0:
                raise ValueError(f"invalid prefill chunk {chunk!r}: need new_tokens >= 1, cached_tokens >= 0")
            pairs = chunk.new_tokens * (chunk.cached_tokens + (chunk.new_tokens + 1) / 2.0)
            compute = self._attn_flops_per_pair * pairs / self._flops_attn
            memory = (chunk.cached_tokens + chunk.new_tokens) * self._kv_bytes_per_token / self._bw_kv
            attn_prefill += max(compute, memory)

        attn_decode = 0.0
        if n_decode:
            if min(batch.decode_contexts) < 0:
                raise ValueError(f"negative decode context in {batch.decode_contexts!r}")
            kv_tokens = sum(batch.decode_contexts) + n_decode
            attn_decode = max(kv_tokens * self._kv_bytes_per_token / self._bw_kv,
                              self._attn_flops_per_pair * kv_tokens / self._flops_attn)

        allreduce = 0.0
        if self._allreduces:
            msg = tokens * self._act_bytes_per_token
            allreduce = self._allreduces * (c.allreduce_latency_s + self._ring_factor * msg / self._nvlink)

        return StepBreakdown(
            overhead=c.step_overhead_s,
            linear=linear,
            attention_prefill=attn_prefill,
            attention_decode=attn_decode,
            allreduce=allreduce,
            transfer=transfer,
        )

    def step_seconds(self, batch: BatchShape) -> float:
        return self.breakdown(batch).total


# ---------------------------------------------------------------------------
# Non-negative least squares (Lawson & Hanson), numpy only
# ---------------------------------------------------------------------------


def nnls(a: np.ndarray, b: np.ndarray, *, max_iter: int | None = None, tol: float | None = None) -> np.ndarray:
    """``argmin ||a x - b||_2`` subject to ``x >= 0`` (Lawson-Hanson active set).

    ``a`` is ``(m, n)``, ``b`` is ``(m,)``. Deterministic. Columns that are all
    zero get coefficient 0. Raises ``ValueError`` on shape mismatch or
    non-finite input, ``RuntimeError`` if it does not converge.
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.ndim != 2 or b.ndim != 1 or a.shape[0] != b.shape[0]:
        raise ValueError(f"nnls: need a (m, n) and b (m,), got {a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("nnls: a and b must be finite")
    m, n = a.shape
    if tol is None:
        tol = 10 * max(m, n) * np.finfo(float).eps * max(1.0, float(np.abs(a).max(initial=0.0)))
    max_iter = 3 * n + 30 if max_iter is None else max_iter
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    # A column that leaves the passive set in the very iteration it entered
    # (possible only through rounding) is not offered again: that would cycle.
    blocked = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    for _ in range(max_iter):
        candidates = ~passive & ~blocked & (w > tol)
        if not candidates.any():
            return x
        j = int(np.argmax(np.where(candidates, w, -np.inf)))
        passive[j] = True
        while True:
            idx = np.flatnonzero(passive)
            z = np.zeros(n)
            z[idx] = np.linalg.lstsq(a[:, idx], b, rcond=None)[0]
            if (z[idx] > 0).all():
                x = z
                break
            # Step back towards x until the first passive coefficient hits 0.
            neg = idx[z[idx] <= 0]
            denom = x[neg] - z[neg]
            ratios = np.where(denom > 0, x[neg] / np.where(denom > 0, denom, 1.0), 0.0)
            alpha = float(np.min(ratios))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        if not passive[j]:
            blocked[j] = True
        w = a.T @ (b - a @ x)
    raise RuntimeError(f"nnls did not converge in {max_iter} iterations")


# ---------------------------------------------------------------------------
# Fitted CPU model
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuStepModel:
    """``seconds = c0 + c_tok * P + c_attn * A + c_dec * D + c_kv * K + c_xfer * X``.

    Features of a batch (:meth:`features`): ``P`` prefill tokens, ``A = sum
    new * (cached + new / 2)`` (prefill attention pairs), ``D`` decodes,
    ``K`` summed decode contexts, ``X`` loaded + stored KV tokens. Invariant:
    every coefficient is finite and ``>= 0`` (fitted by non-negative least
    squares), so the model is monotone in every feature and ``> 0`` for a
    non-empty batch whenever ``c0 > 0``.
    """

    c0: float
    c_tok: float
    c_attn: float
    c_dec: float
    c_kv: float
    c_xfer: float = 0.0
    name: str = "cpu-fit"

    FEATURES = ("const", "prefill_tokens", "prefill_attention_pairs", "decodes", "decode_context_tokens",
                "transfer_tokens")

    def __post_init__(self) -> None:
        for key in ("c0", "c_tok", "c_attn", "c_dec", "c_kv", "c_xfer"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"CpuStepModel.{key} must be finite and >= 0, got {value!r}")

    @staticmethod
    def features(batch: BatchShape) -> tuple[float, float, float, float, float, float]:
        """The model's regressors for ``batch`` (the first is the constant 1)."""
        pairs = sum(p.new_tokens * (p.cached_tokens + p.new_tokens / 2.0) for p in batch.prefills)
        return (1.0, float(batch.num_prefill_tokens), float(pairs), float(batch.num_decodes),
                float(sum(batch.decode_contexts)), float(batch.loaded_tokens + batch.stored_tokens))

    def coefficients(self) -> tuple[float, float, float, float, float, float]:
        return (self.c0, self.c_tok, self.c_attn, self.c_dec, self.c_kv, self.c_xfer)

    def step_seconds(self, batch: BatchShape) -> float:
        x = self.features(batch)
        if batch.is_empty:
            return self.c_xfer * x[5]
        return float(sum(c * f for c, f in zip(self.coefficients(), x)))

    @classmethod
    def fit(cls, samples: Sequence[tuple[BatchShape, float]], *, relative: bool = True,
            name: str = "cpu-fit") -> CpuStepModel:
        """Fit the coefficients to measured ``(batch, seconds)`` samples.

        ``relative=True`` (default) minimises the squared *relative* error
        (rows weighted by ``1 / seconds``), so millisecond decode steps count
        as much as second-long prefills. Empty batches are skipped (the engine
        does not run them). Raises ``ValueError`` naming the bad sample on a
        non-positive or non-finite time, or if no non-empty sample is left.
        """
        rows: list[tuple[float, ...]] = []
        ys: list[float] = []
        for i, (batch, seconds) in enumerate(samples):
            if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"sample {i}: step time must be finite and > 0, got {seconds!r}")
            if batch.is_empty:
                continue
            rows.append(cls.features(batch))
            ys.append(float(seconds))
        if not rows:
            raise ValueError("CpuStepModel.fit: no non-empty samples")
        a = np.array(rows, dtype=float)
        y = np.array(ys, dtype=float)
        if relative:
            a = a / y[:, None]
            y = np.ones_like(y)
        # Scale columns to unit norm: the features span ~12 orders of
        # magnitude (1 vs attention pairs), which would wreck the conditioning.
        scale = np.linalg.norm(a, axis=0)
        scale[scale == 0] = 1.0
        coef = nnls(a / scale, y) / scale
        return cls(*(float(v) for v in coef), name=name)

    def to_json(self) -> str:
        return json.dumps({"kind": "cpu", **asdict(self)}, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CpuStepModel:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("kind", "cpu") != "cpu":
            raise ValueError(f"not a CpuStepModel JSON document: {str(data)[:80]!r}")
        data.pop("kind", None)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"CpuStepModel JSON has unknown keys {sorted(unknown)}")
        return cls(**data)

    @classmethod
    def load(cls, path: str) -> CpuStepModel:
        with open(path, encoding="utf-8") as fh:
            return cls.from_json(fh.read())


# ---------------------------------------------------------------------------
# Factory
# ---------------------------------------------------------------------------
