"""Live replay of real Claude Code sessions through NVIDIA AIPerf, per policy.

Drives the kv-cache-tester Claude Code traces (``weka-trace`` format: one JSON
object per session, a ``requests`` list of API calls with input/output token
counts, 64-token prefix-block hash ids and the think time before each call)
through AIPerf against a real ``vllm serve`` -- one server per policy, the
same scaled traces for every arm -- and derives each session's job
completion time (JCT) from AIPerf's per-request records.

Scaling (a CPU cannot serve 15k-800k-token contexts in minutes)
----------------------------------------------------------------
``scale_session`` turns one recorded session into a small one, a pure
function of its arguments:

* the session's first ``--turns`` *main* requests (``type`` ``n``/``s`` of
  the session's first model); sub-agent entries and requests of other models
  (side calls) are dropped;
* prompts shrink by ``--merge M``: AIPerf fixes the block size of trace files
  at 64 tokens (the file's own ``block_size`` is overridden and
  ``--isl-block-size`` is refused for weka traces), so every M consecutive
  64-token hash blocks are merged into ONE 64-token block (a merged block
  gets a new id per distinct run of M ids, so prefix sharing between turns
  is kept at M-block granularity). That DIVIDES PROMPT TOKENS BY M
  (``in`` becomes ``full merged blocks * 64 + max(1, rest // M)``); the
  tool/system prefix is divided the same way;
* output tokens become ``min(--max-out, ceil(out / M))`` (at least 1): the
  served reply's length (sent as max_tokens, with ``ignore_eos`` so even a
  tiny model emits all of it) and the canned assistant block of the next
  prompt;
* think times (the tool/user gap before each request) become
  ``min(--max-think, think_time * --think-scale)``; timestamps are rebuilt
  from them (``t = previous t + previous api_time + think``).

The scaled traces are written into the run directory (``traces/``) as
weka-trace files AIPerf reads.

Each arm
--------
Starts ``vllm serve`` (the embedded SmolLM2-135M by default, in the
project's serving dtype, 32-token blocks -- the CPU backend needs a multiple
of 32 -- and a KV pool of ``--num-blocks``: by default half of the sessions'
peak working set, so sessions evict each other during think times and the
policies differ), warms it up, scrapes ``/metrics``, runs::

    aiperf profile --custom-dataset-type weka_trace --input-file RUN/traces
        --session-header X-Session-ID --no-fixed-schedule --use-think-time-only
        --concurrency N --conversation-num N --extra-inputs ignore_eos:true
        --request-rate 50 --arrival-pattern constant
        --streaming --tokenizer MODEL_DIR ...

(each session's next turn goes its think time after the previous reply, on
the next tick of AIPerf's 50-per-second clock, ``--request-rate``; without
one AIPerf's concurrency mode polls in a loop that keeps a CPU core busy for
the whole replay, the core the server's engine process shares on a 2-core
machine; ``--request-rate 0`` brings that mode back; the
session id -- AIPerf's per-session correlation id -- travels as
``X-Session-ID``, which the plugin takes as the job id), scrapes ``/metrics``
again and stops the server by its PID. AIPerf's weka replay sends canned
assistant text (the trace's hash blocks), not the live replies: the prompts
are deterministic, identical across arms.

From ``profile_export.jsonl``: per request TTFT and latency, per session
JCT = last request end - first request start (grouped by AIPerf's
``conversation_id``, its root before ``::`` for sub-agent children), and the
server's prefix-cache hit share (``vllm:prefix_cache_hits_total`` /
``vllm:prefix_cache_queries_total`` deltas over the arm). One summary line
per arm on stdout, ``results.json`` in the run directory, progress on stderr.
A replay into a run directory that already holds a ``results.json`` of the
same sessions, pool and machine keeps that file's other arms (each arm
records the commit it ran), so a run can be completed arm by arm; one of
another workload is refused.

The ``native-offload`` and ``continuum-native-offload`` arms run stock
scheduling and the plugin over vLLM's own CPU offloading
(``--kv-offloading-size``, backend ``native``: its ``OffloadingConnector``;
on the CPU platform through the plugin's ``CPUPlatformOffloadingSpec``),
with a host tier of ``--host-tier`` times the sessions' peak working set:
at the default 0.5, pool and tier together keep less than the sessions
need, as an undersized tier does (docs/capacity.md).

AIPerf lives in its own venv (``~/.venvs/vllm-continuum-aiperf``, override
with ``CONTINUUM_AIPERF_VENV`` or ``--aiperf``), pinned to aiperf==0.13.0.

On a GPU, the unscaled traces (printed by this tool with the run's values)::

    aiperf profile --model MODEL --url http://HOST:8000 --endpoint-type chat
        --streaming --tokenizer MODEL
        --custom-dataset-type weka_trace --input-file TRACE_DIR
        --session-header X-Session-ID --no-fixed-schedule --use-think-time-only
        --concurrency N --conversation-num N --extra-inputs ignore_eos:true
        --output-artifact-dir artifacts/POLICY

against ``vllm serve MODEL --scheduling-policy POLICY`` (add
``--max-context-length`` to drop sessions that outgrow the model). There
sub-agents and flattened agent chains become child conversations
(``conversation_id`` ``TRACE::sa:...`` / ``::fa:...`` / ``::aux:...``),
counted in their root session's JCT; ``--summarize artifacts/*`` prints
the per-arm lines for such runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .aiperf_results import (cache_hit_share, counter_deltas, format_summary, read_records, request_rows,
                             summarize_arm, summarize_paths)
from .aiperf_arms import LiveArm, parse_live_arms
from .aiperf_command import (AFFINITY_ENV, AIPERF_VERSION, DEFAULT_AIPERF_VENV, aiperf_command, aiperf_version,
                             gpu_command, last_line, log, run_aiperf)
from .aiperf_traces import peak_tokens, scale_session, select_sessions, write_traces

__all__ = [
    "DEFAULT_REQUEST_RATE",
    "Plan",
    "build_parser",
    "main",
    "plan_run",
    "request_rate",
    "run_arm",
    "server_env",
]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TRACES = os.path.join(REPO, "benchmarks", "data", "claude_code_traces")
DEFAULT_MODEL_DIR = os.path.join(
    os.environ.get("CONTINUUM_MODELS", os.path.expanduser("~/.cache/vllm-continuum/models")),
    "smollm2-135m-instruct",
)
# vLLM's CPU backend needs a block size that is a multiple of 32.
SERVER_BLOCK = 32
# Chat-template and re-tokenisation slack per request, in tokens.
TEMPLATE_SLACK = 256
# AIPerf's turn clock (``--request-rate``), turns per second: far above the
# replays' few turns per second, so a due turn waits at most a tick (20 ms).
DEFAULT_REQUEST_RATE = 50.0


# ----------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------
@dataclass
class Plan:
    """What every arm replays: scaled sessions and the server's sizing."""

    sessions: list[dict[str, Any]]
    sources: list[str]
    num_blocks: int
    max_model_len: int
    # The oracle's pool: every session's peak context at once, plus the
    # blocks no later prompt holds (each turn's rebuilt tail and its served
    # reply, a few blocks a turn), so nothing is ever evicted.
    oracle_blocks: int = 0

    def turns(self) -> dict[str, int]:
        return {s["id"]: len(s["requests"]) for s in self.sessions}


