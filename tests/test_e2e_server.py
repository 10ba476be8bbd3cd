"""End to end: real `vllm serve --scheduling-policy continuum`, real model.

One server (the embedded SmolLM2-135M-Instruct, block size 32, a 96-block KV
pool) serves all checks in this module; each test uses its own job ids.

No check races a TTL against the machine's speed. The server's cold-start
TTL is ``LONG_TTL_S``, longer than any workload here takes on a slow machine,
and every job that is not ended by a last step asks for a short TTL with its
own ``expected_tool_seconds``; checks that a pin lapsed wait for the TTL
counter (bounded by ``harness.wait_for``'s 120 s), and checks that something did *not* happen
first wait for a later event that is published after it (a barrier).
"""

from __future__ import annotations

import os
import re
import time

import openai
import pytest
import requests
from harness import DEFAULT_MODEL, wait_for
from vllm_continuum_plugin.benchmarks.server import VLLMServer

pytestmark = pytest.mark.e2e

NUM_BLOCKS = 96
LONG_TTL_S = 600  # cold-start TTL: outlives the flood test on any machine
SHORT_TOOL_S = 0.3  # a job's own estimate -> a TTL of (0.3 + 2.5 s cold-start round trip) * 1.2 + 0.05 = 3.41 s
BLOCK = 32
BASH_REGEX = r"```bash\n(ls|cat main\.py|git status)\n```"


@pytest.fixture(scope="module")
def server():
    if not os.path.isdir(DEFAULT_MODEL):
        pytest.fail(f"embedded model missing at {DEFAULT_MODEL}: run scripts/setup.sh")
    args = [
        "--scheduling-policy", "continuum",
        "--block-size", str(BLOCK),
        "--num-gpu-blocks-override", str(NUM_BLOCKS),
        "--kv-cache-memory-bytes", "400000000",
        "--max-model-len", "2048",
        "--max-num-seqs", "8",
        "--enforce-eager",
        "--enable-prompt-tokens-details",
        "--additional-config", '{"continuum": {"default_ttl_s": %d, "max_ttl_s": %d}}' % (LONG_TTL_S, LONG_TTL_S),
    ]
    with VLLMServer(DEFAULT_MODEL, args, served_name="smollm2", env={"VLLM_LOGGING_LEVEL": "DEBUG"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


SYSTEM = "You are a software agent. Answer with exactly one ```bash block."
TOOL_OUTPUTS = [
    "main.py  test_main.py  README.md  setup.py",
    "def add(a, b):\n    return a - b\n" * 6,
    "./main.py:3: # TODO handle overflow\n./test_main.py:9: # TODO more tests\n" * 4,
    "On branch main\nChanges not staged for commit:\n  modified:   main.py\n" * 3,
]


def chat(client, messages, job_id, last, max_tokens=24, **extra):
    return client.chat.completions.create(
        model="smollm2",
        messages=messages,
        max_tokens=max_tokens,
        temperature=0.0,
        extra_body={"job_id": job_id, "is_last_step": last,
                    "structured_outputs": {"regex": BASH_REGEX}, **extra},
    )


def kv_usage(server) -> float:
    return server.metric("vllm:kv_cache_usage_perc")



def barrier(server, client, name: str) -> None:
    """Wait until everything the engine did before now is on ``/metrics``:
    a marker turn that creates one pin (which lapses in 3.41 s) is finished
    and published after every earlier request."""
    created = server.metric("vllm_continuum:pins_created")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "List the files."}]
    chat(client, messages, f"barrier-{name}", False, max_tokens=8, expected_tool_seconds=SHORT_TOOL_S)
    assert wait_for(lambda: server.metric("vllm_continuum:pins_created") >= created + 1)


