"""Cost of the Continuum plugin on vLLM's scheduler hot path, measured in-process.

Targets (from the issue):

* one ``schedule()`` step with 2,000 waiting requests from 500 jobs and 500
  live pins costs at most 1.1x the stock scheduler's step;
* one TTL decision with 4,096 recorded samples costs at most 50 us at p99.

Part 1 -- scheduler step (``overhead_step``). Two real vLLM schedulers are
built with ``benchmarks/engine_rig.py`` on the same KV pool and limits: ``fcfs`` (vLLM's stock
``Scheduler``) and ``continuum`` (the plugin's ``ContinuumScheduler``, TTL
600 s, pin cap 100 % of the pool, cold start kept so every pin gets the
600 s default and none expires). Both go through the same setup:

1. 500 jobs run one short non-final turn each to completion, so the
   continuum scheduler holds 500 pins (the stock one holds the same blocks as
   cached free blocks);
2. 4 next turns per job are queued: 2,000 waiting requests that share their
   job's 64-token prefix.

Then both run the same loop of engine steps: ``schedule()``, a fake model
output (one sampled token per scheduled request, as the engine rig's),
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

Part 2 -- TTL decision (``overhead_ttl``). ``ToolDurationHistory(max_samples=4096)`` is filled
with 4,096 lognormal tool durations for one tool and ``CDFTTLPolicy.decide``
is timed (a) on an unchanged history (the sorted array cached) and (b) right
after each new recorded sample (one new tool time per turn, so the cache is
rebuilt each time); in (b) ``record`` and ``decide`` are timed separately.
The verdict requires p99 <= 50 us in both regimes ((b) is the realistic one).

Usage: ``python benchmarks/scheduler_overhead.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import numpy as np  # noqa: E402

# Absolute imports: this file also runs as a script (see Usage above).
from vllm_continuum_plugin.benchmarks.overhead_step import (  # noqa: E402
    POLICIES,
    STEP_RATIO_TARGET,
    SchedulerRig,
    StepSamples,
    StepWorkload,
    build_rigs,
    matched_ratio,
    measure_steps,
    print_step_report,
    profile_rig,
    step_report,
    turn_prompt,
)
from vllm_continuum_plugin.benchmarks.overhead_ttl import (  # noqa: E402
    TOOL_KEY,
    TTL_P99_TARGET_US,
    TTLWorkload,
    measure_ttl,
    print_ttl_report,
)
from vllm_continuum_plugin.benchmarks.timing import spread, summarize_ns  # noqa: E402

__all__ = [
    "POLICIES",
    "STEP_RATIO_TARGET",
    "TOOL_KEY",
    "TTL_P99_TARGET_US",
    "SchedulerRig",
    "StepSamples",
    "StepWorkload",
    "TTLWorkload",
    "build_rigs",
    "environment",
    "main",
    "matched_ratio",
    "measure_steps",
    "measure_ttl",
    "parse_args",
    "print_step_report",
    "print_ttl_report",
    "print_verdict",
    "profile_rig",
    "spread",
    "step_report",
    "summarize_ns",
    "turn_prompt",
    "workloads_from_args",
]


# ----------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------
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
