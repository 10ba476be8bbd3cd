"""Validate the simulator against the live engine on this machine.

``python -m benchmarks.sim.validate`` runs, in order:

1. waits until no other ``vllm serve`` / ``aiperf`` / ``benchmarks.simulate``
   process runs (polling every 30 s, up to 20 min; the doc says whether the
   machine was quiet);
2. the CPU step-model fit (``benchmarks.sim.cpu_fit``), unless ``--fit`` names one;
3. the live A/B (``benchmarks.ab_benchmark``'s server arguments, warm-up,
   client and summaries; one fresh ``vllm serve`` per arm) on a seeded
   preset, after a round-trip probe on the first arm's idle server that
   measures what the simulator does not model: client, HTTP, chat template
   and tokenization, detokenization and streaming per turn (client latency
   minus the engine's own ``vllm:e2e_request_latency_seconds``);
4. the replay of the same jobs (written to ``workload.jsonl``) in the
   simulator with the fitted model, the live server's limits and pool
   (:func:`~.cpu_fit.cpu_profile`), the prompt lengths the live server
   tokenized (chat-template tokens included, from the live usage records)
   and the probe's per-turn overhead added to every tool gap and to each
   job's completion;
5. ``docs/simulator_validation.md``: machine, dtype, commands, the fit, and
   live vs simulated per arm with pass/fail against the bounds (ranking by
   mean JCT; mean JCT within 20 %; prefix-hit share within 10 points).

``--live-results DIR`` reuses a previous run's live records instead of
serving again (the simulation and the doc are regenerated).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from .host import busy_processes, load_average, lscpu_model
from .validation_doc import auto_notes, write_doc

__all__ = ["calibrated_jobs", "compare", "main", "overhead_adjusted", "ranking", "wait_quiet"]

JCT_BOUND = 0.20
HIT_BOUND_POINTS = 10.0


def _log(msg: str) -> None:
    print(f"[validate] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------
# Pure helpers
# ----------------------------------------------------------------------
def calibrated_jobs(jobs: list[Any], turn_tokens: dict[str, list[tuple[int, int]]], system_prefix: int) -> list[Any]:
    """``jobs`` (``workload.Job``) with token counts replaced by what the live
    server saw: ``turn_tokens[job_id][k] = (prompt_tokens, output_tokens)``
    of turn ``k`` (the server's usage), ``system_prefix`` the templated
    tokens every job shares (system message + chat-template framing). Turn
    ``k``'s new tokens become ``P_k - P_{k-1} - out_{k-1}`` (tool output plus
    the template's per-message tokens), so ``jobs_from_workload`` gives
    prompts of the live lengths. Jobs without records keep their counts."""
    from ..workload import Job, Turn

    out = []
    for job in jobs:
        rec = turn_tokens.get(job.job_id)
        if not rec or len(rec) != job.num_turns:
            out.append(job)
            continue
        turns = []
        for k, turn in enumerate(job.turns):
            prompt, output = rec[k]
            if k == 0:
                new = prompt - system_prefix
            else:
                new = prompt - rec[k - 1][0] - rec[k - 1][1]
            turns.append(Turn(k, max(1, new), max(1, output), turn.tool, turn.tool_command, turn.tool_seconds))
        out.append(Job(job.job_id, job.arrival_s, system_prefix, tuple(turns)))
    return out


def overhead_adjusted(sim_jobs: list[Any], per_turn_s: float) -> list[Any]:
    """SimJobs whose every tool gap (turns ``k >= 1``) is ``per_turn_s``
    longer: a turn reaches the engine that much after the previous one left
    it (response streaming + client + HTTP + template/tokenization)."""
    from .jobs import SimJob

    out = []
    for job in sim_jobs:
        turns = tuple(t if k == 0 else dataclasses.replace(t, think_s=t.think_s + per_turn_s)
                      for k, t in enumerate(job.turns))
        out.append(SimJob(job.job_id, job.arrival_s, turns))
    return out


def ranking(means: dict[str, float]) -> list[str]:
    """Arms ordered by mean JCT, best (lowest) first."""
    return sorted(means, key=lambda a: means[a])


def compare(live: dict[str, dict[str, float]], sim: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Per-arm differences and the three bounds. ``live[arm]`` and
    ``sim[arm]`` hold ``jct_mean``, ``jct_p90`` and ``hit_share`` (0..1)."""
    rows = {}
    for arm in live:
        if arm not in sim:
            continue
        lv, sm = live[arm], sim[arm]
        rel = sm["jct_mean"] / lv["jct_mean"] - 1.0
        hit_pts = 100.0 * (sm["hit_share"] - lv["hit_share"])
        rows[arm] = {
            "jct_rel": rel,
            "p90_rel": sm["jct_p90"] / lv["jct_p90"] - 1.0,
            "hit_points": hit_pts,
            "jct_ok": abs(rel) <= JCT_BOUND,
            "hit_ok": abs(hit_pts) <= HIT_BOUND_POINTS,
        }
    arms = list(rows)
    live_rank = ranking({a: live[a]["jct_mean"] for a in arms})
    sim_rank = ranking({a: sim[a]["jct_mean"] for a in arms})
    return {"rows": rows, "live_rank": live_rank, "sim_rank": sim_rank, "rank_ok": live_rank == sim_rank}


# ----------------------------------------------------------------------
# Machine
# ----------------------------------------------------------------------
def wait_quiet(max_wait_s: float = 1200.0, poll_s: float = 30.0) -> dict[str, Any]:
    """Wait until :func:`busy_processes` is empty; returns what was seen."""
    t0 = time.time()
    seen: list[str] = []
    while True:
        busy = busy_processes()
        if not busy:
            return {"quiet": True, "waited_s": time.time() - t0, "seen": seen}
        for b in busy:
            if b not in seen:
                seen.append(b)
        if time.time() - t0 >= max_wait_s:
            return {"quiet": False, "waited_s": time.time() - t0, "seen": seen}
        _log(f"machine busy ({len(busy)} process(es): {busy[0][:80]}...); waiting")
        time.sleep(poll_s)


# ----------------------------------------------------------------------
# Live side
# ----------------------------------------------------------------------
def _ab_args(ns: argparse.Namespace, out_dir: str) -> argparse.Namespace:
    from ..ab_benchmark import build_parser

    argv = ["--workload", ns.workload, "--jobs", str(ns.jobs), "--jobs-per-s", str(ns.jobs_per_s),
            "--tool-output-scale", str(ns.tool_output_scale), "--seed", str(ns.seed),
            "--num-blocks", str(ns.num_blocks), "--max-model-len", str(ns.max_model_len), "--out", out_dir, "--no-progress"]
    return build_parser().parse_args(argv)


def probe_overhead(url: str, model: str, system_prompt: str, n: int = 4) -> dict[str, float]:
    """Sequential chat turns on an idle server: client latency vs the
    engine's own e2e latency (``vllm:e2e_request_latency_seconds``)."""
    import openai
    import requests

    from ..agent_replay import AgentReplayer, synthetic_text
    from ..server import parse_metrics
    from ..workload import Job, Turn

    def e2e() -> tuple[float, float]:
        m = parse_metrics(requests.get(url + "/metrics", timeout=10).text)
        s = sum(v for k, v in m.items() if k.startswith("vllm:e2e_request_latency_seconds_sum"))
        c = sum(v for k, v in m.items() if k.startswith("vllm:e2e_request_latency_seconds_count"))
        return s, c

    shapes: list[list[int]] = []  # per request: prompt, cached, output tokens (the server's usage)

    async def go() -> list[float]:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
        rep = AgentReplayer(client, model, system_prompt, 0)
        lat = []
        for i in range(n):
            tokens = (200, 500)[i % 2]
            job = Job(f"probe-{i}", 0.0, 0, (Turn(0, tokens, 12, "", "", 0.0),))
            msgs = [{"role": "system", "content": system_prompt},
                    {"role": "user", "content": synthetic_text(f"probe{i}", tokens, 0)}]
            rec, _, _ = await rep._turn(job, 0, 12, "", msgs, True)
            lat.append(rec.latency_s)
            shapes.append([rec.prompt_tokens, rec.cached_tokens, rec.output_tokens])
        await client.close()
        return lat

    s0, c0 = e2e()
    lat = asyncio.run(go())
    time.sleep(0.5)
    s1, c1 = e2e()
    engine = (s1 - s0) / max(1.0, c1 - c0)
    client = sum(lat) / len(lat)
    return {"client_latency_s": client, "engine_e2e_s": engine, "per_turn_overhead_s": max(0.0, client - engine),
            "requests": c1 - c0, "shapes": shapes}


def request_steps(prompt: int, cached: int, output: int, chunk: int) -> list[Any]:
    """The steps an idle engine runs for one request: its prefill in chunks
    of at most ``chunk`` tokens (the last one samples the first token), then
    one decode per further output token, each at its context."""
    from .batch import BatchShape, PrefillChunk

    steps = []
    done = cached
    while done < prompt:
        n = min(chunk, prompt - done)
        steps.append(BatchShape((PrefillChunk(n, done),), ()))
        done += n
    for k in range(1, output):
        steps.append(BatchShape((), (prompt + k - 1,)))
    return steps


def live_step_factor(model: Any, probe: dict[str, Any], chunk: int) -> float | None:
    """How much slower the live server's engine ran the probe's requests than
    the fitted model predicts for the same steps: measured engine e2e over
    the predicted sum of step times. The fit times ``EngineCore.step`` alone
    in a quiet process; the live engine shares its core with the API server
    (detokenizing, streaming) and the client, which the fit cannot see.
    ``None`` when the probe has no per-request shapes (older records)."""
    shapes = probe.get("shapes") or []
    if not shapes or not probe.get("engine_e2e_s"):
        return None
    predicted = sum(model.step_seconds(b) for p, c, o in shapes for b in request_steps(p, c, o, chunk)) / len(shapes)
    return float(probe["engine_e2e_s"]) / predicted if predicted > 0 else None


class ScaledStepModel:
    """``inner``'s step times times ``factor`` (the live server's measured
    slowdown against the in-process fit)."""

    def __init__(self, inner: Any, factor: float) -> None:
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"step factor must be a positive number, got {factor!r}")
        self.inner = inner
        self.factor = factor
        self.name = f"{inner.name}x{factor:.3f}"

    def step_seconds(self, batch: Any) -> float:
        return self.inner.step_seconds(batch) * self.factor


