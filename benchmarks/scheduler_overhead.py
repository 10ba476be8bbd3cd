"""Cost of the Continuum plugin on vLLM's scheduler hot path, measured in-process.

Targets (from the issue):

* one ``schedule()`` step with 2,000 waiting requests from 500 jobs and 500
  live pins costs at most 1.1x the stock scheduler's step;
* one TTL decision with 4,096 recorded samples costs at most 50 us at p99.

Part 1 -- scheduler step. Two real vLLM schedulers are built with
``tests/harness.py`` on the same KV pool and limits: ``fcfs`` (vLLM's stock
``Scheduler``) and ``continuum`` (the plugin's ``ContinuumScheduler``, TTL
600 s, pin cap 100 % of the pool, cold start kept so every pin gets the
600 s default and none expires). Both go through the same setup:

1. 500 jobs run one short non-final turn each to completion, so the
   continuum scheduler holds 500 pins (the stock one holds the same blocks as
   cached free blocks);
2. 4 next turns per job are queued: 2,000 waiting requests that share their
   job's 64-token prefix.

Then both run the same loop of engine steps: ``schedule()``, a fake model
output (one sampled token per scheduled request, as the harness does),
``update_from_output()``, and -- untimed -- one new turn queued per request
admitted in that step (jobs in round-robin order, so the n-th request created
is the same for both policies), so each step starts with exactly 2,000
waiting and (for continuum) ~500 pins. The small batch
(``max_num_seqs`` 8, ``max_num_batched_tokens`` 512) admits a few requests
per step, the worst case for a per-step overhead ratio. After warm-up steps,
``--repeats`` blocks of ``--steps`` steps are timed per policy with
``time.perf_counter_ns`` (the two schedulers advance in turn, step by step,
so drift of the machine hits both alike; the plugin's metrics thread runs as
in a server's engine process). Reported per step: ``schedule()`` (median,
p90, p99, mean), ``update_from_output()``, their sum, and ``add_request()``
per request. A step's cost depends mostly on how many requests it admits, and the two
policies admit in different patterns, so the verdict compares steps of equal
admission work: the median ``schedule()`` time per number of admitted
requests, weighted by fcfs's share of such steps, continuum / fcfs (the raw
median and mean ratios are printed too).

Part 2 -- TTL decision. ``ToolDurationHistory(max_samples=4096)`` is filled
with 4,096 lognormal tool durations for one tool and ``CDFTTLPolicy.decide``
is timed (a) on an unchanged history (the sorted array cached) and (b) right
after each new recorded sample (one new tool time per turn, so the cache is
rebuilt each time); in (b) ``record`` and ``decide`` are timed separately.
The verdict requires p99 <= 50 us in both regimes ((b) is the realistic one).

Usage: ``python benchmarks/scheduler_overhead.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "tests" / "harness.py"
if not HARNESS.is_file():  # e.g. imported from an installed wheel
    raise ImportError(f"scheduler_overhead needs a repository checkout: {HARNESS} not found")
sys.path.insert(0, str(HARNESS.parent))

import numpy as np  # noqa: E402
from harness import make_request, make_scheduler, prompt_of  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from vllm_continuum_plugin.clock import SYSTEM_CLOCK  # noqa: E402
from vllm_continuum_plugin.estimators.history import ToolDurationHistory  # noqa: E402
from vllm_continuum_plugin.estimators.prefill import PrefillCostModel  # noqa: E402
from vllm_continuum_plugin.estimators.ttl import CDFTTLPolicy, TTLContext  # noqa: E402

STEP_RATIO_TARGET = 1.10
TTL_P99_TARGET_US = 50.0
POLICIES = ("fcfs", "continuum")
TOOL_KEY = "bash"


# ----------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------
@dataclass(frozen=True)
class StepWorkload:
    """Shape of the scheduler-step benchmark (identical for both policies)."""

    jobs: int = 500
    waiting_per_job: int = 4
    prefix_tokens: int = 64  # shared by all turns of a job (4 full blocks)
    turn_tokens: int = 32  # unique to each turn
    # Output lengths cycle through these (the n-th request created gets the
    # n-th value, identically for both policies), so requests finish at
    # different steps and admissions spread over the steps.
    max_tokens_cycle: tuple[int, ...] = (2, 5, 3, 4, 2, 6, 3, 5)
    num_blocks: int = 20000
    block_size: int = 16
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512
    max_model_len: int = 2048
    warmup_steps: int = 500
    steps: int = 1000
    repeats: int = 5

    def continuum_config(self) -> dict[str, Any]:
        # Long TTL, no cap, and cold start for the whole run: every pin lives
        # 600 s, so the pin count stays at ~jobs. (The CDF decision is timed
        # on its own in part 2.)
        return {
            "default_ttl_s": 600,
            "max_ttl_s": 600,
            "max_pinned_fraction": 1.0,
            "cold_start_samples": 10**9,
        }


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


# ----------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------
def summarize_ns(values_ns: Sequence[int]) -> dict[str, float]:
    """mean / p50 / p90 / p99 / max in microseconds."""
    if not values_ns:
        return {"n": 0, "mean_us": float("nan"), "p50_us": float("nan"),
                "p90_us": float("nan"), "p99_us": float("nan"), "max_us": float("nan")}
    us = np.asarray(values_ns, dtype=np.float64) / 1e3
    p50, p90, p99 = np.percentile(us, [50, 90, 99])
    return {
        "n": int(us.size),
        "mean_us": float(us.mean()),
        "p50_us": float(p50),
        "p90_us": float(p90),
        "p99_us": float(p99),
        "max_us": float(us.max()),
    }


def spread(values: Sequence[int]) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    return {"min": float(arr.min()), "mean": float(arr.mean()), "max": float(arr.max())}


# ----------------------------------------------------------------------
# Part 1: scheduler step
# ----------------------------------------------------------------------
def turn_prompt(workload: StepWorkload, job: int, turn: int) -> list[int]:
    """The job's shared prefix followed by tokens unique to this turn."""
    suffix = [5000 + turn] + [(job * 131 + turn * 17 + i) % 900 + 10 for i in range(workload.turn_tokens - 1)]
    return prompt_of(job, workload.prefix_tokens) + suffix


