"""End to end: retention directives on a real ``vllm serve`` (issue 34).

A real ``vllm serve --scheduling-policy continuum`` (the embedded
SmolLM2-135M-Instruct, a 48-block pool of 32 tokens) gets a conversation --
a shared system prompt and its history -- then a flood of unrelated prompts
about three times the pool, then the conversation's next turn. Without
directives the flood evicts it (stock LRU: the next turn re-prefills);
with vLLM PR #38514's ``retention_directives`` (or TensorRT-LLM's
``kv_cache_retention_config``) the covered blocks are served from cache
(``usage.prompt_tokens_details.cached_tokens``). Both spellings are
accepted on ``/v1/chat/completions``, ``/v1/completions`` and
``/v1/messages`` (top level and through ``vllm_xargs`` as JSON text), and a
malformed one is an HTTP 400 naming its field, counted on ``/metrics``.

No check races the clock: every hold outlives the test on any machine.
"""

from __future__ import annotations

import json
import os

import pytest
import requests
from harness import DEFAULT_MODEL, filler, wait_for

from vllm_continuum_plugin.benchmarks.server import VLLMServer

pytestmark = pytest.mark.e2e

SYSTEM = "You are a coding agent working in a large repository. " + filler("system", 150)
HISTORY = [
    {"role": "user", "content": "Fix the failing test in utils. " + filler("task", 120)},
    {"role": "assistant", "content": "I will read the test first."},
    {"role": "user", "content": "Tool output: " + filler("output", 120)},
]
KEEP = [{"start": 0, "end": 100_000, "priority": 90, "duration": 3600}]
KEEP_TRT = {"token_range_retention_configs": [{"token_start": 0, "token_end": None, "priority": 90,
                                               "duration_ms": 3_600_000}]}


@pytest.fixture(scope="module")
def server():
    if not os.path.isdir(DEFAULT_MODEL):
        pytest.fail(f"embedded model missing at {DEFAULT_MODEL}: run scripts/setup.sh")
    args = [
        "--scheduling-policy", "continuum", "--block-size", "32", "--num-gpu-blocks-override", "48",
        "--kv-cache-memory-bytes", "400000000", "--max-model-len", "1024", "--max-num-seqs", "2",
        "--enforce-eager", "--enable-prompt-tokens-details",
        "--additional-config", json.dumps({"continuum": {"retention_max_s": 3600, "max_pinned_fraction": 0.6}}),
    ]
    with VLLMServer(DEFAULT_MODEL, args, served_name="smollm2") as srv:
        yield srv


def chat(server, system: str, messages: list[dict], **fields) -> dict:
    body = {"model": "smollm2", "max_tokens": 4, "temperature": 0.0,
            "messages": [{"role": "system", "content": system}, *messages], **fields}
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def flood(server, tag: str) -> None:
    """Eight unrelated prompts of ~18 blocks: three times the pool."""
    for i in range(8):
        body = {"model": "smollm2", "max_tokens": 1, "prompt": f"{tag} {i}: " + filler(f"{tag}{i}", 400)}
        r = requests.post(server.url + "/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text


def cached(response: dict) -> int:
    return (response["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


@pytest.mark.parametrize("spelling", ["none", "retention_directives", "kv_cache_retention_config"])
def test_a_directive_keeps_the_system_prompt_and_history_across_a_flood(server, spelling):
    # Each arm its own system prompt (shared by its turns): an arm's hold
    # must not serve another arm.
    system = f"[{spelling}] " + SYSTEM
    fields = {"retention_directives": KEEP, "retention_scope": f"conv-{spelling}"} if spelling == "retention_directives" \
        else {"kv_cache_retention_config": KEEP_TRT} if spelling != "none" else {}
    first = chat(server, system, HISTORY, **fields)
    prompt_tokens = first["usage"]["prompt_tokens"]
    flood(server, f"flood-{spelling}")
    reply = first["choices"][0]["message"]["content"]
    nxt = chat(server, system, [*HISTORY, {"role": "assistant", "content": reply},
                        {"role": "user", "content": "Tool output: done."}], **fields)
    if spelling == "none":
        assert cached(nxt) < 64, nxt["usage"]  # stock LRU: the flood took it (at most a shared block)
    else:
        # Every full block of the first prompt, system prompt and history.
        assert cached(nxt) >= (prompt_tokens // 32 - 1) * 32, (prompt_tokens, nxt["usage"])
        assert server.metric("vllm_continuum:retention_directives", outcome="accepted") >= 1


def test_both_spellings_are_accepted_on_every_endpoint(server):
    trt = {"kv_cache_retention_config": KEEP_TRT}
    pr = {"retention_directives": KEEP, "retention_scope": "s-1"}
    for fields in (pr, trt, {"vllm_xargs": {k: json.dumps(v) if not isinstance(v, str) else v
                                            for k, v in pr.items()}}):
        for path, body in (
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
            ("/v1/completions", {"prompt": "hello there"}),
            ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}]}),
        ):
            r = requests.post(server.url + path, json={"model": "smollm2", "max_tokens": 2, **body, **fields},
                              timeout=300)
            assert r.status_code == 200, (path, fields, r.text)


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": "hello"}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}]}),
])
def test_malformed_directives_are_a_400_naming_the_field(server, path, body):
    before = server.metric("vllm_continuum:retention_directives", outcome="refused")
    bad = [
        ({"retention_directives": [{"start": 0, "end": 10, "priority": 500}]}, "retention_directives[0].priority"),
        ({"retention_directives": [{"start": 9, "end": 3, "priority": 50}]}, "retention_directives[0].end"),
        ({"kv_cache_retention_config": {"token_range_retention_configs": [
            {"token_start": 0, "token_end": 4, "priority": 50, "duration_ms": -5}]}},
         "kv_cache_retention_config.token_range_retention_configs[0].duration_ms"),
        ({"retention_directives": [{"start": i, "end": i + 1, "priority": 100} for i in range(10_000)]},
         "retention_directives"),
    ]
    for fields, field in bad:
        r = requests.post(server.url + path, json={"model": "smollm2", "max_tokens": 2, **body, **fields}, timeout=300)
        assert r.status_code == 400 and field in r.text, (path, field, r.status_code, r.text[:300])
    assert wait_for(lambda: server.metric("vllm_continuum:retention_directives", outcome="refused") >= before + len(bad))
