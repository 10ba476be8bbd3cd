"""Prefetch: a job's context comes back from vLLM's native host tier before its tool returns.

End to end on vLLM's real scheduler with its native ``OffloadingConnector``
(the copies simulated on a virtual clock) through the simulator's replay
engine, whose ``run_arm`` asserts every KV block is free at the end; the
plan's timing and bounds on the plugin's real tool history.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from benchmarks.sim.jobs import SimJob
from benchmarks.sim.profiles import write_config_dir
from native_tier_rig import PROFILE, agent, run_native_tier
from vllm_continuum_plugin.clock import ManualClock
from vllm_continuum_plugin.estimators.ttl import ScopedToolHistory
from vllm_continuum_plugin.metadata import JobMetadata
from vllm_continuum_plugin.prefetch import GIVE_UP_QUANTILE, Prefetcher

POOL_BLOCKS = 1000  # 16k tokens on the GPU
TIER_GIB = 8.0  # ~64k tokens of 8B's 128 KiB per token: the tier keeps every context here
TOOL_S = 30.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield write_config_dir(PROFILE, str(tmp_path_factory.mktemp("prefetch") / "model"))


def workload() -> list[SimJob]:
    # "live" (8k context) calls a 30 s tool five times. While its fifth tool
    # runs (t ~ 120-150 s), "big" (12k context, one turn, then it ends)
    # takes the 16k-token pool: the prefix cache evicts most of "live"'s
    # context, which the tier keeps. "big" ends at once, so the pool has
    # room again long before "live"'s tool is back; its first four tools
    # taught the plugin that the tool takes 30 s.
    live = agent("live", 0.0, 8000, (TOOL_S,) * 5)
    big = agent("big", 125.0, 12000, ())
    return [live, big]


def run(model_dir: str, prefetch: bool):
    return run_native_tier(model_dir, workload(), POOL_BLOCKS, TIER_GIB,
                           [f"prefetch={str(prefetch).lower()}"])


def last_return(records):
    return max((t for t in records.turns if t.job_id == "live"), key=lambda t: t.turn)


def test_a_returning_turn_finds_its_context_loaded_before_it_arrives(model_dir: str) -> None:
    summary, with_prefetch = run(model_dir, prefetch=True)
    _, without = run(model_dir, prefetch=False)
    turn, stock = last_return(with_prefetch), last_return(without)
    # Without prefetching the turn waits for its context's load from the
    # tier on its critical path ...
    assert stock.load_wait_s > 0.0
    assert stock.cached_tokens >= 8000
    # ... with it, the context was on the GPU when the turn arrived: no load,
    # the whole context a prefix-cache hit, and an earlier first token.
    assert turn.load_wait_s == 0.0
    assert turn.cached_tokens >= 8000
    assert turn.ttft_s < stock.ttft_s
    # A prefetch computes nothing: the run prefilled no more than without.
    assert sum(t.prefill_tokens for t in with_prefetch.turns) <= sum(t.prefill_tokens for t in without.turns)
    assert with_prefetch.counters["pins_released"].get("handoff", 0) >= 1
    # The earlier returns found the context still on the GPU: their plans
    # were dropped without a load. One prefetch, of the evicted context.
    assert with_prefetch.counters["prefetches"] == {"started": 1, "loaded": 1, "failed": 0, "dropped": 0}
    assert without.counters["prefetches"]["started"] == 0


# -- the plan: when, how much, and what it holds -----------------------------

BLOCK = 16


def request(tokens: int, job: str = "j") -> SimpleNamespace:
    """What a plan reads of a finished request."""
    return SimpleNamespace(request_id=f"r-{job}", num_tokens=tokens, all_token_ids=list(range(tokens)),
                           block_hashes=[f"h{i}".encode() for i in range(tokens // BLOCK)])


def prefetcher(history: ScopedToolHistory, clock: ManualClock, reload_s: float = 0.5,
               max_bytes: int = 1 << 20) -> Prefetcher:
    sched = SimpleNamespace(block_size=BLOCK)
    pins = SimpleNamespace(get=lambda job_id: None)
    return Prefetcher(sched, pins, history, lambda tokens: reload_s, clock, quantile=0.5,  # type: ignore[arg-type]
                      max_bytes=max_bytes, reserve=0.1)


@pytest.mark.unit  # the plan alone (the file's level is scheduler)
def test_a_plan_is_due_before_the_tools_median_return_by_twice_the_reload() -> None:
    history, clock = ScopedToolHistory(), ManualClock()
    pf = prefetcher(history, clock, reload_s=0.5)
    meta = JobMetadata(job_id="j")
    assert not pf.plan(request(1600), meta, "pytest", 0.0)  # nothing measured: no plan
    for seconds in (10.0, 20.0, 30.0, 40.0, 50.0):
        history.record("pytest", seconds)
    assert pf.plan(request(1600), meta, "pytest", 0.0)
    start = clock.monotonic()
    assert pf.next_due() == pytest.approx(start + 30.0 - 2 * 0.5)  # the median, less twice the reload
    assert not pf.is_due()
    clock.advance(29.5)
    assert pf.is_due()
    plan = pf._plans["j"]
    assert plan.give_up_at == pytest.approx(start + 46.0)  # the tool's 90th percentile
    assert GIVE_UP_QUANTILE == 0.9
    assert len(plan.tokens) == 1600 and len(plan.block_hashes) == 100


@pytest.mark.unit
def test_a_tool_with_few_samples_uses_the_scopes_and_other_scopes_teach_nothing() -> None:
    history, clock = ScopedToolHistory(), ManualClock()
    pf = prefetcher(history, clock, reload_s=0.0)
    for seconds in (4.0, 4.0, 4.0, 4.0):
        history.record("grep", seconds, scope="a")
    history.record("pytest", 100.0, scope="a")
    assert pf.plan(request(160), JobMetadata(job_id="j", scope="a"), "pytest", 0.0)
    assert pf.next_due() == pytest.approx(clock.monotonic() + 4.0)  # the scope's median over every tool
    for seconds in (1.0,) * 8:
        history.record("pytest", seconds, scope="b")
    # Scope "c" measured nothing: another client's times make no plan for it.
    assert not pf.plan(request(160, "k"), JobMetadata(job_id="k", scope="c"), "pytest", 0.0)


@pytest.mark.unit
def test_plans_are_bounded_in_bytes_and_go_when_the_turn_arrives() -> None:
    history, clock = ScopedToolHistory(), ManualClock()
    for seconds in (10.0,) * 4:
        history.record("t", seconds)
    one = 1600 * 4 + 100 * 40  # tokens as int32, 40 bytes a hash
    pf = prefetcher(history, clock, max_bytes=2 * one)
    for job in ("a", "b", "c"):
        assert pf.plan(request(1600, job), JobMetadata(job_id=job), "t", 0.0)
    assert pf.plans == 2 and pf.plan_bytes == 2 * one <= pf.max_bytes
    assert set(pf._plans) == {"b", "c"}  # the oldest went first
    pf.on_arrival("b")
    assert set(pf._plans) == {"c"} and pf.plan_bytes == one
    assert not prefetcher(history, clock, max_bytes=one - 1).plan(request(1600), JobMetadata(job_id="j"), "t", 0.0)
    # Plans that come and go leave the due-time heap bounded.
    for i in range(500):
        pf.plan(request(16, f"x{i}"), JobMetadata(job_id=f"x{i}"), "t", 0.0)
        pf.on_arrival(f"x{i}")
    assert len(pf._due) <= 2 * pf.plans + 64
    pf.cancel_all()
    assert pf.plans == 0 and pf.plan_bytes == 0 and pf.next_due() is None


@pytest.mark.unit
@pytest.mark.parametrize("kwargs", [dict(quantile=0.0), dict(quantile=1.0), dict(max_bytes=-1),
                                    dict(reserve=1.0)])
def test_bad_settings_are_named(kwargs: dict) -> None:
    settings = dict(quantile=0.5, max_bytes=1, reserve=0.1) | kwargs
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        Prefetcher(SimpleNamespace(block_size=BLOCK), SimpleNamespace(), ScopedToolHistory(),  # type: ignore[arg-type]
                   lambda t: 0.0, ManualClock(), **settings)
