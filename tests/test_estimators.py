"""History, TTL rule and rebuild-cost model (pure logic)."""


import math

import numpy as np
import pytest

from vllm_continuum_plugin.estimators.history import (
    JobTracker,
    SlidingMean,
    ToolDurationHistory,
    TurnCountCorrelation,
)
from vllm_continuum_plugin.estimators.prefill import PrefillCostModel
from vllm_continuum_plugin.estimators.round_trip import RoundTripOverhead
from vllm_continuum_plugin.estimators.ttl import (
    CDFTTLPolicy,
    FixedTTLPolicy,
    PricedTTLPolicy,
    TTLContext,
    best_tau,
    make_ttl_policy,
)


def brute_force_tau(samples, benefit, max_ttl):
    best, best_score = 0.0, 0.0
    n = len(samples)
    for tau in samples:
        if tau > max_ttl:
            continue
        score = sum(s <= tau for s in samples) / n * benefit - tau
        if score > best_score + 1e-12:
            best, best_score = tau, score
    return best


@pytest.mark.parametrize("seed", range(5))
def test_best_tau_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    samples = np.sort(np.round(rng.lognormal(0, 1, 200), 2))
    for benefit in (0.5, 3.0, 20.0):
        assert best_tau(samples, benefit, 10.0) == pytest.approx(brute_force_tau(list(samples), benefit, 10.0))


@pytest.mark.parametrize("seed", range(4))
def test_best_tau_interval_is_exact_and_cached_decisions_equal_fresh_ones(seed):
    from vllm_continuum_plugin.estimators.ttl import best_tau_interval

    rng = np.random.default_rng(seed)
    samples = np.sort(np.round(rng.lognormal(0, 1, 300), 2))  # with ties
    for benefit in [0.0, -1.0, *rng.uniform(0.01, 40.0, 60)]:
        tau, lo, hi = best_tau_interval(samples, benefit, 10.0)
        assert tau == best_tau(samples, benefit, 10.0)
        assert lo <= benefit <= hi
        for probe in (lo, hi, (lo + hi) / 2, lo + (hi - lo) * 0.99):
            if math.isfinite(probe):
                assert best_tau(samples, probe, 10.0) == tau, (benefit, probe, lo, hi)
    # The policy's cache answers exactly what a fresh computation would,
    # across new samples and contexts of every size.
    h = ToolDurationHistory(max_samples=512)
    policy = CDFTTLPolicy(h, PrefillCostModel(1e-3), 2.0, 30.0, 50)
    for i in range(600):
        if i % 7 == 0:
            h.record("t", float(rng.lognormal(0, 1)))
        ctx = TTLContext("t", int(rng.integers(0, 20000)), float(rng.uniform(0, 5)), 1.0)
        if h.num_samples() < 50:
            continue
        benefit = ctx.queueing_delay_s + policy.prefill.seconds(ctx.context_tokens)
        assert policy.decide(ctx).ttl_s == best_tau(h.sorted_samples("t"), benefit, 30.0)


def test_best_tau_pins_fast_tools_and_skips_slow_ones():
    fast = np.sort(np.full(100, 0.2))
    slow = np.sort(np.full(100, 30.0))
    assert best_tau(fast, benefit_s=2.0, max_ttl_s=60) == pytest.approx(0.2)
    assert best_tau(slow, benefit_s=2.0, max_ttl_s=60) == 0.0  # waiting costs more than it saves
    assert best_tau(slow, benefit_s=2.0, max_ttl_s=10) == 0.0  # over the cap


def test_history_is_bounded_and_sorted():
    h = ToolDurationHistory(max_samples=5, max_tools=2)
    for v in [5, 1, 4, 2, 3, 0.5]:
        h.record("ls", v)
    assert list(h.sorted_samples("ls")) == [0.5, 1, 2, 3, 4]  # oldest (5) evicted
    h.record("cat", 1)
    h.record("git status", 1)  # evicts the least recently updated tool (ls)
    assert h.num_samples("ls") == 0 and h.tool_keys() == ["cat", "git status"]
    h.record("x", float("nan"))
    h.record("x", -1)
    assert h.num_samples("x") == 0