def test_field_report_check_pins_hold_through_tool_gaps_and_drop_after_last_step(server, client):
    """The field report's verification, on stock vLLM + plugin."""
    assert wait_for(lambda: kv_usage(server) == 0.0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "List the files."}]
    usage_by_turn, cached = [], []
    for turn in range(5):
        last = turn == 4
        r = chat(client, messages, "field-report", last)
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        if last:
            break
        assert wait_for(lambda: server.metric("vllm_continuum:pinned_blocks") > 0)
        during_gap = []
        for _ in range(3):  # the tool "runs"
            time.sleep(0.3)
            during_gap.append(kv_usage(server))
        assert during_gap[0] > 0 and len(set(during_gap)) == 1, during_gap
        assert server.metric("vllm_continuum:pinned_blocks") > 0
        usage_by_turn.append(during_gap[0])
        messages += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": TOOL_OUTPUTS[turn]},
        ]
    assert usage_by_turn == sorted(usage_by_turn)  # context grows
    assert all(c > 0 for c in cached[1:]), cached  # every later turn hit the pin
    assert wait_for(lambda: kv_usage(server) == 0.0), "blocks left after the last step"
    assert wait_for(lambda: server.metric("vllm_continuum:pinned_blocks") == 0)
    # Each pin was taken over by the job's next turn.
    assert server.metric("vllm_continuum:pins_released_total", reason="handoff") >= 4
    log = open(server.log_path).read()
    assert re.search(r"job field-report .* tool '(ls|cat|git status)'", log), "tool call not parsed"


def test_next_turn_hits_cache_after_other_jobs_flood_the_pool(server, client):
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Read the code.\n" + TOOL_OUTPUTS[1] * 4}]
    first = chat(client, messages, "flooded", False)
    pinned_tokens = (first.usage.prompt_tokens + first.usage.completion_tokens - 1) // BLOCK * BLOCK
    # Other jobs push ~2x the pool's capacity through it, one at a time, so
    # stock vLLM would have evicted the first turn's freed blocks.
    filler = "lorem ipsum dolor sit amet " * 200  # ~1,400 tokens each
    for i in range(4):
        client.completions.create(model="smollm2", prompt=f"{i} {filler}", max_tokens=1)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Now run the tests."}]
    second = chat(client, messages, "flooded", True)
    assert second.usage.prompt_tokens_details.cached_tokens >= pinned_tokens - BLOCK


def test_vllm_xargs_and_session_id_forms_create_pins(server, client):
    before = server.metric("vllm_continuum:pins_created")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Status?"}]
    # (Short TTLs: these jobs never send a last step.)
    client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=8,
        extra_body={"vllm_xargs": {"job_id": "xargs-job", "is_last_step": False,
                                   "expected_tool_seconds": SHORT_TOOL_S}},
    )
    client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=8,
        extra_headers={"X-Session-ID": "session-job"},
        extra_body={"expected_tool_seconds": SHORT_TOOL_S},
    )
    assert wait_for(lambda: server.metric("vllm_continuum:pins_created") >= before + 2)


def test_a_session_header_and_a_last_step_flag_on_the_final_turn_end_the_job(server, client):
    # What AIPerf can send (docs/clients.md): X-Session-ID on every turn, and
    # a per-turn `extra` of {"is_last_step": true} on the conversation's last
    # one only. Prose replies never end the session; the flag does, at once.
    ended = server.metric("vllm_continuum:jobs_ended_total", reason="last_step")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Describe the repo."}]
    headers = {"X-Session-ID": "aiperf-conv-7"}
    first = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8, extra_headers=headers)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And its tests?"}]
    client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8, extra_headers=headers,
                                   extra_body={"is_last_step": True})
    assert wait_for(lambda: server.metric("vllm_continuum:jobs_ended_total", reason="last_step") == ended + 1)


def test_request_without_job_id_is_served_and_never_pinned(server, client):
    before = server.metric("vllm_continuum:pins_created")
    r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    assert r.choices[0].finish_reason in ("stop", "length")
    barrier(server, client, "untagged")
    assert server.metric("vllm_continuum:pins_created") == before + 1  # the barrier's pin only


@pytest.mark.parametrize("field, value", [
    ("is_last_step", "maybe"), ("is_last_step", 2), ("job_id", ["a", "b"]), ("job_id", ""),
    # Past 64 bits msgspec cannot carry an integer to the engine (was a 500).
    ("job_id", 10**29),
    # Hints are parsed on the engine thread and kept per job: bounded.
    ("tool_command", " " * 16385), ("tool_name", "x" * 300),
    ("expected_tool_seconds", 10**400), ("expected_tool_seconds", 1e308),
])
@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
def test_malformed_metadata_is_a_400_naming_the_field(server, field, value, endpoint):
    body = {"model": "smollm2", "max_tokens": 3, "job_id": "bad-input", "is_last_step": False}
    if endpoint == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "hi"}]
    elif endpoint == "/v1/completions":
        body["prompt"] = "hi"
    else:
        body = {"model": "smollm2", "input": "hi", "max_output_tokens": 3, "job_id": "bad-input",
                "is_last_step": False}
    body[field] = value
    r = requests.post(server.url + endpoint, json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert field in r.text and len(r.text) < 2000  # long values are quoted in part


@pytest.mark.parametrize("length", [300, 16 * 1024])
def test_a_session_id_that_cannot_be_a_job_id_is_a_400(server, length):
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=30,
                      headers={"X-Session-ID": "s" * length})
    assert r.status_code == 400, r.text[:300]
    assert "session_id" in r.text and len(r.text) < 2000
    assert requests.get(server.url + "/health", timeout=10).status_code == 200


