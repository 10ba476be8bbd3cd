"""A finished task's context goes first out of vLLM's native host tier.

vLLM's LRU host-tier policy counts a request's finish as a use, so the
context of a task that is over would outlive, in the tier, the contexts of
agents whose tools still run. The plugin's ``FinishedFirstLRUCachePolicy``
(vLLM's own LRU policy, subclassed) ranks a marked request's own blocks
first for eviction. Tested on vLLM's real policy, and end to end on vLLM's
real scheduler with its native ``OffloadingConnector`` (the copies
simulated) through the simulator's replay engine, whose ``run_arm`` asserts
every KV block is free at the end.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

from benchmarks.sim.jobs import SimJob
from benchmarks.sim.profiles import write_config_dir
from native_tier_rig import PROFILE, agent, run_native_tier
from vllm_continuum_plugin.host_tier_order import (
    MAX_MARKS,
    FinishedFirstLRUCachePolicy,
    install_finished_first,
)

BLOCK = 16  # tokens per tier block in these unit tests


def store(policy: LRUCachePolicy, req: str, blocks: int) -> tuple[list[OffloadKey], ReqContext]:
    """A request whose ``blocks`` blocks were stored (ready, evictable) and
    which then finished, as vLLM's manager reports it to the policy."""
    ctx = ReqContext(req_id=req)
    keys = [OffloadKey(f"{req}-{i}".encode()) for i in range(blocks)]
    takes_context = "req_context" in inspect.signature(policy.insert).parameters  # vLLM 0.33
    for i, key in enumerate(keys):
        ctx.set_offload_key_position(key, (i + 1) * BLOCK)
        chunk = ChunkStatus(len(policy.chunks))
        chunk.ref_cnt = 0
        if takes_context:
            policy.insert(key, chunk, ctx)
        else:
            policy.insert(key, chunk)
    return keys, ctx


def evicted(policy: LRUCachePolicy, n: int) -> set[OffloadKey]:
    out = policy.evict(n, set())
    assert out is not None
    return {key for key, _ in out}


@pytest.mark.unit  # vLLM's policy alone (the file's level is scheduler)
def test_a_marked_requests_blocks_go_first_though_it_finished_last() -> None:
    policy = FinishedFirstLRUCachePolicy(cache_capacity=64)
    counted: list[int] = []
    policy.on_demoted = counted.append  # the plugin's metrics counter
    live, live_ctx = store(policy, "live", 4)
    done, done_ctx = store(policy, "done", 4)
    policy.on_request_finished((tuple(live),), set(live), set(), live_ctx)
    policy.mark_finished("done", keep_tokens=0)
    policy.on_request_finished((tuple(done),), set(done), set(), done_ctx)
    # LRU alone would evict the live agent's blocks (finished earlier).
    assert evicted(policy, 4) == set(done)
    assert policy.demoted_total == 4 and counted == [4]


@pytest.mark.unit  # vLLM's policy alone (the file's level is scheduler)
def test_without_a_mark_it_is_vllms_lru() -> None:
    ours, stock = FinishedFirstLRUCachePolicy(cache_capacity=64), LRUCachePolicy(cache_capacity=64)
    for policy in (ours, stock):
        live, live_ctx = store(policy, "live", 3)
        done, done_ctx = store(policy, "done", 3)
        policy.on_request_finished((tuple(live),), set(live), set(), live_ctx)
        policy.on_request_finished((tuple(done),), set(done), set(), done_ctx)
    assert evicted(ours, 3) == evicted(stock, 3) == set(live)