def fake_model_output(scheduler: Scheduler, output: SchedulerOutput, token: int = 7) -> ModelRunnerOutput:
    """What a model runner returns: one token per request whose prefill is done."""
    req_ids = list(output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for req_id in req_ids:
        request = scheduler.requests[req_id]
        sampled.append([token] if request.num_computed_tokens >= request.num_tokens else [])
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )


@dataclass
class StepSamples:
    """Per-step measurements of one policy."""

    schedule_ns: list[int] = field(default_factory=list)
    update_ns: list[int] = field(default_factory=list)
    add_request_ns: list[int] = field(default_factory=list)  # per request
    waiting: list[int] = field(default_factory=list)
    pins: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)


class SchedulerRig:
    """One real scheduler plus the job bookkeeping that keeps its queue full."""

    def __init__(self, policy: str, workload: StepWorkload) -> None:
        self.policy = policy
        self.workload = workload
        self.scheduler = make_scheduler(
            policy,
            num_blocks=workload.num_blocks,
            block_size=workload.block_size,
            max_num_seqs=workload.max_num_seqs,
            max_num_batched_tokens=workload.max_num_batched_tokens,
            max_model_len=workload.max_model_len,
            continuum=workload.continuum_config() if policy != "fcfs" else None,
            clock=SYSTEM_CLOCK,  # real time: the benchmark measures a server's behaviour
        )
        self._next_turn = [0] * workload.jobs
        self._created = 0
        self._refill = False  # queue a new turn for every admitted one (after fill())
        self._refill_job = 0  # next job to get a refill turn (round robin)

    # -- state ----------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting) + len(self.scheduler.kv_holding_waiting)

    @property
    def num_pins(self) -> int:
        pins = getattr(self.scheduler, "pins", None)
        return len(pins) if pins is not None else 0

    # -- requests -------------------------------------------------------
    def new_turn(self, job: int) -> Request:
        turn = self._next_turn[job]
        self._next_turn[job] = turn + 1
        cycle = self.workload.max_tokens_cycle
        max_tokens = cycle[self._created % len(cycle)]
        self._created += 1
        return make_request(
            turn_prompt(self.workload, job, turn),
            max_tokens=max_tokens,
            job_id=f"job{job}",
            is_last_step=False,
            block_size=self.workload.block_size,
        )

    def add_turn(self, job: int, timings: list[int] | None = None) -> Request:
        request = self.new_turn(job)
        t0 = time.perf_counter_ns()
        self.scheduler.add_request(request)
        if timings is not None:
            timings.append(time.perf_counter_ns() - t0)
        return request

    # -- phases ---------------------------------------------------------
    def prime(self) -> None:
        """One finished non-final turn per job (continuum: one pin per job)."""
        first = [self.add_turn(job) for job in range(self.workload.jobs)]
        for _ in range(100 * self.workload.jobs):
            self.step()
            if all(r.is_finished() for r in first):
                break
        else:
            raise RuntimeError(f"{self.policy}: first turns did not finish")

    def fill(self) -> None:
        """Queue ``waiting_per_job`` turns per job; from now on keep it full."""
        for _ in range(self.workload.waiting_per_job):
            for job in range(self.workload.jobs):
                self.add_turn(job)
        self._refill = True

    def step(self, samples: StepSamples | None = None) -> None:
        """One engine step; then (untimed) one new turn per admitted request."""
        scheduler = self.scheduler
        if samples is not None:
            samples.waiting.append(self.num_waiting)
            samples.pins.append(self.num_pins)
        t0 = time.perf_counter_ns()
        output = scheduler.schedule()
        t1 = time.perf_counter_ns()
        runner_output = fake_model_output(scheduler, output)
        t2 = time.perf_counter_ns()
        scheduler.update_from_output(output, runner_output)
        t3 = time.perf_counter_ns()
        if samples is not None:
            samples.schedule_ns.append(t1 - t0)
            samples.update_ns.append(t3 - t2)
            samples.running.append(len(output.num_scheduled_tokens))
            samples.admitted.append(len(output.scheduled_new_reqs))
        if not self._refill:
            return
        timings = samples.add_request_ns if samples is not None else None
        for _ in output.scheduled_new_reqs:
            self.add_turn(self._refill_job, timings)
            self._refill_job = (self._refill_job + 1) % self.workload.jobs