def test_cdf_policy_cold_start_then_global_then_per_tool():
    h = ToolDurationHistory()
    policy = CDFTTLPolicy(h, PrefillCostModel(1e-3), default_ttl_s=2.0, max_ttl_s=60, cold_start_samples=10)
    ctx = TTLContext(tool_key="ls", context_tokens=2000, queueing_delay_s=1.0, eta=1.0)
    assert policy.decide(ctx).source == "default"
    for _ in range(10):
        h.record("pytest", 0.5)
    d = policy.decide(ctx)
    assert d.source == "global" and d.ttl_s == pytest.approx(0.5)
    for _ in range(10):
        h.record("ls", 0.1)
    d = policy.decide(ctx)
    assert d.source == "tool" and d.ttl_s == pytest.approx(0.1)


def _priced_case(ttl_policy_cls):
    """An H100-like rebuild rate (30k prefill tokens/s), a pool of 27,040
    blocks of 16 tokens 90% full, tests of 6-10 s and a 20-minute tool."""
    h = ToolDurationHistory()
    rng = np.random.default_rng(0)
    for _ in range(100):
        h.record("pytest", float(rng.uniform(6.0, 10.0)))
        h.record("train", float(rng.uniform(1100.0, 1300.0)))
    policy = ttl_policy_cls(h, PrefillCostModel(1 / 30_000, 0.01), 2.0, 3600.0, 10)
    pool, usage = 27_040, 0.9

    def ctx(tool, tokens, used=usage):
        return TTLContext(tool, tokens, queueing_delay_s=0.0, eta=0.0, hold_price=tokens / 16 / pool * used)

    return policy, ctx


def test_priced_rule_holds_a_big_context_through_a_test_run_and_drops_a_chat_on_a_long_tool():
    policy, ctx = _priced_case(PricedTTLPolicy)
    # 120k tokens (4 s to rebuild, a quarter of the pool) waiting on a test:
    # held until the test has surely returned.
    held = policy.decide(ctx("pytest", 120_000))
    assert held.ttl_s >= 9.5 and held.source == "tool"
    # 2k tokens (0.08 s to rebuild) behind a 20-minute tool: not held, even
    # with a max TTL that would allow it.
    assert policy.decide(ctx("train", 2_000)).ttl_s == 0.0
    # An idle pool prices holding at nothing: hold up to the tool's return.
    assert policy.decide(ctx("train", 2_000, used=0.0)).ttl_s >= 1250.0


def test_paper_rule_charges_a_second_per_second_and_drops_the_big_context():
    """What ``priced`` fixes: the paper's rule weighs a held second against
    the rebuild as if the pin stalled the engine, so 4 s of rebuild never
    buys 8 s of holding."""
    policy, ctx = _priced_case(CDFTTLPolicy)
    assert policy.decide(ctx("pytest", 120_000)).ttl_s == 0.0
    assert make_ttl_policy(
        "priced", ToolDurationHistory(), PrefillCostModel(), default_ttl_s=2, max_ttl_s=60, fixed_ttl_s=2,
        cold_start_samples=1,
    ).name == "priced"


def test_fixed_policy_is_the_forks_rule():
    h = ToolDurationHistory()
    policy = FixedTTLPolicy(h, 2.0)
    ctx = TTLContext("pytest", 100, 0.0, 1.0)
    assert policy.decide(ctx).ttl_s == 2.0  # unknown tool counts as fast
    h.record("pytest", 5.0)
    assert policy.decide(ctx).ttl_s == 0.0
    with pytest.raises(ValueError, match="unknown ttl_policy 'nope'"):
        make_ttl_policy("nope", h, PrefillCostModel(), default_ttl_s=1, max_ttl_s=1, fixed_ttl_s=1, cold_start_samples=1)


def test_ttl_decision_cost_with_4096_samples():
    """Functional guard only; the timing target lives in benchmarks/."""
    h = ToolDurationHistory(max_samples=4096)
    rng = np.random.default_rng(0)
    for v in rng.lognormal(0, 1, 5000):
        h.record("pytest", float(v))
    policy = CDFTTLPolicy(h, PrefillCostModel(), 2.0, 60.0, 100)
    d = policy.decide(TTLContext("pytest", 3000, 2.0, 1.0))
    assert h.num_samples("pytest") == 4096 and d.source == "tool" and d.ttl_s > 0


