"""A/B with the real mini-swe-agent, unchanged: no job id, native tool calls.

For each arm (``fcfs``, ``continuum``, ``context_serve``) a fresh ``vllm
serve`` on the embedded model with vLLM's hermes tool parser and a
tools-aware ChatML template; then several mini-swe-agent agents at once
(``benchmarks/mswea_agents.py``, run by the agents venv's Python) while
optional one-shot traffic floods the small KV pool. Reports per arm: agents
submitted, later turns' cached share (from each response's ``usage``), mean
turn latency and the plugin's counters (implicit jobs started / continued,
hand-offs, jobs ended by their finish action).

    vllm-continuum-mswea-ab --arms fcfs,continuum --agents 3 --flood
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import openai

from .demo import flood
from .dtype import cpu_name, serving_dtype
from .server import VLLMServer
from .stats import format_table

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "mswea_agents.py"
CHAT_TEMPLATE = HERE / "chatml_tools.jinja"
DEFAULT_MODEL = os.path.join(
    os.environ.get("CONTINUUM_MODELS", os.path.expanduser("~/.cache/vllm-continuum/models")),
    "smollm2-135m-instruct",
)
AGENT_VENV = Path(os.environ.get("CONTINUUM_AGENT_VENV", os.path.expanduser("~/.venvs/vllm-continuum-agents")))
SCRIPT = ["ls", "cat README.md", "git status", "cat main.py", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]


def server_args(policy: str, num_blocks: int, ttl_s: float, max_pinned_fraction: float = 0.5) -> list[str]:
    """``vllm serve`` flags of one arm: only the policy differs between arms."""
    config = {"continuum": {"default_ttl_s": ttl_s, "max_ttl_s": max(60.0, ttl_s),
                            "max_pinned_fraction": max_pinned_fraction}}
    return [
        "--scheduling-policy", policy, "--block-size", "32", "--num-gpu-blocks-override", str(num_blocks),
        "--kv-cache-memory-bytes", "400000000", "--max-model-len", "2048", "--max-num-seqs", "8",
        "--enforce-eager", "--enable-prompt-tokens-details",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--chat-template", str(CHAT_TEMPLATE),
        *(["--additional-config", json.dumps(config)] if policy != "fcfs" else []),
    ]


def run_agents(url: str, agents: int, script: list[str] = SCRIPT, with_flood: bool = False,
               model: str = "smollm2", agent_venv: Path = AGENT_VENV) -> list[dict[str, Any]]:
    """Run ``agents`` mini-swe-agent agents against ``url``; their results."""
    python = agent_venv / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"mini-swe-agent venv missing at {agent_venv}: run scripts/setup.sh")
    stop = threading.Event()
    # The demo's flood: unrelated ~600-token one-shot prompts, back to back.
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    flooder = threading.Thread(target=flood, args=(client, model, stop), daemon=True)
    if with_flood:
        flooder.start()
    try:
        proc = subprocess.run(
            [str(python), str(RUNNER), "--url", url + "/v1", "--model", model,
             "--agents", str(agents), "--script", ";;".join(script)],
            capture_output=True, text=True, timeout=3600,
        )
    finally:
        stop.set()
        if with_flood:
            flooder.join(timeout=120)
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"agents printed nothing (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])["agents"]


def later_turn_cached_share(agents: list[dict[str, Any]]) -> float:
    later = [c for a in agents for c in a["calls"][1:]]
    prompt = sum(c["prompt_tokens"] or 0 for c in later)
    return sum(c["cached_tokens"] for c in later) / prompt if prompt else 0.0


def plugin_counters(server: VLLMServer) -> dict[str, float]:
    m = server.metric
    return {
        "started": m("vllm_continuum:implicit_turns_total", event="started"),
        "continued": m("vllm_continuum:implicit_turns_total", event="continued"),
        "handoffs": m("vllm_continuum:pins_released_total", reason="handoff"),
        "finished": m("vllm_continuum:jobs_ended_total", reason="finish_action"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm-continuum-mswea-ab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", default="fcfs,continuum", help="comma-separated policies")
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--num-blocks", type=int, default=72, help="KV pool in blocks of 32 tokens")
    parser.add_argument("--ttl-s", type=float, default=60.0, help="plugin arms' cold-start TTL")
    parser.add_argument("--flood", action="store_true", help="competing one-shot traffic during the run")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    args = parser.parse_args(argv)
    print(f"CPU: {cpu_name()}; every arm serves in {serving_dtype()}", flush=True)
    rows = []
    for arm in [a.strip() for a in args.arms.split(",") if a.strip()]:
        with VLLMServer(args.model, server_args(arm, args.num_blocks, args.ttl_s), served_name="smollm2") as server:
            started = time.time()
            agents = run_agents(server.url, args.agents, with_flood=args.flood)
            elapsed = time.time() - started
            time.sleep(0.5)  # let the plugin publish its last counters
            counters = plugin_counters(server) if arm != "fcfs" else {}
        calls = [c for a in agents for c in a["calls"]]
        rows.append({
            "arm": arm,
            "submitted": sum(a["exit_status"] == "Submitted" for a in agents),
            "turns": len(calls),
            "cached": f"{later_turn_cached_share(agents):.0%}",
            "seconds": round(elapsed, 1),
            **{k: int(v) for k, v in counters.items()},
        })
        print(f"  [{arm}] done in {elapsed:.0f}s", flush=True)
    columns = [("arm", "arm", ""), ("submitted", "agents ok", ""), ("turns", "turns", ""),
               ("cached", "later turns cached", ""), ("seconds", "wall s", ""),
               ("started", "implicit jobs", ""), ("continued", "turns recognised", ""),
               ("handoffs", "hand-offs", ""), ("finished", "ended by finish", "")]
    print(format_table([{k: r.get(k, "-") for k, _, _ in columns} for r in rows], columns))
    return 0 if all(r["submitted"] == args.agents for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
