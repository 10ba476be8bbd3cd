"""A job's next turn is not kept waiting for GPU room by younger decodes.

Under vLLM's native offloading (its real ``OffloadingConnector`` scheduler
side and LRU CPU manager, the copies simulated) a returning turn whose
context the tier holds needs the room of its whole context on the GPU; with
the pool full of younger jobs' long decodes it would wait for one of them to
finish. ``turn_room`` preempts such decodes (they reload from the tier when
they resume). Runs on vLLM's real scheduler through the simulator's replay
engine, on a virtual clock; ``run_arm`` asserts every KV block is free at
the end.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks.sim.jobs import Segment, SimJob, SimTurn, stable_key
from benchmarks.sim.profiles import write_config_dir
from native_tier_rig import PROFILE, run_native_tier

BLOCKS = 1000  # 16k tokens


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield write_config_dir(PROFILE, str(tmp_path_factory.mktemp("room") / "model"))


def job(name: str, arrival: float, context: int, turns: int, out: int, tool_s: float) -> SimJob:
    history = [Segment(stable_key(name), context)]
    out_turns = []
    for k in range(turns):
        prompt = tuple(history + [Segment(stable_key(name, k), 200)])
        out_turns.append(SimTurn(prompt, out, tool_s if k else 0.0, "tool_use" if k < turns - 1 else ""))
        history = list(prompt) + [Segment(stable_key(name, k, "reply"), out)]
    return SimJob(name, arrival, tuple(out_turns))


def workload() -> list[SimJob]:
    # Ten warm-up agents (2k-5.6k contexts, sizes spread so the reload fit
    # has a slope) whose 120 s tools outlast their TTLs: their returns load
    # from the tier and teach the plugin what a reload costs (it needs 8
    # loads). Then an older agent ("old", 5k context) whose tool also
    # outlasts its TTL returns while three younger agents' long decodes (4k
    # contexts, 1,000-token replies) fill the 16k-token pool. The 16 GiB
    # tier (128k tokens) holds every context stored.
    warm = [job(f"warm{i}", 2.0 * i, 2000 + 400 * i, 2, 40, 120.0) for i in range(10)]
    old = job("old", 60.0, 5000, 2, 40, 120.0)
    young = [job(f"young{i}", 178.0 + 0.1 * i, 4000, 1, 1000, 0.0) for i in range(3)]
    return [*warm, old, *young]


def run(model_dir: str, enabled: bool):
    return run_native_tier(model_dir, workload(), BLOCKS, 16.0, [f"preempt_for_turns={str(enabled).lower()}"])


def returning_turn(records):
    return next(t for t in records.turns if t.job_id == "old" and t.turn == 1)


def test_a_returning_turn_gets_room_from_younger_decodes_at_once(model_dir: str) -> None:
    summary, records = run(model_dir, enabled=True)
    without, records_without = run(model_dir, enabled=False)
    fast, slow = returning_turn(records), returning_turn(records_without)
    # Without it the turn waits for a young decode to finish (seconds of
    # 1,000-token replies); with it, it is scheduled in the step after it
    # arrives, its context loaded from the tier, not recomputed.
    assert slow.queueing_s > 1.0
    assert fast.queueing_s < slow.queueing_s / 4
    assert fast.cached_tokens >= 5000
    assert records.preemptions > 0 and records_without.preemptions == 0
    # Every young job still finishes (its decode resumes from the tier).
    assert summary.turns == without.turns == sum(len(j.turns) for j in workload())


def test_a_preempted_decode_resumes_without_recomputing_its_context(model_dir: str) -> None:
    _, records = run(model_dir, enabled=True)
    young = [t for t in records.turns if t.job_id.startswith("young") and t.preemptions]
    assert young
    # Its prompt is computed once; what it lost on the GPU came back as a load.
    assert all(t.prefill_tokens <= t.prompt_tokens + 16 for t in young)
    assert records.loaded_tokens > 0


def test_the_setting_is_validated() -> None:
    from vllm_continuum_plugin.config import ContinuumConfig

    with pytest.raises(ValueError, match="preempt_for_turns_after_s"):
        ContinuumConfig(preempt_for_turns_after_s=-1.0)
    assert ContinuumConfig().preempt_for_turns and ContinuumConfig().preempt_for_turns_after_s == 0.0