def build_rigs(workload: StepWorkload, log: Callable[[str], None]) -> dict[str, SchedulerRig]:
    rigs: dict[str, SchedulerRig] = {}
    for policy in POLICIES:
        t0 = time.perf_counter()
        rig = SchedulerRig(policy, workload)
        rig.prime()
        rig.fill()
        for _ in range(workload.warmup_steps):
            rig.step()
        log(
            f"  {policy:<9} ready in {time.perf_counter() - t0:5.1f}s: "
            f"waiting={rig.num_waiting} pins={rig.num_pins} running={len(rig.scheduler.running)}"
        )
        rigs[policy] = rig
    return rigs


def measure_steps(
    workload: StepWorkload, log: Callable[[str], None]
) -> tuple[dict[str, StepSamples], dict[str, SchedulerRig]]:
    """Time ``repeats`` blocks of ``steps`` steps per policy.

    The two schedulers advance step by step in turn (the order flips every
    block), so drift of the machine (frequency, neighbours) hits both alike.
    Returns the samples and the schedulers (for ``--profile``).
    """
    rigs = build_rigs(workload, log)
    samples = {policy: StepSamples() for policy in POLICIES}
    for rep in range(workload.repeats):
        order = POLICIES if rep % 2 == 0 else tuple(reversed(POLICIES))
        gc.collect()
        for _ in range(workload.steps):
            for policy in order:
                rigs[policy].step(samples[policy])
    return samples, rigs


