"""Part 2 of ``scheduler_overhead``: the cost of one TTL decision,
``CDFTTLPolicy.decide`` over a full ``ToolDurationHistory`` (``TTLWorkload``;
the method is in ``scheduler_overhead``'s docstring). Pure Python + numpy:
no vLLM.
"""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from vllm_continuum_plugin.estimators.history import ToolDurationHistory
from vllm_continuum_plugin.estimators.prefill import PrefillCostModel
from vllm_continuum_plugin.estimators.ttl import CDFTTLPolicy, TTLContext

from .timing import summarize_ns

__all__ = ["TOOL_KEY", "TTL_P99_TARGET_US", "TTLWorkload", "measure_ttl", "print_ttl_report"]

TTL_P99_TARGET_US = 50.0
TOOL_KEY = "bash"


@dataclass(frozen=True)
class TTLWorkload:
    samples: int = 4096
    decisions: int = 20000
    warmup: int = 1000
    lognormal_mu: float = 0.0
    lognormal_sigma: float = 1.0
    context_tokens: int = 2000
    queueing_delay_s: float = 1.5
    seed: int = 0


def measure_ttl(workload: TTLWorkload) -> dict[str, Any]:
    rng = np.random.default_rng(workload.seed)
    history = ToolDurationHistory(max_samples=workload.samples)
    for value in rng.lognormal(workload.lognormal_mu, workload.lognormal_sigma, workload.samples):
        history.record(TOOL_KEY, float(value))
    policy = CDFTTLPolicy(history, PrefillCostModel(), default_ttl_s=2.0, max_ttl_s=60.0, cold_start_samples=100)
    ctx = TTLContext(
        tool_key=TOOL_KEY,
        context_tokens=workload.context_tokens,
        queueing_delay_s=workload.queueing_delay_s,
        eta=1.0,
    )
    first = policy.decide(ctx)
    unchanged = _time_decide_unchanged(policy, ctx, workload)
    record_ns, decide_ns = _time_record_then_decide(policy, history, ctx, workload, rng)
    both = [a + b for a, b in zip(record_ns, decide_ns)]
    report = {
        "workload": asdict(workload),
        "samples_recorded": history.num_samples(TOOL_KEY),
        "decision": {"ttl_s": first.ttl_s, "source": first.source},
        "decide_unchanged_history": summarize_ns(unchanged),
        "record_new_sample": summarize_ns(record_ns),
        "decide_after_new_sample": summarize_ns(decide_ns),
        "record_plus_decide": summarize_ns(both),
        "target_p99_us": TTL_P99_TARGET_US,
    }
    report["pass"] = (
        report["decide_after_new_sample"]["p99_us"] <= TTL_P99_TARGET_US
        and report["decide_unchanged_history"]["p99_us"] <= TTL_P99_TARGET_US
    )
    return report


def _time_decide_unchanged(policy: CDFTTLPolicy, ctx: TTLContext, workload: TTLWorkload) -> list[int]:
    for _ in range(workload.warmup):
        policy.decide(ctx)
    timings: list[int] = []
    clock = time.perf_counter_ns
    gc.collect()
    for _ in range(workload.decisions):
        t0 = clock()
        policy.decide(ctx)
        timings.append(clock() - t0)
    return timings


def _time_record_then_decide(
    policy: CDFTTLPolicy,
    history: ToolDurationHistory,
    ctx: TTLContext,
    workload: TTLWorkload,
    rng: np.random.Generator,
) -> tuple[list[int], list[int]]:
    n = workload.warmup + workload.decisions
    new_samples = [float(v) for v in rng.lognormal(workload.lognormal_mu, workload.lognormal_sigma, n)]
    record_ns: list[int] = []
    decide_ns: list[int] = []
    clock = time.perf_counter_ns
    gc.collect()
    for i, value in enumerate(new_samples):
        t0 = clock()
        history.record(TOOL_KEY, value)
        t1 = clock()
        policy.decide(ctx)
        t2 = clock()
        if i >= workload.warmup:
            record_ns.append(t1 - t0)
            decide_ns.append(t2 - t1)
    return record_ns, decide_ns


def print_ttl_report(report: dict[str, Any]) -> None:
    d = report["decision"]
    print()
    print(
        f"TTL decision: CDFTTLPolicy over {report['samples_recorded']} samples of one tool "
        f"(decision: ttl {d['ttl_s']:.3f}s from '{d['source']}'), {report['decide_unchanged_history']['n']} timed calls"
    )
    print(f"  {'microseconds':<44}{'mean':>8}{'p50':>8}{'p99':>8}{'max':>9}")
    for key, label in (
        ("decide_unchanged_history", "(a) decide(), unchanged history"),
        ("record_new_sample", "(b) record() one new sample"),
        ("decide_after_new_sample", "(b) decide() after the new sample"),
        ("record_plus_decide", "(b) record() + decide()"),
    ):
        s = report[key]
        print(f"  {label:<44}{s['mean_us']:>8.1f}{s['p50_us']:>8.1f}{s['p99_us']:>8.1f}{s['max_us']:>9.1f}")
