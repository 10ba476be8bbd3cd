"""Helpers of the tests: the in-process engine rig and the end-to-end ones.

The scheduler-level rig (a real vLLM ``Scheduler`` driven without model
weights: ``make_scheduler``, ``make_request``, ``step``, ...) lives in
``benchmarks/engine_rig.py``, shared with the in-process benchmarks, and is
re-exported here; see its docstring for the fake model and the manual clock.
This module adds what only the tests use: the models and dtype the engine
tests start, the tiny model's tokenizer, polling, and ``vllm serve`` helpers.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterable
from typing import Any

from vllm_continuum_plugin.benchmarks.dtype import serving_dtype
from vllm_continuum_plugin.benchmarks.engine_rig import (  # noqa: F401 (re-exported for the tests)
    ARRIVAL_SPACING_S,
    MODELS_DIR,
    REPLIES,
    TINY_MODEL,
    _init_hashing,
    admitted_cached_tokens,
    fake_model_output,
    free_blocks,
    make_request,
    make_scheduler,
    prompt_of,
    run_until_finished,
    scripted,
    step,
    usable_blocks,
)

DEFAULT_MODEL = os.path.join(MODELS_DIR, "smollm2-135m-instruct")
# Every real engine the tests start computes in this dtype (bf16 only where
# the CPU has it natively; fp32 elsewhere): comparisons stay like with like.
ENGINE_DTYPE = serving_dtype()


@functools.cache
def _tiny_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_MODEL)


def tiny_tokens(text: str) -> list[int]:
    """``text`` as the tiny test model's token ids (no special tokens): a
    scripted reply the scheduler decodes back into that text."""
    return _tiny_tokenizer().encode(text, add_special_tokens=False)


def wait_for(predicate: Any, timeout: float = 120.0, interval: float = 0.05) -> bool:
    """Poll until ``predicate()`` holds, at most ``timeout`` seconds (for
    events a server publishes asynchronously: the plugin's counters come
    from a thread every 0.1 s, and how soon it runs depends on the machine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


FILLER_WORDS = "the file test function error value return module class import line call result".split()


def filler(tag: str, n: int) -> str:
    """``tag`` and ``n`` words: a prompt of a known size, distinct per tag."""
    return tag + ": " + " ".join(FILLER_WORDS[(i * 5 + len(tag)) % len(FILLER_WORDS)] for i in range(n))


def post_chat(server: Any, job: str, messages: list[dict], last: bool, model: str = "smollm2",
              **extra: Any) -> dict:
    """One greedy 12-token chat turn of ``job`` on ``server`` (200 asserted)."""
    import requests

    body = {"model": model, "messages": messages, "max_tokens": 12, "temperature": 0.0,
            "ignore_eos": True, "job_id": job, "is_last_step": last, **extra}
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def serve_args(policy: str, num_blocks: int, kv_bytes: int, max_model_len: int,
               continuum: dict[str, Any] | None = None, prompt_details: bool = True) -> list[str]:
    """``vllm serve`` arguments the end-to-end tests share: ``policy``,
    32-token blocks, a pool of exactly ``num_blocks``, eager mode, and the
    plugin's ``continuum`` settings (``--additional-config``) if given."""
    import json

    args = [
        "--scheduling-policy", policy, "--block-size", "32", "--num-gpu-blocks-override", str(num_blocks),
        "--kv-cache-memory-bytes", str(kv_bytes), "--max-model-len", str(max_model_len), "--enforce-eager",
    ]
    if prompt_details:
        args.append("--enable-prompt-tokens-details")
    if continuum is not None:
        args += ["--additional-config", json.dumps({"continuum": continuum})]
    return args


def all_free(servers: Iterable[Any]) -> bool:
    """No pinned block and no allocated KV on any live server in ``servers``."""
    return all(s.metric("vllm_continuum:pinned_blocks") == 0 and s.metric("vllm:kv_cache_usage_perc") == 0
               for s in servers if s.alive())
