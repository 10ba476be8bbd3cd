"""Part 1 of ``scheduler_overhead``: the cost of one ``schedule()`` step,
the plugin's scheduler against vLLM's stock one on the same workload
(``StepWorkload``; the method is in ``scheduler_overhead``'s docstring).

A ``SchedulerRig`` is one real scheduler (``engine_rig.make_scheduler``, on
the system clock) plus the job bookkeeping that keeps its queue full;
``measure_steps`` interleaves the two policies step by step;
``step_report`` / ``print_step_report`` turn the samples into figures.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from vllm.v1.request import Request

from vllm_continuum_plugin.clock import SYSTEM_CLOCK

from .engine_rig import fake_model_output, make_request, make_scheduler, prompt_of
from .timing import spread, summarize_ns

__all__ = [
    "POLICIES",
    "STEP_RATIO_TARGET",
    "SchedulerRig",
    "StepSamples",
    "StepWorkload",
    "build_rigs",
    "matched_ratio",
    "measure_steps",
    "print_step_report",
    "profile_rig",
    "step_report",
    "turn_prompt",
]

STEP_RATIO_TARGET = 1.10
POLICIES = ("fcfs", "continuum")


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


def turn_prompt(workload: StepWorkload, job: int, turn: int) -> list[int]:
    """The job's shared prefix followed by tokens unique to this turn."""
    suffix = [5000 + turn] + [(job * 131 + turn * 17 + i) % 900 + 10 for i in range(workload.turn_tokens - 1)]
    return prompt_of(job, workload.prefix_tokens) + suffix


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
