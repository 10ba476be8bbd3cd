"""Continuum on top of vLLM's own CPU KV offloading (``OffloadingConnector``).

vLLM configured the way it documents native offloading
(``--kv-offloading-size``, ``--kv-offloading-backend native``); on this CPU
platform the plugin's ``CPUPlatformOffloadingSpec`` is named as the spec
(vLLM's own refuses non-GPU platforms). The check: a job's pin lapses, other
traffic evicts the job's blocks from the GPU prefix cache, and the job's next
turn loads them from vLLM's offload store -- the same tokens a cold recompute
gives.

No check races the TTL: the pin is waited for through the ``ttl`` release
counter, bounded by ``wait_for``'s 120 s.
"""

from __future__ import annotations

import os
import time

import pytest
import requests
from harness import DEFAULT_MODEL, filler, post_chat, serve_args, wait_for

from vllm_continuum_plugin.benchmarks.ab_benchmark import native_offload_args
from vllm_continuum_plugin.benchmarks.server import VLLMServer

pytestmark = pytest.mark.e2e



@pytest.fixture(scope="module")
def server():
    if not os.path.isdir(DEFAULT_MODEL):
        pytest.fail(f"embedded model missing at {DEFAULT_MODEL}: run scripts/setup.sh")
    # Prefetch on (opt-in): the last test's agent gets its context back
    # from vLLM's store before its tool returns.
    args = [*serve_args("continuum", 48, 400_000_000, 1024, continuum={"prefetch": True}),
            *native_offload_args(250_000_000)]
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
    with VLLMServer(DEFAULT_MODEL, args, served_name="smollm2", env=env) as srv:
        yield srv