def test_job_tracker_measures_tool_time_only_between_turns():
    jobs = JobTracker(max_jobs=2)
    _, measured, _ = jobs.on_arrival("a", 100.0)
    assert measured is None
    jobs.on_finish("a", 101.0, "ls", counted=True)
    _, measured, key = jobs.on_arrival("a", 101.5)
    assert measured == pytest.approx(0.5) and key == "ls"
    # Overlapping turn of the same job: not a tool gap (the fork crashed here).
    _, measured, _ = jobs.on_arrival("a", 101.6)
    assert measured is None and jobs.get("a").in_flight == 2
    # Aborted turns do not count as finished turns.
    jobs.on_finish("a", 102.0, None, counted=False)
    assert jobs.get("a").turns_finished == 1


def test_job_tracker_starts_a_new_activity_period_after_a_long_idle_gap():
    jobs = JobTracker(idle_reset_s=300.0)
    jobs.on_arrival("a", 100.0)
    jobs.on_finish("a", 110.0, "ls", counted=True)
    job, _, _ = jobs.on_arrival("a", 400.0)  # 290 s: the same period
    assert job.first_arrival == 100.0
    jobs.on_finish("a", 410.0, "ls", counted=True)
    job, measured, _ = jobs.on_arrival("a", 711.0)  # 301 s idle: ranks afresh
    assert measured == pytest.approx(301.0) and job.first_arrival == 711.0


def test_round_trip_overhead_cold_start_then_global_then_per_job():
    rt = RoundTripOverhead(default_s=2.0, min_global_samples=20, quantile=0.9)
    jobs = JobTracker()
    a, _, _ = jobs.on_arrival("a", 0.0)
    assert rt.margin(a) == 2.0 and rt.margin(None) == 2.0
    for i in range(20):  # other jobs' overheads: 0.1 .. 2.0 s
        other, _, _ = jobs.on_arrival(f"o{i}", 0.0)
        rt.observe(other, gap_s=0.1 * (i + 1) + 0.05, tool_s=0.05)
    assert rt.margin(a) == pytest.approx(1.8)  # the global 90th percentile
    for gap in (1.5, 1.6, 1.4):  # this job's client takes ~1.5 s per round trip
        rt.observe(a, gap_s=gap + 0.1, tool_s=0.1)
    assert rt.margin(a) == pytest.approx(1.6)  # its own largest recent overhead
    rt.observe(a, gap_s=125.0, tool_s=0.1)  # the "fast" tool took minutes: not overhead
    assert rt.margin(a) == pytest.approx(1.6)
    rt.observe(a, gap_s=0.0, tool_s=0.5)  # faster than expected: overhead 0, never negative
    assert min(a.overhead_samples) == 0.0
    with pytest.raises(ValueError, match="quantile"):
        RoundTripOverhead(quantile=0.0)


def test_round_trip_overhead_says_when_its_margin_is_measured():
    rt = RoundTripOverhead(default_s=2.5, min_job_samples=3, min_global_samples=20)
    jobs = JobTracker()
    a, _, _ = jobs.on_arrival("a", 0.0)
    # Before any sample margin() is the configured default, not a measurement.
    assert rt.margin(a) == 2.5 and not rt.is_measured(a) and not rt.is_measured(None)
    for _ in range(3):
        rt.observe(a, gap_s=3.1, tool_s=0.1)  # this client: 3 s per round trip
    assert rt.is_measured(a) and rt.margin(a) == pytest.approx(3.0)
    assert not rt.is_measured(None)  # 3 samples: not yet the server's
    for i in range(17):
        other, _, _ = jobs.on_arrival(f"o{i}", 0.0)
        rt.observe(other, gap_s=1.1, tool_s=0.1)
    assert rt.is_measured(None)