def plan_run(args: argparse.Namespace) -> Plan:
    chosen = select_sessions(args.traces, sessions=args.sessions, turns=args.turns, min_turns=args.min_turns,
                             max_input=args.max_input, ids=args.session_ids)
    if not chosen:
        raise SystemExit(f"no session in {args.traces} fits (--turns {args.turns}, --min-turns {args.min_turns}, "
                         f"--max-input {args.max_input})")
    sessions = [scale_session(t, turns=args.turns, merge=args.merge, max_out=args.max_out,
                              max_think=args.max_think, think_scale=args.think_scale) for _, t in chosen]
    peaks = [peak_tokens(s) for s in sessions]
    max_model_len = args.max_model_len or math.ceil((max(peaks) + TEMPLATE_SLACK) / 256) * 256
    # Auto pool: half the sessions' peak working set (each session's largest
    # prompt + reply, chat-template slack included), but room for the largest
    # request one and a half times over.
    per_session = [math.ceil((p + TEMPLATE_SLACK) / SERVER_BLOCK) for p in peaks]
    num_blocks = args.num_blocks or max(math.ceil(sum(per_session) / 2),
                                        math.ceil(1.5 * max_model_len / SERVER_BLOCK))
    oracle_blocks = sum(per_session) + 3 * sum(len(s["requests"]) for s in sessions) + 64
    return Plan(sessions, [p for p, _ in chosen], num_blocks, max_model_len, max(num_blocks, oracle_blocks))


