"""Drive a real vLLM ``Scheduler`` in-process, without model weights.

The engine rig of the scheduler-level tests (``tests/harness.py`` re-exports
it) and of the in-process benchmarks (``scheduler_overhead``). The
scheduler, KV cache manager, block pool and request objects are vLLM's own;
only the model runner is replaced by ``step()`` / ``fake_model_output()``,
which feed the scheduler one sampled token per scheduled request (what a real
runner returns), so the scheduling, prefix caching, pinning and freeing paths
run exactly as in a server.

Time is a :class:`~vllm_continuum_plugin.clock.ManualClock` by default: pins
lapse only when a test calls ``scheduler.clock.advance(...)``, never because
the machine is slow. ``make_request`` stamps arrivals with the clock of the
scheduler made last (advancing it by ``ARRIVAL_SPACING_S`` per request, so
requests arrive in the order they are made), so measured tool times are the
time the test advanced. A benchmark passes ``clock=SYSTEM_CLOCK`` for real
time.

``make_scheduler`` reads only the config and tokenizer of the tiny test
model (``TINY_MODEL``, built by ``scripts/build_models.py``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from typing import Any

import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from vllm_continuum_plugin.clock import SYSTEM_CLOCK, Clock, ManualClock
from vllm_continuum_plugin.registration import register

__all__ = [
    "ARRIVAL_SPACING_S",
    "MODELS_DIR",
    "REPLIES",
    "TINY_MODEL",
    "admitted_cached_tokens",
    "fake_model_output",
    "free_blocks",
    "make_request",
    "make_scheduler",
    "prompt_of",
    "run_until_finished",
    "scripted",
    "step",
    "usable_blocks",
]

MODELS_DIR = os.environ.get("CONTINUUM_MODELS", os.path.expanduser("~/.cache/vllm-continuum/models"))
TINY_MODEL = os.path.join(MODELS_DIR, "tiny-llama")

_ids = itertools.count()
_hash_ready = False
# The clock of the scheduler made last: arrivals are stamped with it.
ARRIVAL_SPACING_S = 1e-3  # a manual clock moves this far per request made
_current_clock: Clock = SYSTEM_CLOCK


def _init_hashing() -> None:
    """vLLM's block hasher needs its root hash set once per process."""
    global _hash_ready
    if not _hash_ready:
        init_none_hash(sha256)
        _hash_ready = True


def make_scheduler(
    policy: str = "continuum",
    num_blocks: int = 64,
    block_size: int = 16,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 4096,
    max_model_len: int = 1024,
    hybrid: bool = False,
    enable_prefix_caching: bool = True,
    continuum: dict[str, Any] | None = None,
    async_scheduling: bool = False,
    clock: Clock | None = None,
    kv_transfer: Any = None,
) -> Scheduler:
    """A real scheduler for ``policy`` ("fcfs" gives vLLM's stock one).
    ``kv_transfer``: a ``KVTransferConfig`` (a connector's scheduler side,
    e.g. vLLM's ``OffloadingConnector``, which needs no GPU there).

    The plugin's schedulers run on ``clock`` (default: a new ``ManualClock``,
    available as ``scheduler.clock``); vLLM's stock one has no clock and
    requests made for it are stamped with the system time.
    """
    global _current_clock
    register()
    _init_hashing()
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        policy=policy,
        async_scheduling=async_scheduling,
    )
    model_config = ModelConfig(model=TINY_MODEL, dtype="float32", seed=0, max_model_len=max_model_len)
    cache_config = CacheConfig(
        block_size=block_size,
        cache_dtype="auto",
        enable_prefix_caching=enable_prefix_caching,
    )
    cache_config.num_gpu_blocks = num_blocks
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
        device_config=DeviceConfig("cpu"),
        additional_config={"continuum": continuum} if continuum else {},
    )
    if kv_transfer is not None:
        vllm_config.kv_transfer_config = kv_transfer
    if async_scheduling:
        # The CPU platform turns async scheduling off; the selection logic
        # and the AsyncScheduler subclass are still exercised here.
        vllm_config.scheduler_config.async_scheduling = True
    full = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    groups = [KVCacheGroupSpec(["layer.0"], full)]
    if hybrid:
        window = SlidingWindowSpec(
            block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32,
            sliding_window=2 * block_size,
        )
        groups.append(KVCacheGroupSpec(["layer.1"], window))
    kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    cls = vllm_config.scheduler_config.get_scheduler_cls()
    kwargs: dict[str, Any] = {}
    if hasattr(cls, "release_expired_pins"):  # one of the plugin's schedulers
        kwargs["clock"] = clock if clock is not None else ManualClock()
    _current_clock = kwargs.get("clock", SYSTEM_CLOCK)
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        log_stats=True,
        **kwargs,
    )


