"""A turn that fits is not kept waiting behind one at the head that cannot.

vLLM's waiting loop stops at the first request it cannot allocate, so a long
prompt at the head of the queue holds every turn behind it until that many
blocks are free. ``backfill`` passes such a request over for a bounded time
so that the requests behind it that fit run. Runs on vLLM's real scheduler
(with its native ``OffloadingConnector``, the copies simulated) through the
simulator's replay engine, on a virtual clock; ``run_arm`` asserts every KV
block is free at the end.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks import simulate
from benchmarks.sim.jobs import Segment, SimJob, SimTurn, stable_key
from benchmarks.sim.profiles import write_config_dir
from native_tier_rig import PROFILE, native_tier_arm, run_native_tier, sim_settings
from vllm_continuum_plugin.config import ContinuumConfig

BLOCKS = 1000  # 16k tokens


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield write_config_dir(PROFILE, str(tmp_path_factory.mktemp("backfill") / "model"))


def one_turn(name: str, arrival: float, prompt: int, out: int) -> SimJob:
    return SimJob(name, arrival, (SimTurn((Segment(stable_key(name), prompt),), out, 0.0, ""),))


def workload(smalls: int = 1) -> list[SimJob]:
    # Three long decodes (4.2k-token prompts, 1,000-token replies) hold ~80%
    # of the 16k-token pool for seconds. Then a 10k-token prompt arrives: it
    # cannot be allocated until two of them finish. Behind it, 1k-token
    # prompts that fit in the free blocks at once (one every 0.5 s).
    fills = [one_turn(f"fill{i}", 0.01 * i, 4200, 1000) for i in range(3)]
    big = one_turn("big", 1.0, 10_000, 20)
    small = [one_turn(f"small{i}", 1.1 + 0.5 * i, 1000, 20) for i in range(smalls)]
    return [*fills, big, *small]


def run(model_dir: str, jobs: list[SimJob], *settings: str):
    return run_native_tier(model_dir, jobs, BLOCKS, 16.0, ["backfill=\"with_tier\"", *settings])


def test_passes_are_counted_and_every_block_is_freed(model_dir: str) -> None:
    engine = simulate.build_engine(native_tier_arm(["backfill=\"with_tier\""]), workload(),
                                   sim_settings(model_dir, BLOCKS, 16.0))
    try:
        engine.run()
        free, usable = engine.free_blocks()
        assert free == usable
        # vllm_continuum:backfill_passes_total: the long prompt was passed over.
        assert engine.scheduler.continuum_metrics.snapshot()["backfill_passes"] > 0
        # Nothing remembered once nothing waits.
        assert engine.scheduler.backfill._since == engine.scheduler.backfill._hits == {}
    finally:
        engine.scheduler.shutdown()


def turn(records, job_id: str):
    return next(t for t in records.turns if t.job_id == job_id)


def test_a_turn_that_fits_runs_past_one_that_cannot(model_dir: str) -> None:
    summary, records = run(model_dir, workload())
    stock, stock_records = run(model_dir, workload(), "backfill=\"never\"")
    # Stock: the small turn waits behind the long prompt, which waits for
    # the long decodes to finish (seconds).
    assert turn(stock_records, "small0").queueing_s > 1.0
    # Backfilled: scheduled in the step after it arrives.
    assert turn(records, "small0").queueing_s < 0.1
    # The long prompt is not served later for it: it still runs as soon as
    # room frees (the small turn's 20-token reply is long done by then).
    assert turn(records, "big").first_token_s <= turn(stock_records, "big").first_token_s + 0.05
    assert summary.turns == stock.turns == len(workload())


def test_a_passed_over_request_blocks_again_after_max_defer_s(model_dir: str) -> None:
    # A stream of small turns behind the long prompt: each fits, but once the
    # long prompt has been passed over for max_defer_s it heads the queue as
    # in stock vLLM and the blocks that free up go to it.
    jobs = workload(smalls=40)
    _, bounded = run(model_dir, jobs, "backfill_max_defer_s=0.5")
    _, stock = run(model_dir, jobs, "backfill=\"never\"")
    big, big_stock = turn(bounded, "big"), turn(stock, "big")
    assert big.first_token_s <= big_stock.first_token_s + 0.5 + 0.1
    # Small turns that arrived while it was passed over ran before it.
    assert turn(bounded, "small0").first_token_s < big_stock.first_token_s
    # With max_defer_s 0 nothing is ever passed over: stock order.
    _, zero = run(model_dir, jobs, "backfill_max_defer_s=0")
    assert [t.first_token_s for t in zero.turns] == [t.first_token_s for t in stock.turns]


def test_backfill_is_opt_in(model_dir: str) -> None:
    # Off by default: the stock head-of-line order.
    _, default = run_native_tier(model_dir, workload(), BLOCKS, 16.0, [])
    _, never = run(model_dir, workload(), "backfill=\"never\"")
    assert turn(default, "small0").queueing_s == turn(never, "small0").queueing_s > 1.0
    assert ContinuumConfig().backfill == "never"


def test_backfill_setting_is_validated() -> None:
    with pytest.raises(ValueError, match="backfill='sometimes'"):
        ContinuumConfig(backfill="sometimes")
    with pytest.raises(ValueError, match="backfill_max_defer_s"):
        ContinuumConfig(backfill_max_defer_s=-1.0)
