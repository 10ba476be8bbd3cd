"""Replay agent traces through vLLM's real scheduler at GPU scale, deterministically.

Every arm (fcfs, continuum, context_serve, oracle) replays the same jobs with
the same arrivals on vLLM's own v1 scheduler and KV cache manager; a virtual
clock advances by what each scheduled batch would cost on the profile's GPU
(``--step-model``: the dependency-free roofline, NVIDIA aiconfigurator's
measured vLLM data, or a CPU model fitted from a live engine). See
``benchmarks/sim/__init__.py`` for the parts and docs/simulator.md for the
results and how they were validated.

Examples::

    # the shipped Claude Code trace subset on an H100 with Llama-3.1-8B
    python -m benchmarks.simulate --step-model roofline --policies fcfs,continuum,oracle --seed 7

    # your own kv-cache-tester-format traces, 70B on 4 H100s, a load sweep
    python -m benchmarks.simulate --trace DIR --profile h100-llama70b-tp4 \\
        --sweep-rate 0.5,1,2,4 --out results/

    # what real clients send: session headers only, replies parsed as text
    python -m benchmarks.simulate --workload spread --shared-system --client tagged,headers-only

stdout holds only deterministic figures (two runs with the same arguments
print the same bytes); the simulator's own speed and progress go to stderr.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from .sim.arms import ARMS, Arm, EngineShape, build_scheduler, parse_arms
from .sim.clients import CLIENTS, DEFAULT_TOKENIZER, TAGGED, ClientProfile, ReplyText, load_reply_text, parse_clients
from .sim.engine import ReplayEngine, RunRecords
from .sim.jobs import SimJob, jobs_from_workload, poisson_arrivals
from .sim.trace_jobs import jobs_from_traces
from .sim.report import ArmSummary, add_gap_closed, dumps, plot_sweep, speed_line, summarize_run, summary_table

__all__ = ["SimSettings", "load_jobs", "main", "run_arm", "run_point"]

# Session arrivals per minute when none is given: on the H100 8B profile
# the shipped traces then overflow the pool (FCFS's hit share ~17%).
DEFAULT_RATE_PER_MIN = 2.0
# Extra blocks in the oracle's pool beyond what its turns can ever allocate.
_ORACLE_SLACK_BLOCKS = 1024


@dataclass(frozen=True)
class SimSettings:
    """What one simulated point needs besides the jobs."""

    profile: Any  # sim.profiles.SimProfile
    step_model: Any  # sim.step_model.StepModel
    model_dir: str
    num_blocks: int
    offload_gib: float = 256.0  # host memory per GPU for the offload arms
    client: ClientProfile = TAGGED  # what the requests carry (sim.clients)
    tokenizer: str = ""  # the engine's tokenizer directory when replies are text
    long_prefill_token_threshold: int = 0  # vLLM's own static chunk cut, every arm (0: none)


# The code a point's results depend on (paths from the repository root).
_CODE_PATHS = ("vllm_continuum_plugin", "connectors", "estimators", "benchmarks")


def code_commit() -> str | None:
    """The git commit of the code that ran, ``+dirty`` when its tracked code
    differs from that commit, or None outside a git checkout: results.json
    records it, so a report can say which runs predate a change."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        def git(*cmd: str) -> str:
            return subprocess.run(["git", "-C", root, *cmd], capture_output=True, text=True, timeout=30,
                                  check=True).stdout.strip()
        head = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", *_CODE_PATHS)
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def _shape(settings: SimSettings, num_blocks: int | None = None) -> EngineShape:
    p = settings.profile
    return EngineShape(
        model_dir=settings.model_dir,
        block_size=p.block_size,
        num_blocks=num_blocks if num_blocks is not None else settings.num_blocks,
        max_num_seqs=p.max_num_seqs,
        max_num_batched_tokens=p.max_num_batched_tokens,
        max_model_len=p.max_model_len,
        num_kv_heads=max(1, p.model.num_kv_heads // p.tp),
        head_size=p.model.head_dim,
        num_layers=p.model.num_layers,
        offload_bytes=int(settings.offload_gib * 2**30),
        tokenizer=settings.tokenizer if settings.client.needs_tokenizer else "",
        long_prefill_token_threshold=settings.long_prefill_token_threshold,
    )


def oracle_blocks(jobs: list[SimJob], block_size: int) -> int:
    """A pool that never has to evict: room for every block any turn ever
    computes. A turn allocates only what it does not find cached (its prompt
    and reply beyond the prefix it shares with its job's previous turn), so
    the sum of that over all turns, rounded up per turn, is enough even when
    a trace's prompt drops its history (compaction) and starts afresh."""
    total = 0
    for job in jobs:
        for k, turn in enumerate(job.turns):
            fresh = turn.prompt_tokens + turn.output_tokens - job.reusable_tokens(k)
            total += -(-fresh // block_size) + 1
    return total + _ORACLE_SLACK_BLOCKS


def build_engine(arm: Arm, jobs: list[SimJob], settings: SimSettings, progress: Any = None) -> ReplayEngine:
    """The replay engine of one arm over ``jobs``: vLLM's real scheduler for
    the arm and, under an offload arm, the simulated copies of its connector."""
    from vllm_continuum_plugin.clock import ManualClock

    clock = ManualClock()
    blocks = oracle_blocks(jobs, settings.profile.block_size) if arm.unbounded_pool else None
    scheduler = build_scheduler(arm, _shape(settings), clock, num_blocks=blocks)
    worker = None
    if arm.offload:
        from .sim.batch import BatchShape
        from .sim.offload import SimulatedNativeOffloadWorker, SimulatedOffloadWorker
        from .sim.step_model import pcie_transfer_seconds

        profile = settings.profile

        def copy_seconds(tokens: int) -> float:
            return pcie_transfer_seconds(profile, BatchShape(loaded_tokens=tokens))

        if arm.offload == "native":
            worker = SimulatedNativeOffloadWorker(profile.block_size, copy_seconds, profile.kv_bytes_per_token_per_gpu())
        else:
            worker = SimulatedOffloadWorker(profile.block_size, copy_seconds)
    return ReplayEngine(
        scheduler, clock, settings.step_model, jobs, block_size=settings.profile.block_size,
        send_metadata=arm.is_plugin,
        on_turn_finished=(lambda _r: progress.update(1)) if progress is not None else None,
        offload_worker=worker,
        max_jobs_in_flight=arm.job_cap,
        client=settings.client,
    )


def run_arm(arm: Arm, jobs: list[SimJob], settings: SimSettings, progress: Any = None) -> tuple[ArmSummary, RunRecords]:
    """One arm over ``jobs``; asserts every KV block is free at the end."""
    from vllm.utils.gc_utils import freeze_gc_heap

    engine = build_engine(arm, jobs, settings, progress)
    scheduler = engine.scheduler
    # As vLLM's engine core does once it has started (``freeze_gc_heap``):
    # the pool's blocks, the jobs and the imported modules live for the
    # whole run, and the collector would otherwise walk them again and
    # again (a tenth of a run's time).
    freeze_gc_heap()
    try:
        records = engine.run()
        free, usable = engine.free_blocks()
        if free != usable:
            raise AssertionError(f"{arm.name}: {usable - free} KV blocks still held after every job ended")
    finally:
        gc.unfreeze()  # the next arm's run must not keep this one's garbage
        scheduler.shutdown()
    return summarize_run(arm.name, records), records


# The tasks of a parallel point, inherited by forked workers (a step model
# may hold native state that cannot be pickled).
_TASKS: list[tuple[Arm, list[SimJob], SimSettings, int | None]] = []


def _run_task(index: int) -> tuple[ArmSummary, str]:
    return _run_arm_job(_TASKS[index])


def _run_arm_job(args: tuple[Arm, list[SimJob], SimSettings, int | None]) -> tuple[ArmSummary, str]:
    arm, jobs, settings, bar_position = args
    bar = None
    if bar_position is not None:
        bar = _progress(sum(len(j.turns) for j in jobs), arm.name, bar_position)
    summary, records = run_arm(arm, jobs, settings, bar)
    if bar is not None:
        bar.close()
    return summary, speed_line(arm.name, records)


def run_point(arms: list[Arm], jobs: list[SimJob], settings: SimSettings, show_progress: bool,
              workers: int = 1) -> list[ArmSummary]:
    """Every arm on the same jobs, ``workers`` arms at a time in separate
    processes (each arm is deterministic on its own, so the results do not
    depend on ``workers``); the simulator's speed goes to stderr."""
    tasks = [(arm, jobs, settings, i if show_progress else None) for i, arm in enumerate(arms)]
    if workers > 1 and len(arms) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # fork: the children inherit the imported vLLM (a spawn would import it again).
        _TASKS[:] = tasks
        try:
            with ProcessPoolExecutor(min(workers, len(arms)), mp_context=multiprocessing.get_context("fork")) as pool:
                results = list(pool.map(_run_task, range(len(tasks))))
        finally:
            _TASKS.clear()
    else:
        results = [_run_arm_job(t) for t in tasks]
    for _, speed in results:
        print(speed, file=sys.stderr)
    return add_gap_closed([summary for summary, _ in results])


def _progress(total: int, desc: str, position: int = 0) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # the bench extra is optional
        return None
    return tqdm(total=total, desc=desc, unit="turn", file=sys.stderr, leave=False, position=position)


def load_jobs(args: argparse.Namespace, rate_per_min: float, profile: Any, num_blocks: int,
              client: ClientProfile = TAGGED, text: ReplyText | None = None) -> list[SimJob]:
    """The jobs of one point: trace sessions or a synthetic preset, arriving
    as a Poisson process at ``rate_per_min`` jobs a minute (seeded), as
    ``client`` sends them (``text`` makes its reply text). A trace
    session ends before its first turn that the engine could not serve: over
    the model's length limit or, as vLLM checks at start-up, the pool. The
    arrivals and the jobs' content do not depend on ``client``."""
    if args.workload:
        from .workload import PRESETS, generate_jobs

        if args.workload not in PRESETS:
            raise SystemExit(f"unknown --workload {args.workload!r}; choose from {', '.join(PRESETS)}")
        spec = PRESETS[args.workload](args.sessions or 40, rate_per_min / 60.0)
        return jobs_from_workload(generate_jobs(spec, args.seed), shared_system=args.shared_system,
                                  client=client, text=text)
    from .sim.traces import DEFAULT_TRACE_DIR, load_trace_dir

    sessions, skipped = load_trace_dir(args.trace or DEFAULT_TRACE_DIR)
    for path, why in skipped:
        print(f"[simulate] skipped {path}: {why}", file=sys.stderr)
    if not sessions:
        raise SystemExit(f"no trace sessions found in {args.trace or DEFAULT_TRACE_DIR}")
    if args.sessions:
        sessions = sessions[: args.sessions]
    arrivals = poisson_arrivals(len(sessions), rate_per_min / 60.0, args.seed)
    return jobs_from_traces(
        sessions, arrivals,
        unit_tokens=args.unit_tokens,
        max_turns=args.max_turns,
        max_context_tokens=min(profile.max_model_len, num_blocks * profile.block_size),
        max_think_s=args.max_think_s,
        client=client,
        text=text,
        shared_system=args.shared_system,
        subagents=args.subagents,
    )


def _floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.simulate",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    src = p.add_argument_group("workload")
    src.add_argument("--trace", help="directory of kv-cache-tester trace files (default: the shipped Claude Code subset)")
    src.add_argument("--workload", help="a synthetic preset of benchmarks.workload instead of traces")
    src.add_argument("--shared-system", action="store_true",
                     help="jobs share one system prompt (traces: the system prompt and tools, by position)")
    src.add_argument("--subagents", action="store_true",
                     help="replay the traces' sub-agents under their parent's session (default: left out)")
    src.add_argument("--sessions", type=int, default=None, help="use the first N sessions/jobs")
    src.add_argument("--rate", type=float, default=None,
                     help="job (session) arrivals per minute, Poisson (default 2)")
    src.add_argument("--max-turns", type=int, default=None, help="cap each trace session's main turns")
    src.add_argument("--max-think-s", type=float, default=120.0,
                     help="cap a trace's think time (tool + user) between turns, seconds (default 120)")
    src.add_argument("--unit-tokens", type=int, default=None,
                     help="tokens per trace hash block (default the trace's 64; smaller scales prompts down)")
    eng = p.add_argument_group("engine")
    eng.add_argument("--profile", default="h100-llama8b", help="GPU + model profile (see --list-profiles)")
    eng.add_argument("--list-profiles", action="store_true", help="print the profiles and exit")
    eng.add_argument("--step-model", default="roofline", choices=["roofline", "aiconfigurator", "cpu"])
    eng.add_argument("--cpu-fit", help="JSON of a fitted CPU step model (--step-model cpu)")
    eng.add_argument("--num-blocks", type=int, default=None, help="KV pool size in blocks (default: the profile's)")
    eng.add_argument("--offload-gib", type=float, default=256.0,
                     help="host memory per GPU for the offload arms' KV store, GiB (default 256)")
    eng.add_argument("--long-prefill-token-threshold", type=int, default=0, metavar="N",
                     help="vLLM's own --long-prefill-token-threshold for every arm: each prefill's chunk in every "
                          "step cut to N tokens (default 0: vLLM's default, none; the plugin's arms cut only "
                          "while a job's next turn waits, see cut_long_prefills)")
    p.add_argument("--policies", default="fcfs,continuum,oracle",
                   help=f"comma-separated arms, from: {', '.join(ARMS)} (default fcfs,continuum,oracle)")
    p.add_argument("--continuum-set", action="append", default=[], metavar="KEY=JSON",
                   help="a setting for every plugin arm, as --additional-config's continuum section takes it "
                        "(e.g. max_pinned_fraction=0.9); repeatable")
    p.add_argument("--client", default="tagged",
                   help=f"comma-separated client profiles, one table each on the same arrivals, from: "
                        f"{', '.join(CLIENTS)} (default tagged; see benchmarks/sim/clients.py)")
    p.add_argument("--client-tokenizer", default=DEFAULT_TOKENIZER,
                   help="tokenizer directory for the text replies of the non-tagged profiles "
                        f"(default {DEFAULT_TOKENIZER})")
    p.add_argument("--seed", type=int, default=7)
    sweep = p.add_argument_group("sweeps (one table per point, a JSON and a plot in --out)")
    sweep.add_argument("--sweep-rate", type=_floats, help="arrival rates (jobs/min) to sweep")
    sweep.add_argument("--sweep-blocks", type=_floats, help="pool sizes as fractions of the profile's to sweep")
    p.add_argument("--out", help="directory for results.json and plots")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="arms simulated in parallel processes (default: the CPU count; results do not depend on it)")
    p.add_argument("--progress", action="store_true", help="progress bars on stderr (default: when stderr is a tty)")
    return p


def _with_settings(arm: Arm, settings: list[str]) -> Arm:
    """``arm`` with ``KEY=JSON`` plugin settings added (plugin arms only;
    the settings are validated by the plugin's own config loader when the
    scheduler is built)."""
    import dataclasses
    import json

    if not arm.is_plugin:
        return arm
    extra: dict[str, Any] = dict(arm.continuum)
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--continuum-set expects KEY=JSON, got {item!r}")
        try:
            extra[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            extra[key.strip()] = value  # a bare string
    return dataclasses.replace(arm, continuum=tuple(sorted(extra.items())))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .sim.profiles import PROFILES, write_config_dir
    from .sim.step_model_factory import make_step_model

    if args.list_profiles:
        for name, prof in PROFILES.items():
            print(f"{name}: {prof.model.name} TP{prof.tp} on {prof.gpu.name}, {prof.num_gpu_blocks():,} KV blocks "
                  f"of {prof.block_size} tokens, max_num_seqs {prof.max_num_seqs}, "
                  f"max_num_batched_tokens {prof.max_num_batched_tokens}, max_model_len {prof.max_model_len}")
        return 0
    if args.profile not in PROFILES:
        raise SystemExit(f"unknown --profile {args.profile!r}; choose from {', '.join(PROFILES)}")
    try:
        arms = parse_arms(args.policies)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if args.continuum_set:
        arms = [_with_settings(arm, args.continuum_set) for arm in arms]
    profile = PROFILES[args.profile]
    step_model = make_step_model(args.step_model, profile, cpu_fit_path=args.cpu_fit)
    show_progress = args.progress or sys.stderr.isatty()
    base_blocks = args.num_blocks or profile.num_gpu_blocks()
    try:
        clients = parse_clients(args.client)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    text: ReplyText | None = None
    tokenizer = ""
    if any(c.needs_tokenizer for c in clients):
        tokenizer = os.path.expanduser(args.client_tokenizer)
        try:
            text = load_reply_text(tokenizer)
        except (OSError, ValueError) as e:
            raise SystemExit(f"--client-tokenizer {args.client_tokenizer!r}: {e}") from None
    rates = args.sweep_rate or [args.rate or DEFAULT_RATE_PER_MIN]
    fractions = args.sweep_blocks or [1.0]
    points: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="continuum-sim-") as tmp:
        model_dir = write_config_dir(profile, os.path.join(tmp, "model"))
        for client in clients:
            for rate in rates:
                for frac in fractions:
                    blocks = max(1, int(base_blocks * frac))
                    jobs = load_jobs(args, rate, profile, blocks, client, text)
                    settings = SimSettings(profile, step_model, model_dir, blocks, args.offload_gib, client,
                                           tokenizer, args.long_prefill_token_threshold)
                    # (The tagged default keeps the header it always had.)
                    note = "" if args.client == "tagged" else f" client={client.name}"
                    print(f"# profile={profile.name} step_model={step_model.name} jobs={len(jobs)} "
                          f"turns={sum(len(j.turns) for j in jobs)} rate={rate:g}/min blocks={blocks} "
                          f"block_size={profile.block_size} seed={args.seed} "
                          f"workload={args.workload or os.path.basename(os.path.normpath(args.trace or 'claude_code_traces'))}"
                          f"{note}")
                    summaries = run_point(arms, jobs, settings, show_progress, args.workers)
                    for s in summaries:
                        print(s.line())
                    print(summary_table(summaries))
                    print()
                    for s in summaries:
                        points.append({"rate_per_min": rate, "pool_fraction": frac, "num_blocks": blocks,
                                       "client": client.name, **s.to_json()})
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            f.write(dumps({"profile": profile.name, "step_model": step_model.name, "seed": args.seed,
                           "argv": sys.argv[1:] if argv is None else argv, "commit": code_commit(),
                           "points": points}))
        title = f"{profile.name}, {step_model.name} step model, seed {args.seed}"
        for client in clients:
            # One plot per client profile: a sweep's lines are arms.
            mine = [p for p in points if p["client"] == client.name]
            suffix = "" if len(clients) == 1 else f"_{client.name}"
            if len(rates) > 1:
                plot_sweep(mine, "rate_per_min", "arrivals (jobs/min)",
                           os.path.join(args.out, f"sweep_rate{suffix}.png"), title)
            if len(fractions) > 1:
                plot_sweep(mine, "pool_fraction", "KV pool (fraction of profile)",
                           os.path.join(args.out, f"sweep_pool{suffix}.png"), title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