def run_live(ns: argparse.Namespace, arms: list[str], jobs: list[Any], out_dir: str) -> dict[str, Any]:
    """Every arm on a fresh server; returns per-arm summaries, per-turn token
    counts, and the probe."""
    from ..ab_benchmark import (ARMS, ArmResult, KVSampler, arm_summary, reset_prefix_cache, server_args,
                                server_env, warm_up)
    from ..agent_replay import run_jobs, synthetic_text
    from ..server import VLLMServer, parse_metrics
    import requests

    args = _ab_args(ns, out_dir)
    results: dict[str, Any] = {"arms": {}, "probe": None, "commands": {}}
    for i, arm in enumerate(arms):
        t = time.time()
        sargs = server_args(args, arm, jobs)
        with VLLMServer(args.model, sargs, served_name=args.served_name, env=server_env(args)) as server:
            url = server.url
            results["commands"][arm] = "vllm serve " + args.model + " " + " ".join(server.args)
            _log(f"[{arm}] server ready at {url} ({time.time() - t:.0f}s)")
            warm_up(url, args.served_name)
            if i == 0:
                system_prompt = synthetic_text("system", jobs[0].system_tokens, 0)
                results["probe"] = probe_overhead(url, args.served_name, system_prompt)
                _log(f"probe: {results['probe']}")
            reset_prefix_cache(url)
            before = parse_metrics(requests.get(url + "/metrics", timeout=10).text)
            sampler = KVSampler(url)
            sampler.start()
            records, makespan = asyncio.run(run_jobs(url, args.served_name, jobs, args.seed, args.max_concurrency,
                                                     False, tagged=ARMS[arm].tagged))
            sampler.stop()
            time.sleep(0.3)
            after = parse_metrics(requests.get(url + "/metrics", timeout=10).text)
        res = ArmResult(arm, ns.jobs_per_s, records, before, after, sampler.samples, makespan)
        summ = arm_summary(res)
        turns = [tr for j in records for tr in j.turns]
        prompt = sum(tr.prompt_tokens for tr in turns)
        e2e_sum = (sum(v for k, v in after.items() if k.startswith("vllm:e2e_request_latency_seconds_sum"))
                   - sum(v for k, v in before.items() if k.startswith("vllm:e2e_request_latency_seconds_sum")))
        results["arms"][arm] = {
            "jct_mean": summ["jct_mean"], "jct_p90": summ["jct_p90"], "failed": summ["failed"],
            "hit_share": sum(tr.cached_tokens for tr in turns) / prompt if prompt else float("nan"),
            "hit_rate_metrics": summ["hit_rate"], "preemptions": summ["preemptions"], "pins": summ["pins"],
            "makespan": makespan, "turn_latency_mean": summ["latency_mean"],
            "engine_e2e_mean": e2e_sum / max(1, len(turns)),
            "turn_tokens": {j.job_id: [(tr.prompt_tokens, tr.output_tokens) for tr in j.turns] for j in records},
            "wall_s": time.time() - t,
        }
        _log(f"[{arm}] done in {time.time() - t:.0f}s: JCT mean {summ['jct_mean']:.2f}s, "
             f"hit {results['arms'][arm]['hit_share']:.1%}, failed {summ['failed']}")
    return results


