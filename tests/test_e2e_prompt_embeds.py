"""Threat model, finding 7, end to end: ``prompt_embeds`` requests on a real
``vllm serve --scheduling-policy continuum --enable-prompt-embeds``.

Before the fix, the second of two identical untagged ``prompt_embeds``
requests got HTTP 500, the EngineCore died and ``/health`` refused
connections from then on: implicit-job matching sliced ``prompt_token_ids``,
which is ``None`` for such a request. Such requests carry no token ids to
find a next turn by, so the plugin serves untagged ones as stock vLLM does;
a client that names a job on them gets that job's treatment, never a crash
or a leaked block.

No check races a clock: every wait is for a counter or the pool to settle,
bounded by the server's own request timeout.
"""

from __future__ import annotations

import base64
import io
import json
import os

import pytest
import requests
import torch
from harness import DEFAULT_MODEL, serve_args, wait_for

from vllm_continuum_plugin.benchmarks.server import VLLMServer

pytestmark = pytest.mark.e2e

TOKENS = 96  # as in the finding: 96 x hidden-size embeddings


@pytest.fixture(scope="module")
def server():
    if not os.path.isdir(DEFAULT_MODEL):
        pytest.fail(f"embedded model missing at {DEFAULT_MODEL}: run scripts/setup.sh")
    args = serve_args("continuum", num_blocks=64, kv_bytes=400_000_000, max_model_len=1024,
                      continuum={"default_ttl_s": 600, "max_ttl_s": 600})
    with VLLMServer(DEFAULT_MODEL, args + ["--enable-prompt-embeds"], served_name="smollm2") as srv:
        yield srv


def embeds_b64(seed: int) -> str:
    """A (TOKENS, hidden_size) fp32 tensor, as a client serialises it."""
    with open(os.path.join(DEFAULT_MODEL, "config.json")) as f:
        hidden = json.load(f)["hidden_size"]
    generator = torch.Generator().manual_seed(seed)
    buffer = io.BytesIO()
    torch.save(torch.randn(TOKENS, hidden, generator=generator) * 0.02, buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def complete_embeds(server, embeds: str, **extra) -> requests.Response:
    body = {"model": "smollm2", "prompt_embeds": embeds, "max_tokens": 8, "temperature": 0.0, **extra}
    return requests.post(server.url + "/v1/completions", json=body, timeout=300)


def pool_is_free(server) -> bool:
    return server.metric("vllm_continuum:pinned_blocks") == 0 and server.metric("vllm:kv_cache_usage_perc") == 0


def test_two_identical_untagged_prompt_embeds_requests_are_served_and_the_server_stays_up(server):
    embeds = embeds_b64(1)
    for _ in range(2):  # the second one used to kill the EngineCore
        r = complete_embeds(server, embeds)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] is not None
    assert requests.get(server.url + "/health", timeout=30).status_code == 200
    assert wait_for(lambda: pool_is_free(server))  # served as stock: nothing pinned, nothing leaked


def test_a_prompt_embeds_job_is_served_and_its_last_step_leaves_the_pool_free(server):
    """A client that names a job on ``prompt_embeds`` turns: each is served,
    the server stays up, and when the job ends nothing stays pinned or
    allocated (the second turn continues the first's embeddings)."""
    first = embeds_b64(2)
    r = complete_embeds(server, first, job_id="embeds-job", is_last_step=False)
    assert r.status_code == 200, r.text
    tensor = torch.load(io.BytesIO(base64.b64decode(first)), weights_only=True)
    longer = io.BytesIO()
    torch.save(torch.cat([tensor, tensor[:32] * 0.5]), longer)
    r = complete_embeds(server, base64.b64encode(longer.getvalue()).decode(), job_id="embeds-job", is_last_step=True)
    assert r.status_code == 200, r.text
    assert requests.get(server.url + "/health", timeout=30).status_code == 200
    assert wait_for(lambda: pool_is_free(server))


def test_token_traffic_still_gets_pins_after_prompt_embeds_requests(server):
    """The embeddings requests did not wedge the plugin: an ordinary agent
    turn is still pinned and handed over."""
    created = server.metric("vllm_continuum:pins_created")
    prompt = "You are a coding agent. Fix the failing test in utils.py and run pytest. " * 6
    r = requests.post(server.url + "/v1/completions", json={
        "model": "smollm2", "prompt": prompt, "max_tokens": 8, "temperature": 0.0,
        "job_id": "tokens-job", "is_last_step": False}, timeout=300)
    assert r.status_code == 200, r.text
    assert wait_for(lambda: server.metric("vllm_continuum:pins_created") >= created + 1)
    r = requests.post(server.url + "/v1/completions", json={
        "model": "smollm2", "prompt": prompt + r.json()["choices"][0]["text"] + " Tool output: ok.",
        "max_tokens": 8, "temperature": 0.0, "job_id": "tokens-job", "is_last_step": True}, timeout=300)
    assert r.status_code == 200, r.text
    assert wait_for(lambda: pool_is_free(server))
