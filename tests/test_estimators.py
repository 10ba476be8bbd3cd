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
from vllm_continuum_plugin.estimators.prefill import PrefillCostModel, PrefillTimer
from vllm_continuum_plugin.estimators.round_trip import RoundTripOverhead
from vllm_continuum_plugin.estimators.ttl import (
    CDFTTLPolicy,
    FixedTTLPolicy,
    PricedTTLPolicy,
    TTLContext,
    best_tau,
    hold_price,
    make_ttl_policy,
    pool_pressure,
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
        # ``used``: the others' pressure on the rest of the pool.
        return TTLContext(tool, tokens, queueing_delay_s=0.0, eta=0.0, hold_price=hold_price(tokens / 16, pool, used))

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


# An 8B model on an H100, priced in GPU-seconds: 25k prefill tokens/s of
# linear work, and attention (b * n * (c + n / 2)) as large as the linear
# work at 100k tokens; a pool of 30,000 blocks of 16 tokens (480k tokens).
GPU_OVERHEAD_S, GPU_PER_TOKEN_S, GPU_PER_PAIR_S = 0.01, 4e-5, 8e-10
GPU_POOL_BLOCKS, GPU_BLOCK = 30_000, 16


def _gpu_prefill(quadratic: bool = True) -> PrefillCostModel:
    """A prefill model fitted to observed prefills of that GPU (exact
    samples, 200 to 16k new tokens on 0 to 60k cached)."""
    model = PrefillCostModel(quadratic=quadratic)
    rng = np.random.default_rng(1)
    for _ in range(200):
        n, c = int(rng.integers(200, 16_000)), int(rng.integers(0, 60_000))
        model.observe(n, GPU_OVERHEAD_S + GPU_PER_TOKEN_S * n + GPU_PER_PAIR_S * n * (c + n / 2), c)
    return model


def _gpu_ctx(tool: str, tokens: int, pressure: float) -> TTLContext:
    return TTLContext(tool, tokens, queueing_delay_s=0.0, eta=0.0,
                      hold_price=hold_price(tokens / GPU_BLOCK, GPU_POOL_BLOCKS, pressure))


def _history(**tools) -> ToolDurationHistory:
    h = ToolDurationHistory()
    for tool, samples in tools.items():
        for s in samples:
            h.record(tool, float(s))
    return h


def _lognormal_tool() -> ToolDurationHistory:
    """A test runner: median 4 s, a long tail (its longest of 400 runs ~46 s)."""
    return _history(pytest=np.random.default_rng(0).lognormal(math.log(4.0), 0.8, 400))


CONTEXTS = (8_000, 16_000, 32_000, 64_000, 128_000, 200_000)
PRESSURES = (0.1, 0.3, 0.5, 0.8, 1.0)


def test_hold_price_is_the_others_work_displaced_in_gpu_seconds():
    # A context alone in the pool (its own blocks are still allocated while
    # it is decided) displaces nothing; one among others pays its share.
    assert pool_pressure(used_blocks=3_000, pin_blocks=3_000, pool_blocks=30_000) == 0.0
    assert pool_pressure(used_blocks=30_000, pin_blocks=3_000, pool_blocks=30_000) == 1.0
    assert pool_pressure(used_blocks=16_500, pin_blocks=3_000, pool_blocks=30_000) == pytest.approx(0.5)
    assert pool_pressure(used_blocks=40_000, pin_blocks=40_000, pool_blocks=30_000) == 0.0
    assert pool_pressure(used_blocks=40_001, pin_blocks=40_000, pool_blocks=30_000) == 1.0
    # A tenth of the pool, half pressured, on an engine doing a GPU-second a
    # second: 0.05 GPU-seconds of other work per second held.
    assert hold_price(3_000, 30_000, 0.5) == pytest.approx(0.05)
    assert hold_price(3_000, 30_000, 0.5, work_rate_s=2.0) == pytest.approx(0.1)
    assert hold_price(0, 30_000, 1.0) == 0.0 and hold_price(3_000, 0, 1.0) == 0.0
    assert hold_price(60_000, 30_000, 1.0) == 1.0  # the share is at most the pool
    for bad in (float("nan"), float("inf"), -1.0):
        assert hold_price(3_000, 30_000, bad) == 0.0
        assert hold_price(3_000, 30_000, 0.5, work_rate_s=bad) == 0.0


def test_priced_ttl_grows_with_the_context_because_attention_makes_big_rebuilds_dearer():
    policy = PricedTTLPolicy(_lognormal_tool(), _gpu_prefill(), 2.0, 60.0, 100)
    for pressure in PRESSURES:
        ttls = [policy.decide(_gpu_ctx("pytest", tokens, pressure)).ttl_s for tokens in CONTEXTS]
        assert ttls == sorted(ttls), (pressure, ttls)
        assert ttls[-1] > ttls[0], (pressure, ttls)
    # Priced linearly, the context size cancels out: the rebuild and the
    # pool share both grow in proportion to it, so every size gets one TTL.
    linear = PricedTTLPolicy(_lognormal_tool(), PrefillCostModel(GPU_PER_TOKEN_S, 0.0), 2.0, 60.0, 100)
    assert len({linear.decide(_gpu_ctx("pytest", tokens, 0.8)).ttl_s for tokens in CONTEXTS}) == 1


def test_priced_ttl_falls_to_zero_as_the_others_fill_the_pool():
    policy = PricedTTLPolicy(_history(lint=np.random.default_rng(2).uniform(10.0, 30.0, 200)),
                             _gpu_prefill(), 2.0, 60.0, 100)
    ttls = [policy.decide(_gpu_ctx("lint", 16_000, pressure)).ttl_s for pressure in (0.0, *PRESSURES)]
    assert ttls == sorted(ttls, reverse=True)
    assert ttls[0] > 25.0 and ttls[-1] == 0.0  # idle: held through the tool; full: dropped
    # The same at every context size, long-tailed tool: never longer when fuller.
    tail = PricedTTLPolicy(_lognormal_tool(), _gpu_prefill(), 2.0, 60.0, 100)
    for tokens in CONTEXTS:
        ttls = [tail.decide(_gpu_ctx("pytest", tokens, pressure)).ttl_s for pressure in PRESSURES]
        assert ttls == sorted(ttls, reverse=True), (tokens, ttls)
        assert ttls[-1] < ttls[0]


def test_priced_ttl_follows_the_tools_time():
    rng = np.random.default_rng(3)
    h = _history(ls=rng.uniform(0.5, 1.5, 200), build=rng.uniform(200.0, 400.0, 200))
    # A cap far above the build's time: what drops it is the price.
    policy = PricedTTLPolicy(h, _gpu_prefill(), 2.0, 600.0, 100)
    short = policy.decide(_gpu_ctx("ls", 16_000, 0.8))
    assert short.source == "tool" and 1.0 <= short.ttl_s <= 1.5  # just past its returns
    assert policy.decide(_gpu_ctx("build", 16_000, 0.8)).ttl_s == 0.0
    # An almost idle pool prices minutes of holding below the rebuild.
    assert policy.decide(_gpu_ctx("build", 16_000, 0.05)).ttl_s > 300.0


def test_priced_ttl_is_not_pinned_at_the_cap():
    """Ordinary inputs (any context size, a pool 10-100% pressured, a
    long-tailed tool) give TTLs spread over the tool's times, strictly below
    ``max_ttl_s`` and below the tool's longest return within it."""
    history = _lognormal_tool()
    policy = PricedTTLPolicy(history, _gpu_prefill(), 2.0, 60.0, 100)
    longest = float(history.sorted_samples("pytest")[-1])
    assert longest < 60.0
    ttls = [policy.decide(_gpu_ctx("pytest", t, p)).ttl_s for t in CONTEXTS for p in PRESSURES]
    assert all(0.0 < ttl < longest for ttl in ttls)
    assert len(set(ttls)) >= 5


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
    assert not model.coefficients().fitted
    for tokens in (100, 500, 1000, 2000, 4000):
        model.observe(tokens, 0.05 + tokens * 2e-4)
    assert model.seconds(3000) == pytest.approx(0.05 + 0.6, rel=1e-6)
    assert model.coefficients().seconds_per_token_pair == 0.0  # linear data: no attention term


def test_prefill_model_fits_attention_and_prices_a_long_context_at_twice_the_linear_extrapolation():
    """Quadratic ground truth (an 8B model: attention equals the linear work
    at 100k tokens), 1% noise, prefills of up to 16k tokens on up to 60k
    cached: the fit recovers both coefficients, and 100k tokens from nothing
    cost ~2x the per-token price of short prefills times 100k."""
    rng = np.random.default_rng(7)
    model = PrefillCostModel()
    for _ in range(400):
        n, c = int(rng.integers(200, 16_000)), int(rng.integers(0, 60_000))
        truth = GPU_OVERHEAD_S + GPU_PER_TOKEN_S * n + GPU_PER_PAIR_S * n * (c + n / 2)
        model.observe(n, truth * (1.0 + 0.01 * rng.standard_normal()), c)
    fit = model.coefficients()
    assert fit.fitted and model.num_samples == 400
    assert fit.seconds_per_token == pytest.approx(GPU_PER_TOKEN_S, rel=0.05)
    assert fit.seconds_per_token_pair == pytest.approx(GPU_PER_PAIR_S, rel=0.05)
    linear_extrapolation = fit.overhead_s + fit.seconds_per_token * 100_000
    assert model.seconds(100_000) / linear_extrapolation == pytest.approx(2.0, rel=0.05)
    # Attention over the cached context: the same 1k new tokens cost about
    # twice as much on top of 60k cached ones as on an empty cache.
    assert model.seconds(1_000, cached=60_000) > 1.8 * model.seconds(1_000)


def test_prefill_model_falls_back_and_never_goes_negative():
    # Too few samples: the configured per-token price.
    model = PrefillCostModel(default_seconds_per_token=1e-4, default_overhead_s=0.0, min_samples=8)
    for _ in range(7):
        model.observe(1_000, 0.5)
    assert model.seconds(10_000) == pytest.approx(1.0)
    # Every prefill of one length: proportional, not a made-up curve.
    model.observe(1_000, 0.5)
    assert model.coefficients().fitted and model.seconds(10_000) == pytest.approx(5.0)
    # Longer prefills measured faster (noise, not physics): no negative
    # coefficient; and since no non-negative fit explains the times better
    # than their mean, the default.
    shrinking = PrefillCostModel(default_seconds_per_token=1e-4, default_overhead_s=0.0, min_samples=4)
    for n in (1_000, 2_000, 4_000, 8_000, 16_000):
        shrinking.observe(n, 2.0 - n * 1e-4)
    fit = shrinking.coefficients()
    assert min(fit.overhead_s, fit.seconds_per_token, fit.seconds_per_token_pair) >= 0.0
    assert shrinking.seconds(10_000) == pytest.approx(1.0)
    # Bounded window: the oldest samples leave.
    windowed = PrefillCostModel(window=4, min_samples=4, quadratic=False)
    for n in (1_000, 2_000, 3_000, 4_000):
        windowed.observe(n, n * 1e-3)
    for n in (1_000, 2_000, 3_000, 4_000):
        windowed.observe(n, n * 1e-5)
    assert windowed.num_samples == 4 and windowed.seconds(10_000) == pytest.approx(0.1)


def test_prefill_timer_passes_the_cached_tokens():
    observed = []

    class Recorder(PrefillCostModel):
        def observe(self, tokens: int, seconds: float, cached: int = 0) -> None:
            observed.append((tokens, seconds, cached))

    timer = PrefillTimer(Recorder())
    timer.start("r", 10.0, tokens=2_000, cached=30_000)
    timer.start("old", 10.0, tokens=500)  # a caller that passes no cache: 0
    waiting, running = type("R", (), {"num_output_tokens": 0})(), type("R", (), {"num_output_tokens": 1})()
    timer.observe({"r": running, "old": waiting}, now=10.5)
    assert observed == [(2_000, 0.5, 30_000)] and timer
    timer.observe({"r": running, "old": running}, now=11.0)
    assert observed[-1] == (500, 1.0, 0) and not timer


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


def test_a_tier_whose_loads_fit_no_positive_cost_is_not_priced_at_nothing() -> None:
    """Loads timed longer for fewer tokens fit no positive per-token cost:
    the model says nothing (the scheduler prices a prefill) instead of its
    zero defaults pricing every reload at 0 s."""
    from vllm_continuum_plugin.estimators.tier_reload import TierReloadModel

    prefill = PrefillCostModel(1e-4, 0.0)
    model = TierReloadModel(min_samples=4)
    for tokens, seconds in ((8_000, 0.4), (16_000, 0.3), (24_000, 0.2), (32_000, 0.1)):
        model.observe_load(tokens, seconds)
    for _ in range(4):
        model.observe_return(missing_tokens=20_000, loaded_tokens=20_000)
    assert not model.loads.coefficients().fitted
    assert model.rebuild_seconds(30_000, prefill.seconds) is None
    for tokens in (8_000, 16_000, 24_000, 32_000) * 4:  # the tier's real cost, measured at last
        model.observe_load(tokens, tokens * 1e-5)
    rebuild = model.rebuild_seconds(30_000, prefill.seconds)
    assert rebuild is not None and 0 < rebuild < prefill.seconds(30_000)