@pytest.mark.unit  # vLLM's policy alone (the file's level is scheduler)
def test_the_shared_prefix_keeps_its_place_and_a_follow_up_revives_the_rest() -> None:
    policy = FinishedFirstLRUCachePolicy(cache_capacity=64)
    live, live_ctx = store(policy, "live", 4)
    done, done_ctx = store(policy, "done", 4)
    policy.on_request_finished((tuple(live),), set(live), set(), live_ctx)
    # Its first two blocks were found cached (a system prompt): they stay.
    policy.mark_finished("done", keep_tokens=2 * BLOCK)
    policy.on_request_finished((tuple(done),), set(done), set(), done_ctx)
    assert evicted(policy, 2) == set(done[2:])
    # Next come the live agent's (LRU), not the shared prefix.
    assert evicted(policy, 4) == set(live)

    policy = FinishedFirstLRUCachePolicy(cache_capacity=64)
    live, live_ctx = store(policy, "live", 2)
    done, done_ctx = store(policy, "done", 2)
    policy.on_request_finished((tuple(live),), set(live), set(), live_ctx)
    policy.mark_finished("done", keep_tokens=0)
    policy.on_request_finished((tuple(done),), set(done), set(), done_ctx)
    policy.touch(done, ReqContext(req_id="follow-up"))  # the user did follow up: recent again
    assert evicted(policy, 2) == set(live)


@pytest.mark.unit  # vLLM's policy alone (the file's level is scheduler)
def test_marks_are_bounded_and_validated() -> None:
    policy = FinishedFirstLRUCachePolicy(cache_capacity=8)
    for i in range(MAX_MARKS + 10):
        policy.mark_finished(f"r{i}", 0)
    assert len(policy._marks) == MAX_MARKS and "r0" not in policy._marks
    with pytest.raises(ValueError, match="keep_tokens"):
        policy.mark_finished("r", -1)


def connector_with(policy: object) -> SimpleNamespace:
    return SimpleNamespace(connector_scheduler=SimpleNamespace(manager=SimpleNamespace(_policy=policy)))


@pytest.mark.unit  # vLLM's policy alone (the file's level is scheduler)
def test_installed_only_over_an_empty_stock_lru_policy() -> None:
    connector = connector_with(LRUCachePolicy(cache_capacity=32))
    installed = install_finished_first(connector)
    assert isinstance(installed, FinishedFirstLRUCachePolicy) and installed.cache_capacity == 32
    assert connector.connector_scheduler.manager._policy is installed
    assert install_finished_first(connector) is installed  # already ours (e.g. a second scheduler start)
    assert install_finished_first(connector_with(ARCCachePolicy(cache_capacity=32))) is None
    busy = LRUCachePolicy(cache_capacity=32)
    store(busy, "r", 1)
    assert install_finished_first(connector_with(busy)) is None
    assert install_finished_first(None) is None


# -- end to end: vLLM's scheduler, its OffloadingConnector, the plugin --------

POOL_BLOCKS = 1000  # 16k tokens on the GPU
# The host tier: 3 GiB of 8B's 128 KiB per token, ~24k tokens: three 8k contexts.
TIER_GIB = 3.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield write_config_dir(PROFILE, str(tmp_path_factory.mktemp("tier_order") / "model"))


def workload() -> list[SimJob]:
    # "live" (8k context) calls a 300 s tool at t~0; "done" (8k) runs two
    # turns and ends at t~12, after "live" finished its turn. Then two
    # agents (8k each) whose tools outlast the run's interesting part take
    # the 16k-token GPU pool (the ended job's blocks go first there, then
    # "live"'s, the oldest) and overflow the ~24k-token tier by one context:
    # LRU evicts the oldest finish there too, "live"'s.
    live = agent("live", 0.0, 8000, (300.0,))
    done = agent("done", 1.0, 8000, (10.0,))
    others = [agent(f"other{i}", 40.0 + 20.0 * i, 8000, (400.0,)) for i in range(2)]
    return [live, done, *others]


def run(model_dir: str, finished_first: bool):
    return run_native_tier(model_dir, workload(), POOL_BLOCKS, TIER_GIB,
                           [f"tier_finished_first={str(finished_first).lower()}"])


def returning(records):
    return next(t for t in records.turns if t.job_id == "live" and t.turn == 1)


def test_a_returning_agent_reloads_what_lru_would_have_evicted(model_dir: str) -> None:
    _, with_order = run(model_dir, finished_first=True)
    _, without = run(model_dir, finished_first=False)
    # Its 8k context is no longer on the GPU (the churn took the pool): with
    # the finished task's blocks going first, the tier still has it.
    assert returning(with_order).cached_tokens >= 8000
    assert returning(without).cached_tokens < 1000
    assert returning(with_order).prefill_tokens < returning(without).prefill_tokens - 7000
