"""The one dtype decision every launcher uses (pure logic, no engine)."""

from __future__ import annotations

import pytest

from vllm_continuum_plugin.benchmarks import dtype as dtype_mod
from vllm_continuum_plugin.benchmarks.server import VLLMServer

EPYC_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx avx2 fma bmi2
"""
SAPPHIRE_RAPIDS = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16
"""
ICE_LAKE = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8375C
flags\t\t: fpu avx2 avx512f avx512bw avx512_vnni
"""
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes sha2 crc32 atomics bf16 i8mm sve
"""


@pytest.mark.parametrize(("cpuinfo", "native"), [
    (EPYC_AVX2, False), (ICE_LAKE, False), (SAPPHIRE_RAPIDS, True), (GRAVITON3, True), ("", False),
])
def test_native_bf16_is_read_from_the_cpu_flags(cpuinfo, native):
    # AVX-512 alone is not enough: bf16 needs AVX512-BF16 or AMX (or Arm BF16).
    assert dtype_mod.cpu_has_native_bf16(cpuinfo) is native


def test_cpu_name_for_figures():
    assert dtype_mod.cpu_name(EPYC_AVX2) == "AMD EPYC"
    assert dtype_mod.cpu_name(SAPPHIRE_RAPIDS).startswith("Intel(R) Xeon(R) Platinum 8480+")


@pytest.fixture
def fresh_decision(monkeypatch):
    """serving_dtype() is decided once per process: clear it around a test."""
    dtype_mod.serving_dtype.cache_clear()
    yield monkeypatch
    dtype_mod.serving_dtype.cache_clear()


@pytest.mark.parametrize(("cpuinfo", "expected"), [(EPYC_AVX2, "float32"), (SAPPHIRE_RAPIDS, "bfloat16")])
def test_serving_dtype_follows_the_cpu_and_is_logged_once(fresh_decision, caplog, cpuinfo, expected):
    fresh_decision.delenv(dtype_mod.DTYPE_ENV, raising=False)
    fresh_decision.setattr(dtype_mod, "_cpuinfo", lambda path="/proc/cpuinfo": cpuinfo)
    fresh_decision.setattr(dtype_mod, "_has_cuda", lambda: False)
    with caplog.at_level("INFO", logger="vllm.continuum_plugin.dtype"):
        assert dtype_mod.serving_dtype() == expected
        assert dtype_mod.serving_dtype() == expected
    lines = [r.getMessage() for r in caplog.records if "serving dtype" in r.getMessage()]
    assert len(lines) == 1 and expected in lines[0]


@pytest.mark.parametrize(("value", "expected"), [("bf16", "bfloat16"), ("FLOAT32", "float32"), ("auto", "auto")])
def test_the_user_overrides_the_choice(fresh_decision, value, expected):
    fresh_decision.setenv(dtype_mod.DTYPE_ENV, value)
    fresh_decision.setattr(dtype_mod, "_cpuinfo", lambda path="/proc/cpuinfo": SAPPHIRE_RAPIDS)
    assert dtype_mod.serving_dtype() == expected


def test_a_bad_override_names_the_value(fresh_decision):
    fresh_decision.setenv(dtype_mod.DTYPE_ENV, "int4")
    with pytest.raises(ValueError, match="CONTINUUM_DTYPE='int4' is not one of"):
        dtype_mod.serving_dtype()


def test_servers_get_the_machines_dtype_unless_the_caller_names_one():
    assert VLLMServer("m", ["--block-size", "32"]).args[-2:] == ["--dtype", dtype_mod.serving_dtype()]
    assert VLLMServer("m", [], dtype="bfloat16").args == ["--dtype", "bfloat16"]
    assert VLLMServer("m", ["--dtype=float16"]).args == ["--dtype=float16"]
    assert VLLMServer("m", ["--dtype", "float32"], dtype="bfloat16").args == ["--dtype", "float32"]


def test_element_sizes():
    assert [dtype_mod.dtype_bytes(d) for d in ("bfloat16", "float32", "fp16")] == [2, 4, 2]
