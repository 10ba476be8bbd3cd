"""vLLM's real scheduler with its native ``OffloadingConnector`` (the copies
simulated) under Continuum, through the simulator's replay engine on a
virtual clock: the rig of the tests of what the plugin does beside a host
tier (turn_room, backfill, host_tier_order)."""

from __future__ import annotations

from benchmarks import simulate
from benchmarks.sim.arms import ARMS, Arm
from benchmarks.sim.jobs import Segment, SimJob, SimTurn, stable_key
from benchmarks.sim.profiles import PROFILES
from benchmarks.sim.step_model import RooflineStepModel

__all__ = ["PROFILE", "agent", "native_tier_arm", "run_native_tier", "sim_settings"]

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


def agent(name: str, arrival: float, context: int, tools_s: tuple[float, ...]) -> SimJob:
    """An agent with a ``context``-token task whose turns (100 new tokens,
    20-token replies) are separated by calls of a tool taking ``tools_s``;
    its last turn calls none and ends it."""
    history = [Segment(stable_key(name), context)]
    turns = []
    for k in range(len(tools_s) + 1):
        prompt = tuple(history + [Segment(stable_key(name, k), 100)])
        last = k == len(tools_s)
        turns.append(SimTurn(prompt, 20, tools_s[k - 1] if k else 0.0, "" if last else "tool_use"))
        history = list(prompt) + [Segment(stable_key(name, k, "reply"), 20)]
    return SimJob(name, arrival, tuple(turns))