def system_prefix_tokens(model_dir: str, system_tokens: int) -> tuple[int, int]:
    """(tokens every job's prompt shares, tokens of one templated turn-0
    prompt) under the model's chat template, as the live client sends them."""
    from transformers import AutoTokenizer

    from ..agent_replay import synthetic_text

    tok = AutoTokenizer.from_pretrained(model_dir)
    system = synthetic_text("system", system_tokens, 0)

    def ids(user: str) -> list[int]:
        out = tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": user}],
                                      add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)

    a, b = ids(synthetic_text("job-a", 50, 0)), ids(synthetic_text("job-b", 50, 0))
    common = 0
    for x, y in zip(a, b):
        if x != y:
            break
        common += 1
    return common, len(a)


# ----------------------------------------------------------------------
# Simulated side
# ----------------------------------------------------------------------
def run_sim(sim_jobs: list[Any], arms: list[str], profile: Any, step_model: Any, jct_add_s: float) -> dict[str, Any]:
    from ..simulate import SimSettings, run_arm
    from .arms import ARMS as SIM_ARMS
    from .profiles import write_config_dir

    out = {}
    with tempfile.TemporaryDirectory(prefix="continuum-validate-") as tmp:
        model_dir = write_config_dir(profile, os.path.join(tmp, "model"))
        settings = SimSettings(profile, step_model, model_dir, profile.num_gpu_blocks())
        for arm in arms:
            summary, records = run_arm(SIM_ARMS[arm], sim_jobs, settings)
            jct = sorted(v + jct_add_s for v in records.jct_s().values())
            from ..stats import percentile

            out[arm] = {"jct_mean": sum(jct) / len(jct), "jct_p90": percentile(jct, 90),
                        "hit_share": summary.hit_share, "preemptions": summary.preemptions,
                        "pins": summary.pins_created, "makespan": summary.makespan_s,
                        "busy": summary.busy_fraction, "turn_latency_mean": _turn_latency(records)}
    return out