def _cold_ctx(**kwargs):
    return TTLContext(tool_key="never-seen", context_tokens=2000, queueing_delay_s=1.0, eta=1.0, **kwargs)


@pytest.mark.parametrize("policy_cls", [CDFTTLPolicy, PricedTTLPolicy])
def test_cold_start_ttl_covers_a_measured_round_trip(policy_cls):
    h = ToolDurationHistory()
    policy = policy_cls(h, PrefillCostModel(1e-3), default_ttl_s=2.0, max_ttl_s=60, cold_start_samples=100)
    # This job's (or the server's) measured client round trip: 3 s.
    d = policy.decide(_cold_ctx(round_trip_s=3.0, round_trip_measured=True))
    assert d.source == "default" and d.ttl_s >= 2.0 + 3.0
    assert d.ttl_s == pytest.approx(5.0)
    # Clamped by max_ttl_s.
    short = policy_cls(h, PrefillCostModel(1e-3), default_ttl_s=2.0, max_ttl_s=4.0, cold_start_samples=100)
    assert short.decide(_cold_ctx(round_trip_s=3.0, round_trip_measured=True)).ttl_s == 4.0


@pytest.mark.parametrize("policy_cls", [CDFTTLPolicy, PricedTTLPolicy])
def test_cold_start_ttl_is_the_default_until_a_round_trip_is_measured(policy_cls):
    h = ToolDurationHistory()
    policy = policy_cls(h, PrefillCostModel(1e-3), default_ttl_s=2.0, max_ttl_s=60, cold_start_samples=100)
    # What the scheduler passes before any measurement: margin() is
    # round_trip_default_s (2.5 s), not measured -> the default as before.
    rt = RoundTripOverhead(default_s=2.5)
    job, _, _ = JobTracker().on_arrival("a", 0.0)
    ctx = _cold_ctx(round_trip_s=rt.margin(job), round_trip_measured=rt.is_measured(job))
    assert policy.decide(ctx).ttl_s == 2.0
    assert policy.decide(_cold_ctx()).ttl_s == 2.0  # the context's defaults
    # A nonsensical margin adds nothing rather than poisoning the TTL.
    for bad in (float("nan"), float("inf"), -1.0):
        assert policy.decide(_cold_ctx(round_trip_s=bad, round_trip_measured=True)).ttl_s == 2.0


def test_cold_start_round_trip_is_not_added_to_ttls_from_measured_gaps():
    # A tool seen for the first time on a server with history uses the
    # global distribution of measured gaps, which hold the round trip.
    h = ToolDurationHistory()
    policy = CDFTTLPolicy(h, PrefillCostModel(1e-3), default_ttl_s=2.0, max_ttl_s=60, cold_start_samples=10)
    for _ in range(10):
        h.record("pytest", 0.5)
    d = policy.decide(_cold_ctx(round_trip_s=3.0, round_trip_measured=True))
    assert d.source == "global" and d.ttl_s == pytest.approx(0.5)


def test_job_tracker_evicts_idle_jobs_first():
    jobs = JobTracker(max_jobs=2)
    jobs.on_arrival("busy", 1.0)
    jobs.on_arrival("idle", 2.0)
    jobs.on_finish("idle", 3.0, "ls", counted=True)
    jobs.on_arrival("new", 4.0)
    assert jobs.get("idle") is None and jobs.get("busy") is not None and len(jobs) == 2


def test_eta_is_one_for_fixed_length_jobs_and_near_zero_when_memoryless():
    fixed = TurnCountCorrelation()
    for _ in range(50):
        fixed.add_job(8)
    assert fixed.eta() == pytest.approx(1.0)
    memoryless = TurnCountCorrelation(window=200_000)
    rng = np.random.default_rng(1)
    for n in rng.geometric(0.1, 5000):
        memoryless.add_job(int(n))
    assert memoryless.eta() < 0.1


def test_sliding_mean():
    m = SlidingMean(3)
    assert m.mean(7.0) == 7.0
    for v in [1, 2, 3, 10]:
        m.add(v)
    assert m.mean() == pytest.approx(5.0)