def make_request(
    prompt: list[int],
    max_tokens: int = 4,
    job_id: Any = None,
    is_last_step: Any = None,
    extra: dict[str, Any] | None = None,
    arrival_time: float | None = None,
    block_size: int = 16,
    stop: list[str] | None = None,
) -> Request:
    _init_hashing()
    extra_args: dict[str, Any] = dict(extra or {})
    if job_id is not None:
        extra_args["job_id"] = job_id
    if is_last_step is not None:
        extra_args["is_last_step"] = is_last_step
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args or None, stop=stop)
    if arrival_time is None and isinstance(_current_clock, ManualClock):
        # Requests a test makes one after another arrive in that order, as
        # on a server (job-level FCFS and the preemption order depend on it).
        _current_clock.advance(ARRIVAL_SPACING_S)
    return Request(
        request_id=f"req-{next(_ids)}",
        prompt_token_ids=list(prompt),
        sampling_params=params,
        pooling_params=None,
        arrival_time=_current_clock.time() if arrival_time is None else arrival_time,
        block_hasher=get_request_block_hasher(block_size, sha256),
    )


# Scripted replies: request id -> the tokens the "model" samples for it, in
# order (requests without a script sample ``token``).
REPLIES: dict[str, list[int]] = {}


def scripted(request: Request, reply: list[int]) -> Request:
    """Make the fake model answer ``request`` with ``reply`` (its max_tokens
    should be ``len(reply)``)."""
    REPLIES[request.request_id] = list(reply)
    return request


def fake_model_output(
    scheduler: Scheduler, output: SchedulerOutput, token: int = 7, replies: dict[str, list[int]] | None = None,
    whole_reply: bool = False,
) -> ModelRunnerOutput:
    """What a model runner returns for ``output``: one sampled token per
    scheduled request whose prefill is done (none for a partial prefill).
    The token is the request's next one from ``replies`` when it has a
    script there, else ``token``. ``whole_reply``: a scripted request emits
    all the rest of its script in this step (as speculative decoding may)."""
    req_ids = list(output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for req_id in req_ids:
        request = scheduler.requests[req_id]
        done_prefill = request.num_computed_tokens >= request.num_tokens
        script = replies.get(req_id) if replies else None
        done = request.num_output_tokens
        if script and done < len(script):
            tokens = script[done:] if whole_reply else [script[done]]
        else:
            tokens = [token]
        sampled.append(tokens if done_prefill else [])
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )


def step(scheduler: Scheduler, token: int = 7) -> Any:
    """One engine step: schedule, "run" the model, update from its output."""
    output = scheduler.schedule()
    scheduler.update_from_output(output, fake_model_output(scheduler, output, token, REPLIES))
    return output


def run_until_finished(scheduler: Scheduler, requests: Iterable[Request], max_steps: int = 500) -> int:
    """Step until every request in ``requests`` has finished; returns steps."""
    pending = list(requests)
    for steps in range(1, max_steps + 1):
        step(scheduler)
        if all(r.is_finished() for r in pending):
            return steps
    raise AssertionError(f"requests did not finish in {max_steps} steps")


def prompt_of(job: int, length: int) -> list[int]:
    """A prompt unique to ``job`` (different jobs never share a block)."""
    return [1000 + job] + [(job * 7919 + i) % 900 + 10 for i in range(length - 1)]


def free_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def usable_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1


def admitted_cached_tokens(output: Any, request: Request) -> int | None:
    """Prefix-cache hit (tokens) of ``request`` if it was admitted in ``output``."""
    for new_req in output.scheduled_new_reqs:
        if new_req.req_id == request.request_id:
            return new_req.num_computed_tokens
    return None