def request_rate(args: argparse.Namespace) -> float | None:
    """AIPerf's turn clock for ``args`` (None: its concurrency mode, for
    ``--request-rate 0``); a negative or non-finite rate is an error.
    ``main`` stores the answer back in ``args.request_rate``."""
    rate = args.request_rate
    if rate is None:  # already normalised: concurrency mode
        return None
    if not math.isfinite(rate) or rate < 0:
        raise ValueError(f"--request-rate must be >= 0 turns per second, got {rate!r}")
    return rate or None


def arm_pool(arm: LiveArm, plan: Plan) -> int:
    """The arm's KV pool in blocks: the run's, or for the oracle room for
    every session's peak context at once (nothing is ever evicted)."""
    return plan.oracle_blocks if arm.unbounded_pool else plan.num_blocks


def host_tier_blocks(args: argparse.Namespace, plan: Plan) -> int:
    """The offload arms' host tier in 32-token blocks: ``--host-tier``
    times the sessions' peak working set (the oracle's pool)."""
    return max(1, round(args.host_tier * plan.oracle_blocks))


def server_args(args: argparse.Namespace, arm: LiveArm, plan: Plan) -> list[str]:
    from .dtype import dtype_bytes

    num_blocks = arm_pool(arm, plan)
    kv_per_token = 2 * 30 * 3 * 64 * dtype_bytes(args.dtype)  # SmolLM2-135M: 30 layers, 3 KV heads x 64
    kv_bytes = max(400_000_000, 2 * num_blocks * SERVER_BLOCK * kv_per_token)
    extra = []
    settings = {**(json.loads(args.continuum_config) if args.continuum_config else {}), **arm.continuum}
    if settings and arm.policy != "fcfs":
        extra = ["--additional-config", json.dumps({"continuum": settings})]
    if arm.native_offload:
        from .ab_benchmark import native_offload_args

        extra += native_offload_args(host_tier_blocks(args, plan) * SERVER_BLOCK * kv_per_token)
    elif arm.plugin_offload:
        from .ab_benchmark import offload_args

        extra += offload_args(host_tier_blocks(args, plan) * SERVER_BLOCK * kv_per_token,
                              store_mode=arm.plugin_offload)
    return [
        "--scheduling-policy", arm.policy,
        "--block-size", str(SERVER_BLOCK),
        "--num-gpu-blocks-override", str(num_blocks),
        "--kv-cache-memory-bytes", str(kv_bytes),
        "--max-model-len", str(plan.max_model_len),
        "--enforce-eager",
        # Per-request cached tokens in the usage AIPerf records.
        "--enable-prompt-tokens-details",
        "--dtype", args.dtype,
        *extra,
        *args.server_arg,
    ]


