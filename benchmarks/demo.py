"""The README's main job: a short multi-turn agent session on a real server.

Starts ``vllm serve`` on the embedded model with ``--scheduling-policy
continuum`` (or targets ``--url``), then runs a few agent jobs side by side.
Each turn re-sends the whole conversation with ``job_id`` / ``is_last_step``
in ``extra_body``; the model answers with a ```bash block (forced with
structured outputs, since a 135M model is a weak agent); a simulated tool
"runs" for a realistic time and its output becomes the next user message.
Between turns, other traffic floods the small KV pool.

Per turn, as it happens: prompt tokens, tokens served from cache, latency,
the pinned blocks during the tool gap (read from the server's own
``/metrics``) and the command. At the end: totals, pins by release reason,
and whether every KV block is free again. It first says which CPU it runs on
and in which dtype it serves (fp32 where the CPU has no native bf16), and
shows progress while the server starts.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass

import openai
import requests

from .dtype import cpu_name, serving_dtype
from .server import VLLMServer, parse_metrics

DEFAULT_MODEL_DIR = os.path.join(
    os.environ.get("CONTINUUM_MODELS", os.path.expanduser("~/.cache/vllm-continuum/models")),
    "smollm2-135m-instruct",
)
SYSTEM = (
    "You are a software engineering agent working in a Python repository. "
    "Reply with exactly one ```bash block containing the next command."
)
TASK = "The test suite fails. Find and fix the bug in main.py."
COMMANDS = ["ls", "cat main.py", "grep -rn TODO .", "git status", "python -m pytest -q"]
# (seconds the tool takes, what it prints): fast shell tools, a slower test run.
TOOL_RESULTS = {
    "ls": (0.1, "main.py  test_main.py  README.md  setup.py"),
    "cat main.py": (0.1, "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n" * 3),
    "grep -rn TODO .": (0.2, "./main.py:2: # TODO overflow\n./test_main.py:9: # TODO more cases\n" * 3),
    "git status": (0.15, "On branch main\nChanges not staged for commit:\n\tmodified:   main.py\n"),
    "python -m pytest -q": (1.5, "F.\n=== FAILURES ===\nassert add(2, 2) == 4\nE assert 0 == 4\n1 failed, 1 passed\n" * 2),
}


def bash_regex(command: str) -> str:
    """Structured-output regex that makes the model emit this command."""
    return r"```bash\n" + "".join("\\" + ch if ch in ".*+?()[]{}|^$\\" else ch for ch in command) + r"\n```"


@dataclass
class TurnRecord:
    job: str
    turn: int
    prompt_tokens: int
    cached_tokens: int
    latency_s: float
    command: str
    ttl_s: float | None
    pinned_blocks_in_gap: float


class MetricsReader:
    def __init__(self, url: str) -> None:
        self.url = url

    def read(self) -> dict[str, float]:
        return parse_metrics(requests.get(self.url + "/metrics", timeout=10).text)

    @staticmethod
    def total(metrics: dict[str, float], prefix: str) -> float:
        return sum(v for k, v in metrics.items() if k.startswith(prefix))


HEADER = f"{'job':<9} {'turn':>4} {'prompt':>6} {'cached':>6} {'latency':>8}  {'pinned (all jobs)':>17}  command"


def format_turn(r: TurnRecord) -> str:
    return (f"{r.job:<9} {r.turn:>4} {r.prompt_tokens:>6} {r.cached_tokens:>6} {r.latency_s:>7.2f}s"
            f"  {r.pinned_blocks_in_gap:>17.0f}  {r.command}")


def run_job(client: openai.OpenAI, model: str, job: str, turns: int, metrics: MetricsReader,
            records: list[TurnRecord], lock: threading.Lock) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"[{job}] {TASK}"}]
    for turn in range(turns):
        last = turn == turns - 1
        start = time.time()
        reply = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=24,
            temperature=0.0,
            extra_body={
                "job_id": job,
                "is_last_step": last,
                # A scripted command sequence, decoded by the real model.
                "structured_outputs": {"regex": bash_regex(COMMANDS[turn % len(COMMANDS)])},
            },
        )
        latency = time.time() - start
        text = reply.choices[0].message.content or ""
        command = text.replace("```bash", "").replace("```", "").strip()
        details = reply.usage.prompt_tokens_details
        seconds, output = TOOL_RESULTS.get(command, (0.1, "command not found"))
        pinned = 0.0
        if not last:
            time.sleep(min(0.3, seconds))  # metrics snapshot is published every 0.1 s
            pinned = MetricsReader.total(metrics.read(), "vllm_continuum:pinned_blocks")
            time.sleep(max(0.0, seconds - 0.3))
        record = TurnRecord(job, turn + 1, reply.usage.prompt_tokens, details.cached_tokens if details else 0,
                            latency, command, None, pinned)
        with lock:
            records.append(record)
            print(format_turn(record), flush=True)  # as it happens
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": output}]


def flood(client: openai.OpenAI, model: str, stop: threading.Event) -> int:
    """Unrelated one-shot traffic that keeps recycling the KV pool."""
    sent = 0
    filler = "Summarize this log line: worker restarted after timeout. " * 60
    while not stop.is_set():
        client.completions.create(model=model, prompt=f"{sent} {filler}", max_tokens=4)
        sent += 1
    return sent


def run_demo(url: str, model: str, jobs: int, turns: int, flood_traffic: bool) -> int:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    metrics = MetricsReader(url)
    before = metrics.read()
    records: list[TurnRecord] = []
    lock = threading.Lock()
    stop = threading.Event()
    flooder = threading.Thread(target=flood, args=(client, model, stop), daemon=True)
    if flood_traffic:
        flooder.start()
    workers = [
        threading.Thread(target=run_job, args=(client, model, f"agent-{i}", turns, metrics, records, lock))
        for i in range(jobs)
    ]
    print(f"\n{HEADER}", flush=True)
    t0 = time.time()
    for i, w in enumerate(workers):
        w.start()
        time.sleep(0.5)  # staggered arrivals, like real agents
    for w in workers:
        w.join()
    stop.set()
    if flood_traffic:
        flooder.join(timeout=60)
    elapsed = time.time() - t0
    after = metrics.read()

    total = MetricsReader.total
    delta = lambda name: total(after, name) - total(before, name)
    later = [r for r in records if r.turn > 1]
    hit_share = sum(r.cached_tokens for r in later) / max(1, sum(r.prompt_tokens for r in later))
    ttl_count = delta("vllm_continuum:ttl_seconds_count")
    ttl_mean = delta("vllm_continuum:ttl_seconds_sum") / ttl_count if ttl_count else 0.0
    mean_latency = sum(r.latency_s for r in records) / max(1, len(records))
    print(f"\n{jobs} jobs x {turns} turns in {elapsed:.1f}s (mean turn latency {mean_latency:.2f}s); "
          f"later turns served {hit_share:.0%} of their prompt tokens from cache")
    print(f"pins created: {delta('vllm_continuum:pins_created'):.0f}; "
          f"TTL decisions: {ttl_count:.0f}, mean TTL chosen {ttl_mean:.2f}s; "
          f"tokens served from pins: {delta('vllm_continuum:pin_hit_tokens'):.0f}")
    reasons = {k.split('reason="')[1].rstrip('"}'): v - before.get(k, 0.0)
               for k, v in after.items() if k.startswith("vllm_continuum:pins_released_total")}
    print("pins released by reason: " + ", ".join(f"{k}={v:.0f}" for k, v in reasons.items() if v))
    print(f"measured tool time: {delta('vllm_continuum:tool_seconds_count'):.0f} samples, mean "
          f"{delta('vllm_continuum:tool_seconds_sum') / max(1.0, delta('vllm_continuum:tool_seconds_count')):.2f}s")
    # Every job has ended: after the pins' TTLs lapse every block is free.
    deadline = time.time() + 90
    while time.time() < deadline:
        m = metrics.read()
        if total(m, "vllm_continuum:pinned_blocks") == 0 and total(m, "vllm:kv_cache_usage_perc") == 0:
            print("all KV blocks free again: yes")
            return 0
        time.sleep(0.5)
    print("all KV blocks free again: NO (leak?)")
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vllm-continuum-demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="use a running server instead of starting one")
    parser.add_argument("--model", default=DEFAULT_MODEL_DIR, help="model directory to serve (default: embedded SmolLM2-135M)")
    parser.add_argument("--served-name", default="smollm2", help="model name on the server (default: smollm2)")
    parser.add_argument("--policy", default="continuum", choices=["continuum", "context_serve", "fcfs"])
    parser.add_argument("--jobs", type=int, default=3, help="concurrent agent jobs (default: 3)")
    parser.add_argument("--turns", type=int, default=5, help="turns per job (default: 5)")
    parser.add_argument("--num-blocks", type=int, default=96, help="KV pool size in blocks of 32 tokens (default: 96)")
    parser.add_argument("--no-flood", action="store_true", help="do not send competing one-shot traffic")
    parser.add_argument("--dtype", choices=["bfloat16", "float32", "float16", "auto"],
                        help="dtype to serve in (default: bf16 where the CPU has native bf16, else fp32)")
    args = parser.parse_args(argv)
    if args.url:
        return run_demo(args.url.rstrip("/"), args.served_name, args.jobs, args.turns, not args.no_flood)
    if not os.path.isdir(args.model):
        print(f"model not found: {args.model} (run scripts/setup.sh)", file=sys.stderr)
        return 2
    server_args = [
        "--scheduling-policy", args.policy,
        "--block-size", "32",
        "--num-gpu-blocks-override", str(args.num_blocks),
        "--kv-cache-memory-bytes", "400000000",
        "--max-model-len", "2048",
        "--enforce-eager",
        "--enable-prompt-tokens-details",
    ]
    dtype = args.dtype or serving_dtype()
    print(f"CPU: {cpu_name()}; serving dtype: {dtype}"
          f"{'' if args.dtype else ' (bf16 only where the CPU has it natively; override: --dtype / CONTINUUM_DTYPE)'}",
          flush=True)
    print(f"starting vllm serve {args.model} --scheduling-policy {args.policy} --dtype {dtype} ...", flush=True)

    def progress(waited_s: float, server: VLLMServer) -> None:
        print(f"  ... server starting ({waited_s:.0f}s): {server.last_log_line()}", flush=True)

    with VLLMServer(args.model, server_args, served_name=args.served_name, dtype=dtype,
                    on_wait=progress) as server:
        print(f"server ready at {server.url} (log: {server.log_path})", flush=True)
        with open(server.log_path) as f:
            for line in f:
                if "vllm-continuum-plugin active" in line:
                    print(line.split("] ", 1)[-1].strip())
        return run_demo(server.url, args.served_name, args.jobs, args.turns, not args.no_flood)


if __name__ == "__main__":
    sys.exit(main())