def test_a_second_client_reusing_a_job_id_cannot_release_its_pin(server, client):
    # Client A's first turn is pinned (cold-start TTL: LONG_TTL_S).
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Client A's task: fix the overflow in main.py. " * 8}]
    first = chat(client, messages, "shared-id", False)
    assert wait_for(lambda: server.metric("vllm_continuum:pinned_jobs") >= 1)
    released = {r: server.metric("vllm_continuum:pins_released_total", reason=r) for r in ("handoff", "last_step")}
    # Client B names the same job id with a conversation of its own, and ends "the job".
    other = [{"role": "system", "content": SYSTEM},
             {"role": "user", "content": "Client B's unrelated question about the weather. " * 8}]
    chat(client, other, "shared-id", True)
    barrier(server, client, "shared-id-barrier")
    for reason, value in released.items():
        assert server.metric("vllm_continuum:pins_released_total", reason=reason) == value, reason
    # A's next turn still finds its context pinned, and its last step ends the job.
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": TOOL_OUTPUTS[0]}]
    second = chat(client, messages, "shared-id", True)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - BLOCK
    assert wait_for(lambda: server.metric("vllm_continuum:pins_released_total", reason="handoff")
                    == released["handoff"] + 1)


def test_short_ttl_expires_while_engine_is_idle(server, client):
    # The client's own estimate gives a short TTL (about 3.4 s, round trip included).
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "List the files."}]
    assert wait_for(lambda: server.metric("vllm_continuum:pinned_blocks") == 0)  # earlier pins gone
    before = server.metric("vllm_continuum:pins_released_total", reason="ttl")
    chat(client, messages, "short-ttl", False, expected_tool_seconds=SHORT_TOOL_S)
    # Nothing else runs: only the expiry wake-up can release it.
    assert wait_for(lambda: server.metric("vllm_continuum:pins_released_total", reason="ttl") == before + 1)
    assert wait_for(lambda: server.metric("vllm_continuum:pinned_blocks") == 0)


ABORTED_MAX_TOKENS = 1900  # nearly max_model_len: more decode steps than a starved client needs to hang up


def test_abandoned_stream_is_aborted_without_pin(server, client):
    created = server.metric("vllm_continuum:pins_created")
    generated = server.metric("vllm:generation_tokens_total")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Explain everything."}]
    # A reply that cannot end by itself before the client walks away: no EOS,
    # nearly the whole context to fill against the three chunks the client
    # reads. Were it to finish first anyway (a starved client), its pin asks
    # for a short TTL, so the module's last check still sees every block free.
    stream = client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=ABORTED_MAX_TOKENS, stream=True,
        extra_body={"job_id": "aborted-job", "is_last_step": False, "ignore_eos": True,
                    "expected_tool_seconds": SHORT_TOOL_S},
    )
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    # The abort has reached the engine once nothing runs; then a barrier.
    assert wait_for(lambda: server.metric("vllm:num_requests_running") == 0)
    barrier(server, client, "abort")
    # It was cut short (vLLM counts no finish for an abort): far fewer tokens
    # than its max_tokens, the barrier's 8 included.
    assert server.metric("vllm:generation_tokens_total") - generated < ABORTED_MAX_TOKENS
    assert server.metric("vllm_continuum:pins_created") == created + 1  # the barrier's pin only


def test_zz_all_blocks_free_once_jobs_end_and_ttls_lapse(server):
    """Runs last in this module: pins left by non-final turns lapse (TTL),
    and then every KV block is free again."""
    assert wait_for(lambda: server.metric("vllm_continuum:pinned_blocks") == 0 and kv_usage(server) == 0.0)
    # The pins that ended that way lapsed: xargs, session, short-ttl, barriers.
    assert server.metric("vllm_continuum:pins_released_total", reason="ttl") >= 4