def warm_up(url: str, model: str, lengths: Sequence[int]) -> None:
    """One-off CPU kernel set-up costs, paid before the measurement (unique
    prompts: nothing they leave in the prefix cache matches a trace)."""
    import random

    import requests

    rng = random.Random(1234)
    for n in lengths:
        prompt = " ".join(f"warm{rng.randrange(10**6)}" for _ in range(max(1, n // 4)))
        requests.post(url + "/v1/completions", timeout=600,
                      json={"model": model, "prompt": prompt, "max_tokens": 4, "ignore_eos": True})


def server_env(max_think_s: float, think_scale: float) -> dict[str, str]:
    """The server's environment for a replay whose sessions think up to
    ``max_think_s * think_scale`` seconds between turns.

    AIPerf keeps one keep-alive connection per session and reuses it after
    the think time; uvicorn closes an idle connection after vLLM's
    ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` (5 s by default), so a think time near
    5 s races the close and the next turn fails within a millisecond with
    ``ClientOSError: Connection reset by peer`` (a few per arm, in every arm,
    before this). The keep-alive outlasts the longest think time.
    """
    keep_alive_s = max(60, int(math.ceil(4 * max_think_s * think_scale)))
    return {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": str(keep_alive_s)}


def run_arm(args: argparse.Namespace, arm: LiveArm, plan: Plan, traces: str, run_dir: str,
            aiperf: str) -> dict[str, Any]:
    from .server import VLLMServer

    policy = arm.name  # what the arm is reported as
    arm_dir = os.path.join(run_dir, policy)
    os.makedirs(arm_dir, exist_ok=True)
    t0 = time.monotonic()
    server = VLLMServer(args.model, server_args(args, arm, plan), served_name=args.served_name,
                        env=server_env(args.max_think, args.think_scale),
                        startup_timeout_s=args.startup_timeout, dtype=args.dtype,
                        on_wait=lambda s, srv: log(f"  [{policy}] server starting {s:.0f}s: {srv.last_log_line()}"),
                        wait_report_s=20.0)
    log(f"[{policy}] starting vllm serve --scheduling-policy {arm.policy} (pool {arm_pool(arm, plan)} x "
        f"{SERVER_BLOCK}-token blocks, session header {arm.session_source}, "
        f"max-model-len {plan.max_model_len}, {args.dtype})")
    try:
        server.start()
        log(f"[{policy}] server up on {server.url} (pid {server.proc.pid}) in {time.monotonic() - t0:.0f}s; warming up")
        warm_up(server.url, args.served_name, (64, min(1024, plan.max_model_len // 2)))
        before = server.metrics()
        cmd = aiperf_command(aiperf, url=server.url, model=args.served_name, tokenizer=args.tokenizer or args.model,
                             traces=traces, sessions=len(plan.sessions), out_dir=os.path.join(arm_dir, "aiperf"),
                             concurrency=args.concurrency, ramp_s=args.ramp, seed=args.seed,
                             timeout_s=args.arm_timeout, session_header=arm.session_header,
                             request_rate=args.request_rate)
        with open(os.path.join(arm_dir, "aiperf_command.txt"), "w") as f:
            f.write(shlex.join(cmd) + "\n")
        log(f"[{policy}] {shlex.join(cmd)}")
        t1 = time.monotonic()
        rc = run_aiperf(cmd, os.path.join(arm_dir, "aiperf.log"), args.arm_timeout,
                        records_path=os.path.join(arm_dir, "aiperf", "profile_export.jsonl"),
                        expected=sum(plan.turns().values()), affinity_header=arm.affinity_header)
        wall = time.monotonic() - t1
        after = server.metrics()
    finally:
        server.stop()
        try:
            with open(server.log_path, "rb") as fin, open(os.path.join(arm_dir, "server.log"), "wb") as fout:
                fout.write(fin.read())
        except OSError:
            pass
    records_path = os.path.join(arm_dir, "aiperf", "profile_export.jsonl")
    if rc != 0 or not os.path.exists(records_path):
        raise RuntimeError(f"[{policy}] aiperf exited with {rc}; see {os.path.join(arm_dir, 'aiperf.log')}:\n"
                           f"{last_line(os.path.join(arm_dir, 'aiperf.log'), 400)}")
    records = read_records(records_path)
    summary = summarize_arm(policy, records, cache_hit_share(before, after))
    expected = plan.turns()
    done = {k: v["requests"] - v["failed"] for k, v in summary["per_session"].items()}
    summary["incomplete_sessions"] = sorted(k for k, n in expected.items() if done.get(k, 0) < n)
    summary["aiperf_wall_s"] = wall
    summary["arm"] = {"policy": arm.policy, "continuum": dict(arm.continuum), "num_blocks": arm_pool(arm, plan),
                      "session_header": arm.session_header, "affinity_header": arm.affinity_header,
                      "host_tier_blocks": host_tier_blocks(args, plan) if arm.host_tier else 0}
    summary["server_counters"] = counter_deltas(before, after)
    summary["requests_detail"] = request_rows(records)
    return summary


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.aiperf_replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", default=DEFAULT_TRACES,
                   help="directory of kv-cache-tester Claude Code trace files (default: %(default)s)")
    p.add_argument("--policies", default="fcfs,continuum,context_serve",
                   help="comma-separated arms, one server each: a --scheduling-policy value, or continuum-paper, "
                        "oracle, native-offload, continuum-native-offload, POLICY-claude-header, "
                        "POLICY-no-header (benchmarks/aiperf_arms.py) "
                        "(default: %(default)s)")
    p.add_argument("--sessions", type=int, default=4, help="sessions to replay (default: %(default)s)")
    p.add_argument("--session-ids", default="",
                   help="comma-separated trace ids / file stems to replay instead of the first --sessions")
    p.add_argument("--turns", type=int, default=6, help="first K main turns of each session (default: %(default)s)")
    p.add_argument("--min-turns", type=int, default=2,
                   help="skip sessions with fewer main turns (default: %(default)s)")
    p.add_argument("--max-input", type=int, default=24000,
                   help="skip sessions whose first --turns prompts exceed this many RECORDED tokens "
                        "(default: %(default)s; 0: no limit)")
    p.add_argument("--merge", type=int, default=16,
                   help="merge every M consecutive 64-token hash blocks into one 64-token block: "
                        "AIPerf fixes the block size of trace files at 64, so this DIVIDES PROMPT "
                        "TOKENS BY M (default: %(default)s; 1 = unscaled prompts)")
    p.add_argument("--max-out", type=int, default=32,
                   help="output tokens per request: min(this, ceil(recorded out / M)) (default: %(default)s)")
    p.add_argument("--max-think", type=float, default=5.0,
                   help="cap on each think time (tool + user gap before a request), seconds "
                        "(default: %(default)s)")
    p.add_argument("--think-scale", type=float, default=1.0,
                   help="multiplies recorded think times before the cap (default: %(default)s)")
    p.add_argument("--concurrency", type=int, default=None,
                   help="AIPerf session concurrency (default: all sessions at once)")
    p.add_argument("--ramp", type=float, default=None,
                   help="AIPerf --concurrency-ramp-duration, seconds (default: none, all sessions start together)")
    p.add_argument("--request-rate", type=float, default=DEFAULT_REQUEST_RATE,
                   help="AIPerf issues due turns on a constant clock of this many per second "
                        "(--request-rate R --arrival-pattern constant), so its timing loop sleeps between "
                        "ticks; 0: AIPerf's concurrency mode, whose loop keeps a CPU core busy all run "
                        "(default: %(default)s)")
    p.add_argument("--model", default=DEFAULT_MODEL_DIR, help="model directory (default: embedded SmolLM2-135M)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory for AIPerf (default: --model)")
    p.add_argument("--served-name", default="smollm2", help="served model name (default: %(default)s)")
    p.add_argument("--dtype", default=None,
                   help="server dtype (default: the project's serving_dtype(): bf16 only where native, else fp32)")
    p.add_argument("--num-blocks", type=int, default=0,
                   help="KV pool in 32-token blocks, the same for every arm (default 0 = auto: half the "
                        "sessions' peak working set, at least 1.5 x the largest request)")
    p.add_argument("--host-tier", type=float, default=0.5,
                   help="host tier of the offload arms (vLLM's OffloadingConnector, the plugin's connector), "
                        "as a share of the "
                        "sessions' peak working set (default: %(default)s: with the pool, less than the "
                        "working set, so the tier overflows as an undersized one does)")
    p.add_argument("--max-model-len", type=int, default=0,
                   help="(default 0 = auto: the largest scaled request + 256, rounded up to 256)")
    p.add_argument("--continuum-config", default=None,
                   help="JSON of plugin settings for the non-fcfs arms (--additional-config "
                        "'{\"continuum\": ...}'), e.g. '{\"default_ttl_s\": 10}'")
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra vllm serve argument for every arm (repeatable), e.g. --server-arg=--max-num-seqs=8")
    p.add_argument("--aiperf", default=os.path.join(DEFAULT_AIPERF_VENV, "bin", "aiperf"),
                   help="aiperf executable (default: %(default)s; CONTINUUM_AIPERF_VENV)")
    p.add_argument("--seed", type=int, default=0, help="AIPerf --random-seed (default: %(default)s)")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="server start timeout, s (default: %(default)s)")
    p.add_argument("--arm-timeout", type=float, default=1800.0, help="AIPerf timeout per arm, s (default: %(default)s)")
    p.add_argument("--out", default=None,
                   help="run directory (default: results/aiperf_replay/YYYYmmdd-HHMMSS)")
    p.add_argument("--dry-run", action="store_true",
                   help="write the scaled traces, print the commands, start nothing")
    p.add_argument("--summarize", nargs="+", metavar="PATH",
                   help="only summarise existing AIPerf runs (an artifact dir or its profile_export.jsonl, "
                        "e.g. a GPU run of the command above), one line each, and exit")
    return p


def _commit() -> str | None:
    """The project's git commit the arms ran (None outside a checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


# What must match for two replays' arms to share one results.json: the same
# sessions (sizes, turns, think times) over the same pool on the same CPU.
_SAME_RUN_KEYS = ("cpu", "dtype", "aiperf_version", "num_blocks", "block_size", "max_model_len", "sessions",
                  "aiperf_request_rate")


def previous_arms(path: str, results: Mapping[str, Any], names: set[str]) -> list[dict[str, Any]]:
    """The arms of an earlier replay into the same run directory that this
    one keeps: every arm not named again and not failed, so a run can be
    completed arm by arm (a later arm records its own ``commit``). Raises
    ValueError naming the first difference when the earlier replay ran
    another workload, pool or machine: its arms would not compare."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        old = json.load(f)
    for key in _SAME_RUN_KEYS:
        if old.get(key) != results.get(key):
            raise ValueError(f"{path} holds a replay with another {key!r} ({str(old.get(key))[:80]} != "
                             f"{str(results.get(key))[:80]}); pick another --out")
    kept = []
    for arm in old.get("arms", []):
        if arm.get("policy") in names or "error" in arm:
            continue
        arm.setdefault("commit", old.get("commit"))
        kept.append(arm)
    return kept


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    from .dtype import cpu_name, serving_dtype

    args = build_parser().parse_args(argv)
    # A SIGTERM (a timeout, a report stopping its runs) unwinds like Ctrl-C,
    # so each arm's `finally` stops its server and AIPerf by their PIDs.
    import signal

    signal.signal(signal.SIGTERM, _interrupted)
    if args.summarize:
        return summarize_paths(args.summarize)
    args.session_ids = [s.strip() for s in args.session_ids.split(",") if s.strip()]
    args.max_input = args.max_input or None
    args.dtype = args.dtype or serving_dtype()
    try:
        arms = parse_live_arms(args.policies)
    except ValueError as e:
        print(f"--policies: {e}", file=sys.stderr)
        return 2
    try:
        args.request_rate = request_rate(args)  # from here on: turns per second, or None
    except ValueError as e:
        print(str(e), file=sys.stderr)
        return 2
    if not os.path.isdir(args.traces):
        print(f"trace directory {args.traces} not found (--traces)", file=sys.stderr)
        return 2
    run_dir = args.out or os.path.join("results", "aiperf_replay", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(run_dir, exist_ok=True)
    plan = plan_run(args)
    traces, unscaled = write_traces(plan.sessions, plan.sources, run_dir)
    version = aiperf_version(args.aiperf)
    log(f"CPU: {cpu_name()}; dtype {args.dtype}; AIPerf {version or 'NOT FOUND at ' + args.aiperf}")
    for s in plan.sessions:
        ins = [r["in"] for r in s["requests"]]
        log(f"session {s['id']}: {len(ins)} turns, prompts {min(ins)}-{max(ins)} tokens, "
            f"out {[r['out'] for r in s['requests']]}, think {[r['think_time'] for r in s['requests'][1:]]}s")
    log(f"scaled traces in {traces} (prompts / {args.merge}); pool {plan.num_blocks} blocks, "
        f"max-model-len {plan.max_model_len}")
    gpu = gpu_command(os.path.abspath(unscaled), len(plan.sessions))
    print(f"GPU (unscaled, same sessions):\n  {gpu}", flush=True)
    if args.dry_run:
        for arm in arms:
            policy = arm.name
            print(f"{policy}: vllm serve {args.model} {shlex.join(server_args(args, arm, plan))}")
            env = "" if arm.affinity_header else f"{AFFINITY_ENV}=false "
            cmd = aiperf_command(args.aiperf, url="http://127.0.0.1:PORT", model=args.served_name,
                                 tokenizer=args.tokenizer or args.model, traces=traces, sessions=len(plan.sessions),
                                 out_dir=os.path.join(run_dir, policy, "aiperf"), concurrency=args.concurrency,
                                 ramp_s=args.ramp, seed=args.seed, timeout_s=args.arm_timeout,
                                 session_header=arm.session_header, request_rate=args.request_rate)
            print("  " + env + shlex.join(cmd))
        return 0
    if version is None:
        print(f"aiperf not found at {args.aiperf}: install it (pip install aiperf=={AIPERF_VERSION}) "
              "in its own venv, see scripts/setup.sh", file=sys.stderr)
        return 2
    commit = _commit()
    results: dict[str, Any] = {
        "cpu": cpu_name(), "dtype": args.dtype, "aiperf_version": version, "commit": commit,
        "config": {k: v for k, v in vars(args).items()},
        "num_blocks": plan.num_blocks, "block_size": SERVER_BLOCK, "max_model_len": plan.max_model_len,
        "aiperf_request_rate": args.request_rate,
        "sessions": [{"id": s["id"], "source": src, "turns": len(s["requests"]),
                      "in": [r["in"] for r in s["requests"]], "out": [r["out"] for r in s["requests"]],
                      "think_s": [r["think_time"] for r in s["requests"]]}
                     for s, src in zip(plan.sessions, plan.sources)],
        "gpu_command": gpu,
        "arms": [],
    }
    path = os.path.join(run_dir, "results.json")
    try:
        kept = previous_arms(path, results, {arm.name for arm in arms})
    except ValueError as e:
        print(f"--out {run_dir}: {e}", file=sys.stderr)
        return 2
    if kept:
        log(f"keeping {len(kept)} arm(s) of {path}: {', '.join(a['policy'] for a in kept)}")
    results["arms"] = kept
    lines = []
    failed = False
    for arm in arms:
        policy = arm.name
        t = time.monotonic()
        try:
            summary = run_arm(args, arm, plan, traces, run_dir, args.aiperf)
        except Exception as e:  # one arm's failure is reported, the others still run
            log(f"[{policy}] FAILED: {e}")
            results["arms"].append({"policy": policy, "error": str(e)})
            failed = True
            continue
        summary["arm_wall_s"] = time.monotonic() - t
        summary["commit"] = commit
        results["arms"].append(summary)
        line = format_summary(summary)
        lines.append(line)
        log(f"[{policy}] done in {summary['arm_wall_s']:.0f}s")
        print(line, flush=True)
        failed |= bool(summary["failed"] or summary["incomplete_sessions"])
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"CPU: {cpu_name()}; dtype {args.dtype}; AIPerf {version}; pool {plan.num_blocks} x {SERVER_BLOCK} "
          f"blocks; {len(plan.sessions)} sessions x <= {args.turns} turns, prompts / {args.merge}")
    for line in lines:
        print(line)
    print(f"results: {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