def test_a_lapsed_pin_is_reloaded_from_vllms_offload_store_exactly(server):
    # vLLM's OffloadingConnector is the one serving (its own metrics).
    assert "vllm:kv_offload_store_bytes" in requests.get(server.url + "/metrics", timeout=10).text
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": filler("task", 380)}]
    first = post_chat(server, "native-job", messages, last=False, expected_tool_seconds=0.3)
    prompt1 = first["usage"]["prompt_tokens"]
    assert wait_for(lambda: server.metric("vllm_continuum:pins_created") >= 1)
    # The tool takes longer than the TTL: the pin lapses, the blocks are free...
    assert wait_for(lambda: server.metric("vllm_continuum:pins_released_total", reason="ttl") >= 1)
    # ...and other traffic's prompts take the whole 48-block pool. (Chat
    # requests, not ended jobs: an ended job's own blocks are evicted first,
    # so a flood of one-turn jobs would leave the lapsed context on the GPU.)
    for i in range(4):
        r = requests.post(server.url + "/v1/chat/completions", timeout=300, json={
            "model": "smollm2", "messages": [{"role": "user", "content": filler(f"other {i}", 380)}],
            "max_tokens": 12, "temperature": 0.0, "ignore_eos": True})
        assert r.status_code == 200, r.text
    stored = server.metric("vllm:kv_offload_store_bytes")
    assert stored > 0
    external0 = server.metric("vllm:external_prefix_cache_hits_total")

    messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                 {"role": "user", "content": filler("tool output", 40)}]
    second = post_chat(server, "native-job", messages, last=True, logprobs=True)
    loaded = server.metric("vllm:external_prefix_cache_hits_total") - external0
    # The turn-1 prefix came back from vLLM's store, not from a recompute.
    assert loaded >= (prompt1 // 32 - 1) * 32, (loaded, prompt1)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= loaded

    # Reference: the same request recomputed cold (GPU cache and store reset).
    r = requests.post(server.url + "/reset_prefix_cache", params={"reset_external": "true"}, timeout=60)
    assert r.status_code == 200, r.text
    external1 = server.metric("vllm:external_prefix_cache_hits_total")
    cold = post_chat(server, "reference", messages, last=True, logprobs=True)
    assert server.metric("vllm:external_prefix_cache_hits_total") == external1
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    tokens = lambda r: [t["token"] for t in r["choices"][0]["logprobs"]["content"]]  # noqa: E731
    assert tokens(second) == tokens(cold)
    diff = max(abs(a["logprob"] - b["logprob"]) for a, b in zip(
        second["choices"][0]["logprobs"]["content"], cold["choices"][0]["logprobs"]["content"]))
    assert diff < 2e-2, diff
    # Every pin ended, every block is free.
    assert wait_for(lambda: server.metric("vllm_continuum:pinned_blocks") == 0)
    assert wait_for(lambda: server.metric("vllm:kv_cache_usage_perc") == 0)


# The agent's tool takes at least this long, and at least TOOL_TURNS times
# the agent's first turn on this machine: the prefetch is due at the tool's
# time less twice the reload of the context, priced as its prefill until a
# load is measured, so the GPU reset below comes well before it on any CPU.
MIN_TOOL_S = 6.0
TOOL_TURNS = 8


def test_a_context_reset_from_the_gpu_is_prefetched_from_the_store_before_the_tool_returns(server):
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": filler("prefetch task", 300)}]
    started0 = server.metric("vllm_continuum:prefetches_total", outcome="started")
    loaded0 = server.metric("vllm_continuum:prefetches_total", outcome="loaded")
    # Five turns that call the same tool, tool_s apart: the scope's measured
    # times of the tool say when it is back. While the context stays on the
    # GPU (its pin), a due plan loads nothing.
    tool_s = MIN_TOOL_S
    for k in range(5):
        t0 = time.monotonic()
        reply = post_chat(server, "prefetch-job", messages, last=False, tool_name="pytest")
        if k == 0:
            tool_s = max(MIN_TOOL_S, TOOL_TURNS * (time.monotonic() - t0))
        messages += [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                     {"role": "user", "content": filler(f"tool output {k}", 20)}]
        if k < 4:
            time.sleep(tool_s)
    prompt5 = reply["usage"]["prompt_tokens"]
    assert server.metric("vllm_continuum:prefetches_total", outcome="started") == started0
    # The fifth tool runs: the GPU's prefix cache is reset (vLLM's store
    # keeps the context; the plugin lets its pins go first) ...
    r = requests.post(server.url + "/reset_prefix_cache", timeout=60)
    assert r.status_code == 200, r.text
    external0 = server.metric("vllm:external_prefix_cache_hits_total")
    # ... and the plugin loads the context back before the tool is due
    # (no race: the turn is sent only once the load is reported).
    assert wait_for(lambda: server.metric("vllm_continuum:prefetches_total", outcome="loaded") >= loaded0 + 1,
                    timeout=tool_s + 120.0)
    assert server.metric("vllm_continuum:prefetches_total", outcome="started") == started0 + 1
    prefetched = server.metric("vllm:external_prefix_cache_hits_total") - external0

    nxt = post_chat(server, "prefetch-job", messages, last=True, logprobs=True)
    # The turn's prefix was on the GPU: a local hit over the fifth turn's
    # context, nothing more loaded for it than the prefetch loaded.
    assert nxt["usage"]["prompt_tokens_details"]["cached_tokens"] >= (prompt5 // 32 - 1) * 32
    assert server.metric("vllm:external_prefix_cache_hits_total") - external0 == prefetched

    # The prefetched KV is exact: the same request recomputed cold.
    r = requests.post(server.url + "/reset_prefix_cache", params={"reset_external": "true"}, timeout=60)
    assert r.status_code == 200, r.text
    cold = post_chat(server, "reference-2", messages, last=True, logprobs=True)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    tokens = lambda r: [t["token"] for t in r["choices"][0]["logprobs"]["content"]]  # noqa: E731
    assert tokens(nxt) == tokens(cold)
    # Every pin ended, every block is free.
    assert wait_for(lambda: server.metric("vllm_continuum:pinned_blocks") == 0)
    assert wait_for(lambda: server.metric("vllm:kv_cache_usage_perc") == 0)