def _turn_latency(records: Any) -> float:
    ts = [t.finish_s - t.arrival_s for t in records.turns if t.finish_s is not None]
    return sum(ts) / len(ts) if ts else float("nan")


# ----------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sim.validate", description=__doc__.split("\n\n")[0])
    p.add_argument("--fit", help="a fitted CpuStepModel JSON (default: fit now, into --out)")
    p.add_argument("--arms", default="fcfs,continuum,context_serve")
    p.add_argument("--workload", default="cpu-small")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--jobs-per-s", type=float, default=0.1)
    p.add_argument("--tool-output-scale", type=float, default=1.0)
    p.add_argument("--num-blocks", type=int, default=64, help="live and simulated KV pool, blocks (default 64)")
    p.add_argument("--max-model-len", type=int, default=4096,
                   help="live and simulated max_model_len; vLLM refuses a pool smaller than one such request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/validate", help="records directory")
    p.add_argument("--doc", default="docs/simulator_validation.md")
    p.add_argument("--live-results", help="reuse DIR/live.json of an earlier run instead of serving")
    p.add_argument("--max-wait-s", type=float, default=1200.0, help="longest wait for a quiet machine")
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    from ..ab_benchmark import DEFAULT_MODEL_DIR
    from ..dtype import serving_dtype
    from ..workload import PRESETS, generate_jobs, write_trace
    from .cpu_fit import EngineLimits, cpu_profile
    from .jobs import jobs_from_workload
    from .step_model import CpuStepModel

    os.makedirs(ns.out, exist_ok=True)
    arms = [a.strip() for a in ns.arms.split(",") if a.strip()]
    limits = EngineLimits(num_blocks=ns.num_blocks, max_model_len=ns.max_model_len)
    dtype = serving_dtype()
    quiet: dict[str, Any] = {}
    fit_output = ""
    fit_path = ns.fit or os.path.join(ns.out, "cpu_fit.json")
    if ns.fit is None and ns.live_results is None:
        quiet["fit"] = wait_quiet(ns.max_wait_s)
        _log("fitting the CPU step model")
        proc = subprocess.run([sys.executable, "-m", "benchmarks.sim.cpu_fit", "--out", fit_path],
                              capture_output=True, text=True)
        fit_output = proc.stdout
        if proc.returncode:
            sys.stderr.write(proc.stderr[-3000:])
            return proc.returncode
    else:
        quiet["fit"] = {"quiet": True, "waited_s": 0.0, "seen": ["(fit reused: see its own run)"]}
        fit_out_path = os.path.splitext(fit_path)[0] + ".txt"
        if os.path.exists(fit_out_path):
            fit_output = open(fit_out_path, encoding="utf-8").read()
    fit_output = "\n".join(line for line in fit_output.splitlines()
                           if line.startswith(("#", "  ", "wrote")))
    if ns.fit is None and ns.live_results is None:  # a fit made now: its report goes next to it
        with open(os.path.splitext(fit_path)[0] + ".txt", "w", encoding="utf-8") as fh:
            fh.write(fit_output)
    model = CpuStepModel.load(fit_path)

    spec = PRESETS[ns.workload](ns.jobs, ns.jobs_per_s, ns.tool_output_scale)
    jobs = generate_jobs(spec, ns.seed)
    trace = os.path.join(ns.out, "workload.jsonl")
    write_trace(trace, jobs)

    live_path = os.path.join(ns.live_results or ns.out, "live.json")
    if ns.live_results:
        with open(live_path, encoding="utf-8") as fh:
            live = json.load(fh)
        quiet["live"] = live.get("quiet", {"quiet": True, "waited_s": 0, "seen": []})
        quiet["load_live"] = live.get("load_live", "?")
    else:
        quiet["live"] = wait_quiet(ns.max_wait_s)
        quiet["load_live"] = load_average()
        live = run_live(ns, arms, jobs, ns.out)
        live["quiet"] = quiet["live"]
        live["load_live"] = quiet["load_live"]
        with open(live_path, "w", encoding="utf-8") as fh:
            json.dump(live, fh, indent=1)

    profile = cpu_profile(DEFAULT_MODEL_DIR, limits, dtype)
    system_prefix, _ = system_prefix_tokens(DEFAULT_MODEL_DIR, spec.system_tokens)
    first = arms[0]
    turn_tokens = {j: [tuple(x) for x in v] for j, v in live["arms"][first]["turn_tokens"].items()}
    cal = calibrated_jobs(jobs, turn_tokens, system_prefix)
    overhead = float((live.get("probe") or {}).get("per_turn_overhead_s", 0.0))
    nominal_sim = jobs_from_workload(jobs, shared_system=True)
    tokens_sim = jobs_from_workload(cal, shared_system=True)
    adjusted_sim = overhead_adjusted(tokens_sim, overhead)
    _log("simulating")
    factor = live_step_factor(model, live.get("probe") or {}, limits.max_num_batched_tokens)
    sims = {
        "nominal": run_sim(nominal_sim, arms, profile, model, 0.0),
        "tokens_only": run_sim(tokens_sim, arms, profile, model, 0.0),
        "overhead": run_sim(adjusted_sim, arms, profile, model, overhead),
    }
    sims["adjusted"] = (run_sim(adjusted_sim, arms, profile, ScaledStepModel(model, factor), overhead)
                        if factor is not None else sims["overhead"])
    cmp_ = compare({a: live["arms"][a] for a in arms}, sims["adjusted"])
    live_prompts = [p for v in turn_tokens.values() for p, _ in v]
    nominal_prompts = [j.prompt_tokens(k) for j in jobs for k in range(j.num_turns)]
    ctx = {
        "cpu": lscpu_model(), "dtype": dtype, "quiet": quiet, "workload": ns.workload, "n_jobs": len(jobs),
        "n_turns": sum(j.num_turns for j in jobs), "jobs_per_s": ns.jobs_per_s, "seed": ns.seed,
        "tool_output_scale": ns.tool_output_scale, "trace": trace, "limits": dataclasses.asdict(limits),
        "command": "python -m benchmarks.sim.validate " + " ".join(argv if argv is not None else sys.argv[1:]),
        "fit_path": fit_path, "model": model, "fit_output": fit_output, "live": live, "sim": sims,
        "compare": cmp_, "overhead_s": overhead, "system_prefix": system_prefix, "step_factor": factor,
        "preset_system_tokens": spec.system_tokens,
        "tokens": {"live_prompt_mean": sum(live_prompts) / len(live_prompts),
                   "nominal_prompt_mean": sum(nominal_prompts) / len(nominal_prompts)},
    }
    ctx["notes"] = auto_notes(ctx)
    with open(os.path.join(ns.out, "validation.json"), "w", encoding="utf-8") as fh:
        json.dump({"sim": sims, "compare": cmp_, "overhead_s": overhead, "system_prefix": system_prefix,
                   "live": {a: {k: v for k, v in d.items() if k != "turn_tokens"} for a, d in live["arms"].items()}},
                  fh, indent=1)
    write_doc(ns.doc, ctx)
    for arm in arms:
        r = cmp_["rows"][arm]
        print(f"{arm}: live JCT {live['arms'][arm]['jct_mean']:.2f}s sim {sims['adjusted'][arm]['jct_mean']:.2f}s "
              f"({r['jct_rel']:+.1%}); hit live {live['arms'][arm]['hit_share']:.1%} sim "
              f"{sims['adjusted'][arm]['hit_share']:.1%} ({r['hit_points']:+.1f} pts)")
    print(f"ranking live {cmp_['live_rank']} sim {cmp_['sim_rank']}; doc: {ns.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
