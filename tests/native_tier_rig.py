"""vLLM's real scheduler with its native ``OffloadingConnector`` (the copies
simulated) under Continuum, through the simulator's replay engine on a
virtual clock: the rig of the tests of what the plugin does beside a host
tier (turn_room, backfill, host_tier_order)."""

from __future__ import annotations

from benchmarks import simulate
from benchmarks.sim.arms import ARMS, Arm
from benchmarks.sim.jobs import SimJob
from benchmarks.sim.profiles import PROFILES
from benchmarks.sim.step_model import RooflineStepModel

__all__ = ["PROFILE", "native_tier_arm", "run_native_tier", "sim_settings"]

PROFILE = PROFILES["h100-llama8b"]


def native_tier_arm(settings: list[str]) -> Arm:
    """The ``continuum-native-offload`` arm with ``KEY=JSON`` plugin settings."""
    return simulate._with_settings(ARMS["continuum-native-offload"], settings)


def sim_settings(model_dir: str, blocks: int, offload_gib: float) -> simulate.SimSettings:
    """A GPU pool of ``blocks`` blocks and a host tier of ``offload_gib`` GiB."""
    return simulate.SimSettings(PROFILE, RooflineStepModel(PROFILE), model_dir, blocks, offload_gib=offload_gib)


def run_native_tier(model_dir: str, jobs: list[SimJob], blocks: int, offload_gib: float, settings: list[str]):
    """``jobs`` under Continuum with vLLM's native offloading and ``settings``;
    ``(summary, records)``. ``run_arm`` asserts every block is free at the end."""
    return simulate.run_arm(native_tier_arm(settings), jobs, sim_settings(model_dir, blocks, offload_gib))
