"""Continuum on top of LMCache 0.5 as users deploy it: a separate
``lmcache server`` process and vLLM's ``LMCacheMPConnector``, selected with
vLLM's documented ``--kv-offloading-backend lmcache``.

Two ``--scheduling-policy continuum`` replicas share one LMCache server:
pins cover the short tool gaps on a replica, LMCache the long ones, and a
job whose next turn lands on the other replica reloads its prefix from the
shared tier instead of recomputing it.

No check races a TTL: pins that must be handed over live for the 600 s
cold-start TTL, pins that must lapse are waited for through the ``ttl``
release counter (bounded by ``wait_for``'s 120 s).
"""

from __future__ import annotations

import os

import pytest
import requests
from harness import DEFAULT_MODEL, ENGINE_DTYPE, all_free, filler, post_chat, serve_args, wait_for

from vllm_continuum_plugin.benchmarks.lmcache_server import LMCacheServer
from vllm_continuum_plugin.benchmarks.server import VLLMServer, start_all

pytestmark = pytest.mark.e2e

CHUNK = 256  # LMCache stores whole 256-token chunks of prompts


@pytest.fixture(scope="module")
def stack():
    if not os.path.isdir(DEFAULT_MODEL):
        pytest.fail(f"embedded model missing at {DEFAULT_MODEL}: run scripts/setup.sh")
    with LMCacheServer(l1_gb=0.5) as lmcache:
        args = [*serve_args("continuum", 48, 400_000_000, 1024, {"default_ttl_s": 600, "max_ttl_s": 600}),
                *lmcache.vllm_args()]
        cores = max(1, os.cpu_count() or 1)
        replicas = [VLLMServer(DEFAULT_MODEL, args, served_name="smollm2",
                               env={"VLLM_CPU_NUM_OF_RESERVED_CPU": "1", "LMCACHE_TRACK_USAGE": "false",
                                    "VLLM_CPU_OMP_THREADS_BIND": str(i % cores)}) for i in range(2)]
        start_all(replicas)
        try:
            yield lmcache, replicas
        finally:
            for r in replicas:
                r.stop()


def chat(server, job: str, messages: list[dict], last: bool, **extra) -> dict:
    return post_chat(server, job, messages, last, logprobs=True, **extra)


def loaded(server) -> float:
    return server.metric("vllm:external_prefix_cache_hits_total")


def next_turn(messages: list[dict], reply: dict, tag: str) -> list[dict]:
    return messages + [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                       {"role": "user", "content": filler(tag, 40)}]


def test_pins_cover_the_short_gap_and_lmcache_the_long_one(stack):
    _, (a, _) = stack
    # Short gap: the pin (600 s cold-start TTL) hands the KV over; nothing loads.
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": filler("short", 600)}]
    first = chat(a, "short-gap", messages, last=False)
    before, handoff = loaded(a), a.metric("vllm_continuum:pins_released_total", reason="handoff")
    second = chat(a, "short-gap", next_turn(messages, first, "out"), last=True)
    assert wait_for(lambda: a.metric("vllm_continuum:pins_released_total", reason="handoff") == handoff + 1)
    assert loaded(a) == before
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"] - 32

    # Long gap: the pin lapses, other jobs take the 48-block pool, and the
    # next turn's prefix comes back from LMCache instead of a recompute.
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": filler("long", 600)}]
    ttl = a.metric("vllm_continuum:pins_released_total", reason="ttl")
    first = chat(a, "long-gap", messages, last=False, expected_tool_seconds=0.3)
    assert wait_for(lambda: a.metric("vllm_continuum:pins_released_total", reason="ttl") >= ttl + 1)
    # Untagged chat requests, not ended jobs: an ended job's own blocks are
    # evicted first, so one-turn jobs would leave the lapsed context on the GPU.
    for i in range(3):
        r = requests.post(a.url + "/v1/chat/completions", timeout=300, json={
            "model": "smollm2", "messages": [{"role": "user", "content": filler(f"other {i}", 600)}],
            "max_tokens": 12, "temperature": 0.0, "ignore_eos": True})
        assert r.status_code == 200, r.text
    before = loaded(a)
    second = chat(a, "long-gap", next_turn(messages, first, "out"), last=True)
    assert loaded(a) - before >= (first["usage"]["prompt_tokens"] // CHUNK) * CHUNK >= CHUNK
    assert wait_for(lambda: all_free([a]))


def test_a_job_that_moves_replicas_reloads_its_prefix_from_the_shared_tier(stack):
    _, (a, b) = stack
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": filler("moving", 600)}]
    ttl_a = a.metric("vllm_continuum:pins_released_total", reason="ttl")
    first = chat(a, "moving", messages, last=False, expected_tool_seconds=0.3)
    turn2 = next_turn(messages, first, "out")
    # The job's next turn lands on b (a drained, restarted, or a router's choice).
    before = loaded(b)
    moved = chat(b, "moving", turn2, last=True)
    reloaded = loaded(b) - before
    assert reloaded >= (first["usage"]["prompt_tokens"] // CHUNK) * CHUNK >= CHUNK
    assert moved["usage"]["prompt_tokens_details"]["cached_tokens"] >= reloaded
    # Same tokens as a's own KV gives for the same request.
    reference = chat(a, "reference", turn2, last=True)
    tokens = lambda r: [t["token"] for t in r["choices"][0]["logprobs"]["content"]]  # noqa: E731
    assert tokens(moved) == tokens(reference)
    diff = max(abs(x["logprob"] - y["logprob"]) for x, y in zip(
        moved["choices"][0]["logprobs"]["content"], reference["choices"][0]["logprobs"]["content"]))
    # bf16 (where the CPU has it) rounds the reloaded prefix's attention
    # otherwise than a fresh prefill's: a few hundredths of a logprob.
    assert diff < (2e-2 if ENGINE_DTYPE == "float32" else 1e-1), (diff, ENGINE_DTYPE)
    # Nothing leaks on the replica the job left: its pin lapses, every block frees.
    assert wait_for(lambda: a.metric("vllm_continuum:pins_released_total", reason="ttl") >= ttl_a + 1)
    assert wait_for(lambda: all_free([a, b]))