def profile_rig(rig: SchedulerRig, steps: int) -> None:
    """cProfile ``steps`` engine steps; print the plugin's functions."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        rig.step()
    profiler.disable()
    print(f"\ncProfile of {steps} {rig.policy} steps (plugin functions, by cumulative time; "
          "cProfile inflates small calls):")
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("cumulative").print_stats(r"vllm_continuum_plugin|estimators|job_queue|pin_table", 30)


def matched_ratio(fcfs: StepSamples, cont: StepSamples, lo: int = 0, hi: int | None = None) -> float:
    """continuum / fcfs ``schedule()`` time for the same admission work.

    Steps are grouped by how many requests they admitted (the main driver of
    a step's cost); the median of each group is weighted by fcfs's share of
    such steps, so a different mix of busy and idle steps between the two
    policies does not count as overhead. ``lo:hi`` selects a range of steps.
    """
    f_times, f_adm = fcfs.schedule_ns[lo:hi], fcfs.admitted[lo:hi]
    c_times, c_adm = cont.schedule_ns[lo:hi], cont.admitted[lo:hi]
    num = den = 0.0
    for k in set(f_adm) & set(c_adm):
        f_k = [t for t, a in zip(f_times, f_adm) if a == k]
        c_k = [t for t, a in zip(c_times, c_adm) if a == k]
        weight = len(f_k)
        num += weight * float(np.median(c_k))
        den += weight * float(np.median(f_k))
    return num / den if den else float("nan")


def step_report(workload: StepWorkload, samples: dict[str, StepSamples]) -> dict[str, Any]:
    report: dict[str, Any] = {"workload": asdict(workload), "policies": {}}
    for policy, s in samples.items():
        total = [a + b for a, b in zip(s.schedule_ns, s.update_ns)]
        report["policies"][policy] = {
            "schedule": summarize_ns(s.schedule_ns),
            "update_from_output": summarize_ns(s.update_ns),
            "schedule_plus_update": summarize_ns(total),
            "add_request": summarize_ns(s.add_request_ns),
            "waiting_at_schedule": spread(s.waiting),
            "pins_at_schedule": spread(s.pins),
            "scheduled_per_step": spread(s.running),
            "admitted_per_step": spread(s.admitted),
        }
    fcfs, cont = report["policies"]["fcfs"], report["policies"]["continuum"]
    ratios: dict[str, float] = {}
    for part in ("schedule", "update_from_output", "schedule_plus_update", "add_request"):
        for stat in ("p50_us", "p90_us", "p99_us", "mean_us"):
            ratios[f"{part}.{stat}"] = cont[part][stat] / fcfs[part][stat]
    f_s, c_s = samples["fcfs"], samples["continuum"]
    ratios["schedule.matched_p50"] = matched_ratio(f_s, c_s)
    n = workload.steps
    report["ratios"] = ratios
    report["schedule_matched_ratio_per_block"] = [
        matched_ratio(f_s, c_s, i * n, (i + 1) * n) for i in range(workload.repeats)
    ]
    report["schedule_by_admitted"] = _schedule_by_admitted(samples)
    report["target_ratio"] = STEP_RATIO_TARGET
    report["pass"] = ratios["schedule.matched_p50"] <= STEP_RATIO_TARGET
    return report


def _schedule_by_admitted(samples: dict[str, StepSamples]) -> list[dict[str, Any]]:
    """Median ``schedule()`` per number of requests the step admitted."""
    rows: list[dict[str, Any]] = []
    counts = sorted(set(samples["fcfs"].admitted) | set(samples["continuum"].admitted))
    for admitted in counts:
        row: dict[str, Any] = {"admitted": admitted}
        for policy, s in samples.items():
            times = [t for t, a in zip(s.schedule_ns, s.admitted) if a == admitted]
            row[policy] = {"steps": len(times), "p50_us": float(np.median(times)) / 1e3 if times else None}
        rows.append(row)
    return rows


# ----------------------------------------------------------------------
# Part 2: TTL decision
# ----------------------------------------------------------------------
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


# ----------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------
LABEL_WIDTH = 44


def _row(label: str, fcfs: float, cont: float) -> str:
    return f"  {label:<{LABEL_WIDTH}}{fcfs:>13.1f}{cont:>12.1f}{cont / fcfs:>9.3f}x"


def print_step_report(report: dict[str, Any]) -> None:
    w = report["workload"]
    fcfs, cont = report["policies"]["fcfs"], report["policies"]["continuum"]
    print()
    print(
        f"Scheduler step: {w['jobs']} jobs, {w['jobs'] * w['waiting_per_job']} waiting requests, "
        f"continuum holding one pin per job"
    )
    print(
        f"  pool {w['num_blocks']} blocks x {w['block_size']} tokens, max_num_seqs {w['max_num_seqs']}, "
        f"max_num_batched_tokens {w['max_num_batched_tokens']}; {fcfs['schedule']['n']} timed steps per policy "
        f"({w['repeats']} blocks of {w['steps']} after {w['warmup_steps']} warm-up, policies interleaved step by step)"
    )
    print(f"  {'per step, microseconds':<{LABEL_WIDTH}}{'fcfs (stock)':>13}{'continuum':>12}{'ratio':>10}")
    for part, name in (
        ("schedule", "schedule()"),
        ("update_from_output", "update_from_output()"),
        ("schedule_plus_update", "schedule() + update_from_output()"),
    ):
        for stat, label in (("p50_us", "median"), ("p90_us", "p90"), ("p99_us", "p99"), ("mean_us", "mean")):
            print(_row(f"{name} {label}", fcfs[part][stat], cont[part][stat]))
    for stat, label in (("p50_us", "median"), ("p99_us", "p99")):
        print(_row(f"add_request() per request, {label}", fcfs["add_request"][stat], cont["add_request"][stat]))
    for row in report["schedule_by_admitted"]:
        f, c = row["fcfs"], row["continuum"]
        label = f"schedule() median, steps admitting {row['admitted']}"
        if f["steps"] and c["steps"]:
            print(_row(label, f["p50_us"], c["p50_us"]) + f"   ({f['steps']} / {c['steps']} steps)")
        else:
            print(f"  {label:<{LABEL_WIDTH}}{'-':>13}{'-':>12}{'':>10}   ({f['steps']} / {c['steps']} steps)")
    matched = report["ratios"]["schedule.matched_p50"]
    blocks = ", ".join(f"{r:.3f}" for r in report["schedule_matched_ratio_per_block"])
    print(f"  schedule() ratio at equal admissions (weighted medians): {matched:.3f}x; per block: {blocks}")
    print("  state at each timed schedule(), min / mean / max:")
    for key, label in (
        ("waiting_at_schedule", "waiting requests"),
        ("pins_at_schedule", "live pins"),
        ("scheduled_per_step", "requests scheduled"),
        ("admitted_per_step", "requests admitted"),
    ):
        cells = "    ".join(
            f"{policy} {s[key]['min']:.0f} / {s[key]['mean']:.1f} / {s[key]['max']:.0f}"
            for policy, s in report["policies"].items()
        )
        print(f"    {label:<20}{cells}")


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


def print_verdict(step: dict[str, Any] | None, ttl: dict[str, Any] | None) -> None:
    print()
    if step is not None:
        r = step["ratios"]
        verdict = "PASS" if step["pass"] else "MISS"
        print(
            f"{verdict}  schedule() step: continuum / stock = {r['schedule.matched_p50']:.3f}x at equal admissions "
            f"(target <= {STEP_RATIO_TARGET:.2f}x; raw median {r['schedule.p50_us']:.3f}x, "
            f"mean {r['schedule.mean_us']:.3f}x; schedule+update median {r['schedule_plus_update.p50_us']:.3f}x)"
        )
    if ttl is not None:
        verdict = "PASS" if ttl["pass"] else "MISS"
        print(
            f"{verdict}  TTL decision p99: {ttl['decide_after_new_sample']['p99_us']:.1f} us after a new sample, "
            f"{ttl['decide_unchanged_history']['p99_us']:.1f} us on an unchanged history "
            f"(target <= {TTL_P99_TARGET_US:.0f} us)"
        )


def _json_safe(value: Any) -> Any:
    """NaN/inf (no data) become null: strict JSON readers reject them."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def environment() -> dict[str, Any]:
    import vllm

    return {
        "python": platform.python_version(),
        "vllm": getattr(vllm, "__version__", "?"),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
    }


# ----------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="short run (smoke test): fewer steps and decisions")
    parser.add_argument("--repeats", type=int, default=None, help="timed blocks per policy (default 5; quick 2)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per block (default 1000; quick 150)")
    parser.add_argument(
        "--warmup-steps", type=int, default=None, help="untimed steps before timing (default 500; quick 50)"
    )
    parser.add_argument(
        "--decisions", type=int, default=None, help="timed TTL decisions per regime (default 20000; quick 3000)"
    )
    parser.add_argument("--jobs", type=int, default=500, help="jobs, each holding one pin (default 500)")
    parser.add_argument("--waiting-per-job", type=int, default=4, help="queued turns per job (default 4)")
    parser.add_argument("--max-num-seqs", type=int, default=8, help="scheduler max_num_seqs (default 8)")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=512, help="scheduler max_num_batched_tokens (default 512)"
    )
    parser.add_argument("--num-blocks", type=int, default=20000, help="KV pool size in blocks (default 20000)")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="STEPS",
        help="after timing, cProfile STEPS continuum steps and print the plugin's functions",
    )
    parser.add_argument("--only", choices=("step", "ttl"), default=None, help="run only one of the two parts")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write all figures to PATH")
    return parser.parse_args(argv)


