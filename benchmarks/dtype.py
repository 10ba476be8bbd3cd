"""The dtype everything this project starts computes in: one decision per machine.

A bf16 matmul is only fast on CPUs with native bf16 instructions
(x86 AVX512-BF16 or AMX-BF16, Arm's BF16 extension). Elsewhere torch emulates
it: on an AVX2-only AMD EPYC a bf16 matmul ran at 1.2 GFLOP/s against
51.8 GFLOP/s in fp32 (one thread, 64x576 @ 576x1536), so serving the same
model in fp32 is an order of magnitude faster there. fp32 is exact for every
model this project builds (bf16 weights and GGUF-dequantized weights are
representable in fp32), so it is the choice wherever bf16 is not native.

Every launcher -- the demo, the test servers and engines, the A/B runner,
the model build -- asks :func:`serving_dtype` and passes the answer to vLLM
as ``--dtype`` / ``LLM(dtype=...)``. ``CONTINUUM_DTYPE`` overrides it
(``bfloat16``, ``float32``, ``float16`` or ``auto`` for vLLM's own choice).
The decision is logged once per process.
"""

from __future__ import annotations

import functools
import logging
import os
import platform

__all__ = ["DTYPE_ENV", "cpu_flags", "cpu_has_native_bf16", "cpu_name", "dtype_bytes", "serving_dtype"]

logger = logging.getLogger("vllm.continuum_plugin.dtype")

DTYPE_ENV = "CONTINUUM_DTYPE"
_ALLOWED = ("auto", "bfloat16", "float32", "float16")
_ALIASES = {"bf16": "bfloat16", "fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16"}
# /proc/cpuinfo flags that mean bf16 matmuls run in hardware.
_X86_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
_ARM_BF16_FLAGS = frozenset({"bf16"})


def _cpuinfo(path: str = "/proc/cpuinfo") -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The first processor's feature flags (x86 ``flags``, Arm ``Features``)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """True when this CPU executes bf16 matmuls natively (see module doc)."""
    flags = _cpu_flags(_cpuinfo() if cpuinfo is None else cpuinfo)
    return bool(flags & (_X86_BF16_FLAGS | _ARM_BF16_FLAGS))


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """This CPU's feature flags (e.g. ``avx2``, ``avx512f``)."""
    return _cpu_flags(_cpuinfo() if cpuinfo is None else cpuinfo)


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU's model name, for figures that must say where they were measured."""
    for line in (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("model name", "Model name", "Hardware"):
            return value.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def _normalise(value: str) -> str:
    name = _ALIASES.get(value.strip().lower(), value.strip().lower())
    if name not in _ALLOWED:
        raise ValueError(f"{DTYPE_ENV}={value!r} is not one of {', '.join(_ALLOWED)}")
    return name


def _has_cuda() -> bool:
    # Only ask torch when it is already imported: launchers must stay cheap,
    # and a machine with CUDA has torch imported by whatever uses the GPU.
    import sys

    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available())
    except Exception:
        return False


@functools.cache
def serving_dtype() -> str:
    """``--dtype`` for every engine this project starts (logged once).

    ``CONTINUUM_DTYPE`` wins; on CUDA, bf16; on a CPU, bf16 where it is
    native, else fp32.
    """
    override = os.environ.get(DTYPE_ENV, "").strip()
    if override:
        dtype = _normalise(override)
        reason = f"set by {DTYPE_ENV}"
    elif _has_cuda():
        dtype, reason = "bfloat16", "CUDA device"
    elif cpu_has_native_bf16():
        dtype, reason = "bfloat16", f"{cpu_name()} has native bf16"
    else:
        dtype, reason = "float32", f"{cpu_name()} has no native bf16 (avx512_bf16/amx_bf16), where bf16 is emulated"
    logger.info("vllm-continuum-plugin: serving dtype %s (%s; override with %s)", dtype, reason, DTYPE_ENV)
    return dtype


def dtype_bytes(name: str) -> int:
    """Bytes per element of ``name`` (``auto``: the checkpoints' bf16)."""
    return {"bfloat16": 2, "float16": 2, "float32": 4, "auto": 2}[_normalise(name)]
