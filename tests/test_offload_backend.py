"""The scheduler finds the plugin's offload backend, also inside vLLM's
MultiConnector (how users combine connectors), and says what it found."""

from __future__ import annotations

import logging

import pytest
from vllm.config import KVTransferConfig

from benchmarks.sim.arms import ARMS, Arm, EngineShape, build_scheduler
from benchmarks.sim.profiles import PROFILES, write_config_dir
from vllm_continuum_plugin.clock import ManualClock
from vllm_continuum_plugin.connectors.kv_offload import ContinuumOffloadConnector
from vllm_continuum_plugin.offload_backend import OffloadBackend, find_offload_backend

PROFILE = PROFILES["h100-llama8b"]
HOST_BYTES = 2 * 2**30


@pytest.fixture(scope="module")
def shape(tmp_path_factory: pytest.TempPathFactory) -> EngineShape:
    model_dir = write_config_dir(PROFILE, str(tmp_path_factory.mktemp("backend") / "model"))
    return EngineShape(model_dir=model_dir, block_size=16, num_blocks=2000, max_num_seqs=16,
                       max_num_batched_tokens=2048, max_model_len=8192, offload_bytes=HOST_BYTES)


def _multi(children: list[dict]) -> KVTransferConfig:
    return KVTransferConfig(kv_connector="MultiConnector", kv_role="kv_both",
                            kv_connector_extra_config={"connectors": children})


PLUGIN = {"kv_connector": "ContinuumOffloadConnector", "kv_role": "kv_both",
          "kv_connector_extra_config": {"cpu_bytes": HOST_BYTES}}
NATIVE = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
          "kv_connector_extra_config": {"cpu_bytes_to_use": HOST_BYTES}}


def test_the_plugins_connector_is_the_backend(shape: EngineShape) -> None:
    s = build_scheduler(ARMS["continuum-offload"], shape, ManualClock())
    assert isinstance(s.offload, ContinuumOffloadConnector) and isinstance(s.offload, OffloadBackend)
    assert s.offload.settings.store_mode == "eager"  # the connector's default
    s.shutdown()
    victim = build_scheduler(ARMS["continuum-offload-explicit"], shape, ManualClock())
    assert isinstance(victim.offload, ContinuumOffloadConnector) and victim.offload.settings.store_mode == "explicit"
    victim.shutdown()


def test_a_store_mode_is_an_arm_of_the_plugins_connector_only() -> None:
    with pytest.raises(ValueError, match="store_mode 'explicit' needs offload='plugin'"):
        Arm("bad", "continuum", offload="native", store_mode="explicit")


def test_the_backend_is_found_inside_a_multiconnector(shape: EngineShape, caplog: pytest.LogCaptureFixture) -> None:
    """Before: ``hasattr(connector, "save_blocks")`` was False for the
    MultiConnector and the pin/offload hybrid was silently off."""
    with caplog.at_level(logging.INFO, logger="vllm.continuum_plugin"):
        s = build_scheduler(ARMS["continuum"], shape, ManualClock(), kv_transfer=_multi([NATIVE, PLUGIN]))
    assert isinstance(s.offload, ContinuumOffloadConnector)
    assert s.offload in s.connector.sub_connectors
    assert "offload backend ContinuumOffloadConnector found inside MultiConnector" in caplog.text
    s.shutdown()


def test_a_connector_without_a_backend_is_reported(shape: EngineShape, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="vllm.continuum_plugin"):
        s = build_scheduler(ARMS["continuum"], shape, ManualClock(), kv_transfer=_multi([NATIVE]))
    assert s.offload is None
    assert "has no plugin offload backend" in caplog.text
    s.shutdown()
    assert find_offload_backend(None) is None