def workloads_from_args(args: argparse.Namespace) -> tuple[StepWorkload, TTLWorkload]:
    quick = args.quick

    def pick(value: int | None, full: int, short: int) -> int:
        return value if value is not None else (short if quick else full)

    step = StepWorkload(
        jobs=args.jobs,
        waiting_per_job=args.waiting_per_job,
        num_blocks=args.num_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        warmup_steps=pick(args.warmup_steps, 500, 50),
        steps=pick(args.steps, 1000, 150),
        repeats=pick(args.repeats, 5, 2),
    )
    ttl = TTLWorkload(decisions=pick(args.decisions, 20000, 3000))
    return step, ttl


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    step_workload, ttl_workload = workloads_from_args(args)

    def log(message: str) -> None:
        print(message, flush=True)

    started = time.perf_counter()
    step_result: dict[str, Any] | None = None
    ttl_result: dict[str, Any] | None = None
    if args.only in (None, "step"):
        log("Building schedulers (prime 1 turn per job, queue the waiting turns, warm up)...")
        samples, rigs = measure_steps(step_workload, log)
        step_result = step_report(step_workload, samples)
        print_step_report(step_result)
        if args.profile > 0:
            profile_rig(rigs["continuum"], args.profile)
    if args.only in (None, "ttl"):
        ttl_result = measure_ttl(ttl_workload)
        print_ttl_report(ttl_result)
    print_verdict(step_result, ttl_result)
    elapsed = time.perf_counter() - started
    print(f"\n(total {elapsed:.0f}s)")
    if args.json is not None:
        payload = {
            "environment": environment(),
            "scheduler_step": step_result,
            "ttl_decision": ttl_result,
            "elapsed_s": elapsed,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(_json_safe(payload), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