def test_prefill_model_default_then_fit():
    model = PrefillCostModel(default_seconds_per_token=1e-3, default_overhead_s=0.0, min_samples=4)
    assert model.seconds(1000) == pytest.approx(1.0)
    for tokens in (100, 500, 1000, 2000, 4000):
        model.observe(tokens, 0.05 + tokens * 2e-4)
    assert model.seconds(3000) == pytest.approx(0.05 + 0.6, rel=1e-6)


def test_tier_reload_model_prices_a_dropped_context_by_what_the_tier_served():
    from vllm_continuum_plugin.estimators.tier_reload import TierLoadTimer, TierReloadModel

    prefill = PrefillCostModel(1e-4, 0.0)  # 30k tokens: 3 s of prefill
    model = TierReloadModel(min_samples=4)
    timer = TierLoadTimer(model)
    # Unknown tier: no answer, the scheduler prices a prefill.
    assert model.rebuild_seconds(30_000, prefill.seconds) is None
    for i, tokens in enumerate((8_000, 16_000, 24_000, 32_000)):
        timer.start(f"r{i}", 10.0 * i, tokens)
        timer.start(f"r{i}", 10.0 * i + 5, tokens)  # seen again while waiting: the first start counts
        timer.finish(f"r{i}", 10.0 * i + tokens * 1e-5)  # 10x faster than prefill
    timer.start("failed", 0.0, 5_000)
    timer.finish("failed", 100.0, failed=True)  # a failed load measures nothing
    timer.start("gone", 0.0, 5_000)
    timer.forget("gone")
    assert len(timer) == 0
    assert model.rebuild_seconds(30_000, prefill.seconds) is None  # coverage not yet seen
    for _ in range(4):
        model.observe_return(missing_tokens=20_000, loaded_tokens=20_000)
    assert model.rebuild_seconds(30_000, prefill.seconds) == pytest.approx(0.3)
    # A tier that served half of what was missing: half reloaded, half prefilled.
    for _ in range(4):
        model.observe_return(missing_tokens=20_000, loaded_tokens=0)
    assert model.rebuild_seconds(30_000, prefill.seconds) == pytest.approx(0.15 + 1.5)
    model.observe_return(missing_tokens=0, loaded_tokens=100)  # nothing was missing: no sample
    assert len(model.coverage) == 8


def test_tier_coverage_is_weighted_by_tokens_so_tail_misses_do_not_price_a_drop_as_a_prefill() -> None:
    """Most returning turns miss only a short tail (the reply as the client
    re-rendered it) that no tier holds; one dropped 100k-token context the
    tier reloads whole must still price the next drop as a reload."""
    from vllm_continuum_plugin.estimators.tier_reload import TierReloadModel
    prefill = PrefillCostModel(1e-4, 0.0)
    model = TierReloadModel(min_samples=4)
    for i in range(4):
        model.observe_load(10_000 * (i + 1), 1e-5 * 10_000 * (i + 1))  # 10x faster than prefill
    for _ in range(9):
        model.observe_return(missing_tokens=300, loaded_tokens=0)
    model.observe_return(missing_tokens=100_000, loaded_tokens=100_000)
    assert model.coverage.share() == pytest.approx(100_000 / 102_700)
    rebuild = model.rebuild_seconds(100_000, prefill.seconds)
    assert rebuild is not None and rebuild < 0.2 * prefill.seconds(100_000)
    # Loaded tokens beyond what was missing are clamped: the share stays <= 1.
    model.observe_return(missing_tokens=10, loaded_tokens=1_000)
    assert model.coverage.share() <= 1.0


def test_token_coverage_window_drops_the_oldest_turn() -> None:
    from vllm_continuum_plugin.estimators.tier_reload import TokenCoverage
    coverage = TokenCoverage(window=2)
    assert coverage.share() == 0.0
    coverage.add(100, 0)
    coverage.add(100, 100)
    assert coverage.share() == pytest.approx(0.5)
    coverage.add(100, 100)  # the (100, 0) turn leaves
    assert coverage.share() == pytest.approx(1.0) and len(coverage) == 2
    with pytest.raises(ValueError, match="window"):
        TokenCoverage(window=0)
