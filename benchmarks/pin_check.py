"""Pin check: the field report's verification, as a tool.

Drives one agent job against a running server (``--url``) and, during every
tool gap, polls ``/metrics`` a few times: a pin holds when the plugin's
``vllm_continuum:pinned_blocks`` stays above zero and ``vllm:kv_cache_usage_perc``
stays constant through the gap. After the last step it checks that the job's
blocks were freed. It also reports each next turn's ``cached_tokens`` (needs
``--enable-prompt-tokens-details`` on the server).

Exit status 0 when every gap held its pin, every later turn hit the cache and
the job left nothing pinned; 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

import openai
import requests

from .server import parse_metrics

TOOL_OUTPUTS = [
    "main.py  test_main.py  README.md  setup.py",
    "def add(a, b):\n    return a - b\n" * 6,
    "./main.py:3: # TODO handle overflow\n./test_main.py:9: # TODO more tests\n" * 4,
    "On branch main\nChanges not staged for commit:\n  modified:   main.py\n" * 3,
    "F.\nE   assert add(2, 2) == 4\n1 failed, 1 passed in 0.01s\n",
]


def total(url: str, prefix: str) -> float:
    metrics = parse_metrics(requests.get(url + "/metrics", timeout=10).text)
    return sum(v for k, v in metrics.items() if k.startswith(prefix))


def check(url: str, model: str, turns: int, gap_s: float, polls: int) -> int:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    job = f"pin-check-{uuid.uuid4().hex[:8]}"
    messages = [
        {"role": "system", "content": "You are a software agent. Answer with one ```bash block."},
        {"role": "user", "content": "The tests fail. Investigate."},
    ]
    ok = True
    print(f"job {job}: {turns} turns, tool gap {gap_s}s, {polls} polls per gap")
    print(f"{'turn':>4} {'prompt':>6} {'cached':>6} {'pinned blocks during gap':>26} {'kv usage during gap':>22}  verdict")
    for turn in range(turns):
        last = turn == turns - 1
        reply = client.chat.completions.create(
            model=model, messages=messages, max_tokens=24, temperature=0.0,
            extra_body={"job_id": job, "is_last_step": last},
        )
        details = reply.usage.prompt_tokens_details
        cached = details.cached_tokens if details else None
        verdict = []
        if turn > 0 and not cached:
            verdict.append("next turn missed the cache")
            ok = False
        pinned, usage = [], []
        if not last:
            time.sleep(0.15)  # the plugin publishes its gauges every 0.1 s
            for _ in range(polls):
                pinned.append(total(url, "vllm_continuum:pinned_blocks"))
                usage.append(total(url, "vllm:kv_cache_usage_perc"))
                time.sleep(gap_s / polls)
            if min(pinned) <= 0 or len(set(usage)) != 1:
                verdict.append("pin did not hold")
                ok = False
        print(f"{turn + 1:>4} {reply.usage.prompt_tokens:>6} {cached if cached is not None else '-':>6} "
              f"{' '.join(f'{p:.0f}' for p in pinned) or '-':>26} "
              f"{' '.join(f'{u:.4f}' for u in usage) or '-':>22}  {'; '.join(verdict) or 'ok'}")
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": TOOL_OUTPUTS[turn % len(TOOL_OUTPUTS)]},
        ]
    time.sleep(0.3)
    left = total(url, "vllm_continuum:pinned_blocks")
    usage_after = total(url, "vllm:kv_cache_usage_perc")
    print(f"after the last step: pinned blocks {left:.0f}, kv usage {usage_after:.4f}")
    if left > 0:
        print("note: other jobs on this server may hold pins; the gauge is server-wide")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vllm-continuum-pin-check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", help="served model name (default: the server's first model)")
    p.add_argument("--turns", type=int, default=5, help="turns of the job (default: 5)")
    p.add_argument("--gap", type=float, default=0.9, help="tool gap in seconds (default: 0.9, below the default TTL)")
    p.add_argument("--polls", type=int, default=3, help="/metrics polls per gap (default: 3)")
    args = p.parse_args(argv)
    url = args.url.rstrip("/")
    model = args.model or requests.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    return check(url, model, args.turns, args.gap, args.polls)


if __name__ == "__main__":
    sys.exit(main())
