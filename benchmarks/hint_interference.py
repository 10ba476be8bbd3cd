"""Can one client slow another down through its hints? Measured on a real server.

Starts ``vllm serve --scheduling-policy <policy>`` on the embedded model and
times a victim's small requests (``--requests`` of them, one at a time) in
three phases, each against the same server:

* ``alone``: nothing else runs;
* ``plain``: another client sends tagged requests with short hints, back to
  back (the interference any traffic causes);
* ``hostile``: the same client sends the largest hints the server accepts
  (a ``tool_command`` of 16,384 characters: a run of spaces, or one huge
  word; a ``tool_name`` of 256) and oversized ones it rejects (HTTP 400).

The hints are parsed on the engine thread when each of the attacker's turns
finishes; before the parser was bounded, a 16,002-character run of spaces
made an unrelated request take 3.6 s instead of 0.06 s. Prints the victim's
median and p90 latency per phase and the ratio hostile / plain (1.0 means
the hints cost nothing beyond the traffic itself).

Usage: ``python -m benchmarks.hint_interference [--policy continuum] [--requests 20]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from typing import Any

import requests

from .demo import DEFAULT_MODEL_DIR
from .dtype import cpu_name, serving_dtype
from .server import VLLMServer

MAX_COMMAND = 16384


def _victim(url: str, n: int) -> list[float]:
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        r = requests.post(url + "/v1/completions", timeout=300, json={
            "model": "smollm2", "prompt": f"Victim request {i}: say hello.", "max_tokens": 4,
            "temperature": 0.0, "ignore_eos": True,
        })
        r.raise_for_status()
        times.append(time.perf_counter() - t0)
    return times


def _attacker(url: str, hostile: bool, stop: threading.Event, counts: dict[str, int]) -> None:
    hints: list[dict[str, Any]] = [{"tool_command": "ls -la"}, {"tool_name": "pytest"}]
    if hostile:
        hints = [
            {"tool_command": " " * (MAX_COMMAND - 2) + "ls"},
            {"tool_command": "x" * MAX_COMMAND},
            {"tool_name": "y" * 256},
            {"tool_command": " " * (MAX_COMMAND + 1)},  # rejected: 400
        ]
    i = 0
    while not stop.is_set():
        hint = hints[i % len(hints)]
        r = requests.post(url + "/v1/completions", timeout=300, json={
            "model": "smollm2", "prompt": f"Attacker turn {i}.", "max_tokens": 4, "temperature": 0.0,
            "ignore_eos": True, "job_id": f"attacker-{i}", "is_last_step": False, **hint,
        })
        counts[str(r.status_code)] = counts.get(str(r.status_code), 0) + 1
        i += 1


def _phase(url: str, n: int, attacker: str | None) -> tuple[list[float], dict[str, int]]:
    stop = threading.Event()
    counts: dict[str, int] = {}
    thread = None
    if attacker is not None:
        thread = threading.Thread(target=_attacker, args=(url, attacker == "hostile", stop, counts), daemon=True)
        thread.start()
        time.sleep(1.0)
    try:
        return _victim(url, n), counts
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=300)


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hint_interference", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default="continuum", choices=["continuum", "context_serve"])
    p.add_argument("--requests", type=int, default=20, help="victim requests per phase (default: 20)")
    p.add_argument("--model", default=DEFAULT_MODEL_DIR)
    args = p.parse_args(argv)
    print(f"CPU: {cpu_name()}; serving in {serving_dtype()}; policy {args.policy}", flush=True)
    server_args = ["--scheduling-policy", args.policy, "--block-size", "32", "--num-gpu-blocks-override", "256",
                   "--kv-cache-memory-bytes", "400000000", "--max-model-len", "2048", "--enforce-eager",
                   "--additional-config", '{"continuum": {"max_ttl_s": 5, "default_ttl_s": 1}}']
    with VLLMServer(args.model, server_args, served_name="smollm2") as server:
        _victim(server.url, 3)  # warm-up
        rows = []
        for phase in ("alone", "plain", "hostile"):
            times, counts = _phase(server.url, args.requests, None if phase == "alone" else phase)
            rows.append((phase, statistics.median(times), _p90(times), counts))
        healthy = requests.get(server.url + "/health", timeout=10).status_code == 200
    print(f"{'phase':<8} {'median s':>9} {'p90 s':>8}  attacker responses")
    for phase, med, p90, counts in rows:
        print(f"{phase:<8} {med:>9.3f} {p90:>8.3f}  {counts or '-'}")
    ratio = rows[2][1] / rows[1][1]
    print(f"hostile / plain median: {ratio:.2f}x; server healthy afterwards: {healthy}")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
