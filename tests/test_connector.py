"""``ContinuumOffloadConnector`` in a real vLLM engine.

Engine tests run vLLM in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
with the connector configured through ``KVTransferConfig`` and check: (a) a
reload is exact (greedy tokens and logprobs equal a cold recompute, on
SmolLM2-135M), (b) the store never exceeds its budget and stays in step with
the scheduler's index, (c) concurrent different prompts of the same length
never see each other's KV, (d) an aborted request leaves no blocks behind
(also with ``store_mode "finish"``, which delays the free until the copy is
done), (e) a Continuum job's turn after its pin expired and other traffic
took its GPU blocks is served by a reload, and ``store_mode "explicit"``
stores exactly what a scheduler hook hands over before freeing it. The
store, the block view, the settings and the stats as pure logic:
tests/test_offload_parts.py.
"""

from __future__ import annotations

import gc
import os
import random

import pytest
from harness import DEFAULT_MODEL, ENGINE_DTYPE, TINY_MODEL

from vllm_continuum_plugin.benchmarks.dtype import dtype_bytes
from vllm_continuum_plugin.connectors import CONNECTOR_MODULE as MODULE

# ----------------------------------------------------------------------
# Real engine (in-process)
# ----------------------------------------------------------------------
_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def _make_llm(
    model: str, cpu_bytes: int, num_blocks: int, store_mode: str = "eager", max_model_len: int = 1024,
    store_backend: str = "cpu", **kw
):
    from vllm import LLM
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer import has_kv_transfer_group
    from vllm.distributed.kv_transfer.kv_transfer_state import ensure_kv_transfer_shutdown

    if has_kv_transfer_group():  # left over by an earlier in-process engine
        ensure_kv_transfer_shutdown()
    kv_cfg = KVTransferConfig(
        kv_connector="ContinuumOffloadConnector",
        kv_connector_module_path=MODULE,
        kv_role="kv_both",
        kv_connector_extra_config={
            "cpu_bytes": cpu_bytes, "store_mode": store_mode, "store_backend": store_backend,
        },
    )
    return LLM(
        model=model,
        block_size=32,
        kv_cache_memory_bytes=64 * 2**20,
        num_gpu_blocks_override=num_blocks,
        max_model_len=max_model_len,
        max_num_seqs=8,
        enforce_eager=True,
        seed=0,
        dtype=ENGINE_DTYPE,
        kv_transfer_config=kv_cfg,
        **kw,
    )


def _shutdown(llm) -> None:
    from vllm.distributed.kv_transfer import has_kv_transfer_group
    from vllm.distributed.kv_transfer.kv_transfer_state import ensure_kv_transfer_shutdown

    if getattr(llm, "_continuum_closed", False):
        return
    llm._continuum_closed = True
    llm.llm_engine.engine_core.shutdown()
    if has_kv_transfer_group():
        ensure_kv_transfer_shutdown()
    gc.collect()


class _Engines:
    """At most one in-process engine at a time (the worker-side connector
    is a process global in vLLM)."""

    current: tuple[str, object] | None = None

    @classmethod
    def get(cls, name: str, factory):
        if cls.current is not None and cls.current[0] == name:
            return cls.current[1]
        cls.close()
        llm = factory()
        cls.current = (name, llm)
        return llm

    @classmethod
    def close(cls) -> None:
        if cls.current is not None:
            _shutdown(cls.current[1])
            cls.current = None


@pytest.fixture(scope="module")
def env():
    saved = {k: os.environ.get(k) for k in _ENV}
    os.environ.update(_ENV)
    try:
        yield
    finally:
        _Engines.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _sched(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


def _worker_connector():
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    return get_kv_transfer_group()


def _assert_store_consistent(llm) -> dict:
    conn = _sched(llm).connector
    worker = _worker_connector()
    index, store = conn.index, worker.worker_store
    assert index.used_bytes <= index.capacity_bytes
    assert store.used_bytes <= store.capacity_bytes
    assert set(index.keys_lru()) == set(store.keys_lru())
    assert index.pinned_bytes == 0 and store.pinned_bytes == 0
    return conn.totals()


def _greedy(max_tokens: int = 12, logprobs: int = 3):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=logprobs, ignore_eos=True)


def _tokens_and_logprobs(out):
    comp = out.outputs[0]
    lps = [step[tok].logprob for tok, step in zip(comp.token_ids, comp.logprobs)]
    return list(comp.token_ids), lps


def _ids(prompt_token_ids: list[int]):
    return {"prompt_token_ids": prompt_token_ids}


@pytest.fixture
def smol(env):
    if not os.path.isdir(DEFAULT_MODEL):
        pytest.skip(f"{DEFAULT_MODEL} not built (scripts/setup.sh)")
    return _Engines.get("smol", lambda: _make_llm(DEFAULT_MODEL, cpu_bytes=400 * 2**20, num_blocks=48))


def test_a_reload_is_exact_on_smollm2(smol):
    """A prompt reloaded from the CPU store (GPU prefix cache reset, or
    evicted by other traffic) gives the cold recompute's greedy tokens and
    logprobs."""
    llm = smol
    sched = _sched(llm)
    conn = sched.connector
    tok = llm.get_tokenizer()
    text = (
        "You are a coding agent. The repository has a failing test in tests/test_io.py; "
        "read the traceback, find the bug in src/io.py and propose a patch. "
    ) * 30
    prompt = tok(text)["input_ids"][:700]
    assert len(prompt) == 700
    cold = llm.generate([_ids(prompt)], _greedy(16, 5), use_tqdm=False)[0]
    assert cold.num_cached_tokens == 0
    cold_tokens, cold_lps = _tokens_and_logprobs(cold)
    assert conn.totals().get("stored_blocks", 0) >= 21  # every full block went to the store

    before = conn.totals().get("load_hit_tokens", 0)
    assert llm.reset_prefix_cache()
    warm = llm.generate([_ids(prompt)], _greedy(16, 5), use_tqdm=False)[0]
    hit = conn.totals().get("load_hit_tokens", 0) - before
    assert hit >= 640 and warm.num_cached_tokens >= 640  # served by reloading
    warm_tokens, warm_lps = _tokens_and_logprobs(warm)
    assert warm_tokens == cold_tokens
    diff = max(abs(a - b) for a, b in zip(cold_lps, warm_lps))
    print(f"\n[exactness] reload after reset: {hit} tokens loaded, max |logprob diff| = {diff:.3g}")
    assert diff < 2e-2

    # Flood the 48-block GPU pool with other prompts: the prefix is evicted
    # from the GPU cache but not from the 400 MiB store.
    flood = [tok(f"Unrelated request number {i}: " + "lorem ipsum dolor " * 60)["input_ids"][:400] for i in range(4)]
    llm.generate([_ids(p) for p in flood], _greedy(2, None), use_tqdm=False)
    before = conn.totals().get("load_hit_tokens", 0)
    again = llm.generate([_ids(prompt)], _greedy(16, 5), use_tqdm=False)[0]
    hit = conn.totals().get("load_hit_tokens", 0) - before
    assert hit > 0
    again_tokens, again_lps = _tokens_and_logprobs(again)
    assert again_tokens == cold_tokens
    diff2 = max(abs(a - b) for a, b in zip(cold_lps, again_lps))
    print(f"[exactness] reload after a flood: {hit} tokens loaded, max |logprob diff| = {diff2:.3g}")
    assert diff2 < 2e-2
    totals = _assert_store_consistent(llm)
    assert totals["loaded_blocks"] * 32 >= totals["load_hit_tokens"] > 0
    assert conn.reload_seconds_per_token() is not None and conn.reload_seconds_per_token() > 0
    print(
        f"[cost] store {1e3 * totals['_store_cost_seconds'] / totals['_store_cost_blocks']:.2f} ms/block, "
        f"reload {1e3 * totals['_load_cost_seconds'] / totals['_load_cost_blocks']:.2f} ms/block "
        f"({totals['loaded_bytes'] / totals['loaded_blocks'] / 1024:.0f} KiB/block); "
        f"reload_seconds_per_token = {conn.reload_seconds_per_token():.2e}"
    )


def test_c_concurrent_same_length_prompts_never_share_kv(smol):
    """Different prompts of the same length (one shared system block, then
    different text), prefilled and reloaded together, give exactly what
    each gives alone: no request ever reads another's blocks."""
    llm = smol
    conn = _sched(llm).connector
    tok = llm.get_tokenizer()
    system = tok("You are a helpful assistant that answers in one short paragraph. " * 4)["input_ids"][:32]
    topics = ["the water cycle", "how a compiler works", "the history of Rome", "why the sky is blue"]
    prompts = []
    for topic in topics:
        body = tok(f" Explain {topic} to a curious student, with one example. " * 20)["input_ids"]
        prompts.append(system + body[: 256 - 32])
    assert {len(p) for p in prompts} == {256}
    params = _greedy(12, 3)
    assert llm.reset_prefix_cache()
    cold = [_tokens_and_logprobs(o) for o in llm.generate([_ids(p) for p in prompts], params, use_tqdm=False)]
    assert llm.reset_prefix_cache()
    before = conn.totals().get("load_hit_tokens", 0)
    warm = [_tokens_and_logprobs(o) for o in llm.generate([_ids(p) for p in prompts], params, use_tqdm=False)]
    # All four reloaded together ((256 - 1) // 32 = 7 blocks each; the
    # shared first block may come from the GPU cache once one has loaded it).
    assert conn.totals()["load_hit_tokens"] - before >= 4 * 6 * 32
    solo = []
    for p in prompts:
        assert llm.reset_prefix_cache()
        solo.append(_tokens_and_logprobs(llm.generate([_ids(p)], params, use_tqdm=False)[0]))
    assert len({tuple(t) for t, _ in solo}) == len(prompts)  # the prompts really differ
    warm_vs_solo = cold_vs_solo = warm_vs_cold = 0.0
    for (ct, cl), (wt, wl), (st, sl) in zip(cold, warm, solo):
        assert ct == wt == st  # greedy tokens identical
        warm_vs_solo = max(warm_vs_solo, *(abs(a - b) for a, b in zip(wl, sl)))
        cold_vs_solo = max(cold_vs_solo, *(abs(a - b) for a, b in zip(cl, sl)))
        warm_vs_cold = max(warm_vs_cold, *(abs(a - b) for a, b in zip(wl, cl)))
    print(
        f"\n[isolation] greedy tokens equal; max |logprob diff|: batch-of-4 reload vs batch-of-4 "
        f"cold = {warm_vs_cold:.3g}; batch vs solo = {warm_vs_solo:.3g} (reload), "
        f"{cold_vs_solo:.3g} (cold) -- {ENGINE_DTYPE} batch-shape noise"
    )
    # Another request's KV would change tokens and logprobs by O(1); what is
    # left is batch-shape rounding noise, the same with and without reloads.
    assert warm_vs_solo < 0.1 and cold_vs_solo < 0.1 and warm_vs_cold < 0.1
    _assert_store_consistent(llm)


def _block_bytes(model_dir: str) -> int:
    """The connector's per-block byte estimate for a Llama checkpoint served
    in ``ENGINE_DTYPE`` with block size 32 (K and V, every layer, 16-byte
    padding per layer)."""
    import json

    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    layers = c["num_hidden_layers"]
    element = dtype_bytes(ENGINE_DTYPE)
    return layers * (2 * 32 * c["num_key_value_heads"] * head_dim * element + 16)


STORE_BLOCKS = 40
GPU_BLOCKS = 24


def _tiny_llm(store_mode: str = "eager"):
    # A 40-block store behind a 24-block GPU pool, Continuum scheduling
    # (untagged requests are plain FCFS; tagged turns are pinned 0.3 s).
    return _make_llm(
        TINY_MODEL,
        cpu_bytes=STORE_BLOCKS * _block_bytes(TINY_MODEL),
        num_blocks=GPU_BLOCKS,
        store_mode=store_mode,
        max_model_len=512,
        scheduling_policy="continuum",
        additional_config={"continuum": {"default_ttl_s": 0.3}},
    )


@pytest.fixture
def tiny(env):
    return _Engines.get("tiny", _tiny_llm)


def _random_prompts(n: int, length: int, seed: int, shared: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 400) for _ in range(shared)]
    return [prefix + [rng.randrange(3, 400) for _ in range(length - shared)] for _ in range(n)]


def test_b_store_never_exceeds_its_budget(tiny):
    llm = tiny
    conn = _sched(llm).connector
    assert conn.index.capacity_bytes // conn._sched.block_bytes == STORE_BLOCKS
    prompts = _random_prompts(12, 200, seed=1)  # 6 full blocks each: 72 > 40
    for i in range(0, len(prompts), 3):
        llm.generate([_ids(p) for p in prompts[i : i + 3]], _greedy(4, None), use_tqdm=False)
        totals = _assert_store_consistent(llm)
        assert totals["store_blocks"] <= STORE_BLOCKS
    assert totals["evicted_blocks"] > 0 and totals.get("dropped_store_blocks", 0) == 0
    assert _worker_connector().worker_store.used_bytes <= _worker_connector().worker_store.capacity_bytes
    # The most recent prompt survived the LRU and reloads after a reset.
    before = conn.totals().get("load_hit_tokens", 0)
    assert llm.reset_prefix_cache()
    llm.generate([_ids(prompts[-1])], _greedy(4, None), use_tqdm=False)
    assert conn.totals()["load_hit_tokens"] - before == 192  # (200 - 1) // 32 blocks
    _assert_store_consistent(llm)


def test_e_continuum_turn_after_an_expired_pin_reloads(tiny):
    """A job's turn whose pin expired and whose GPU blocks other traffic
    took is served by a reload from the store (not a recompute)."""
    import time

    from vllm import SamplingParams

    llm = tiny
    sched = _sched(llm)
    conn = sched.connector
    assert type(sched).__name__ == "ContinuumScheduler"

    def turn(last: bool, n: int = 10):
        return SamplingParams(
            temperature=0.0, max_tokens=n, ignore_eos=True,
            extra_args={"job_id": "agent-e", "is_last_step": last},
        )

    first = _random_prompts(1, 190, seed=6)[0]
    out1 = llm.generate([_ids(first)], turn(False), use_tqdm=False)[0]
    assert "agent-e" in sched.pins
    time.sleep(0.5)  # the tool runs longer than the 0.3 s TTL
    flood = _random_prompts(3, 200, seed=7)
    llm.generate([_ids(p) for p in flood], _greedy(2, None), use_tqdm=False)
    assert "agent-e" not in sched.pins  # expired, its blocks reused by the flood
    second = first + list(out1.outputs[0].token_ids) + _random_prompts(1, 40, seed=8)[0]
    before = conn.totals().get("load_hit_tokens", 0)
    out2 = llm.generate([_ids(second)], turn(True, 4), use_tqdm=False)[0]
    hit = conn.totals()["load_hit_tokens"] - before
    # Turn 1's full blocks ((190 + 10 - 1) // 32 = 6) are in the store.
    assert hit > 0 and out2.num_cached_tokens >= 192
    _assert_store_consistent(llm)
    _assert_nothing_leaked(llm)


def test_g_a_load_the_store_cannot_serve_is_recomputed_not_failed(tiny):
    """vLLM's default kv_load_failure_policy is "fail"; the connector makes
    a block its store promised but lost a recompute: the request completes
    with exactly the tokens of a cold run."""
    llm = tiny
    sched = _sched(llm)
    conn = sched.connector
    assert sched.recompute_kv_load_failures
    prompt = _random_prompts(1, 200, seed=21)[0]
    cold = llm.generate([_ids(prompt)], _greedy(8, None), use_tqdm=False)[0]
    assert llm.reset_prefix_cache()
    store = _worker_connector().worker_store
    # This prompt's blocks are the store's most recently used (its chain's
    # head last); the worker loses three of them.
    lost = [key for key in store.keys_lru() if key in conn.index][-3:]
    assert lost
    for key in lost:  # the worker's copy is gone; the index still promises it
        store.discard(key)
    failed = conn.totals().get("load_failed_blocks", 0)
    warm = llm.generate([_ids(prompt)], _greedy(8, None), use_tqdm=False)[0]
    assert warm.outputs[0].finish_reason == "length"
    assert list(warm.outputs[0].token_ids) == list(cold.outputs[0].token_ids)
    # (Worker counters reach the scheduler with the next step's output.)
    llm.generate([_ids(_random_prompts(1, 8, seed=22)[0])], _greedy(1, None), use_tqdm=False)
    assert conn.totals().get("load_failed_blocks", 0) > failed
    _assert_nothing_leaked(llm)


def test_f_store_holds_a_waiting_jobs_blocks_through_a_flood(tiny):
    """Blocks of a job whose pin lapsed are held in the store for its next
    turn: a flood bigger than the store evicts everything else, and the
    turn still reloads its context. Without the hold (``hold_seconds`` 0)
    the same flood evicts them and the turn recomputes; a hold that lapses
    (a job that never returns) does not protect them either."""
    import time

    from vllm import SamplingParams

    llm = tiny
    sched = _sched(llm)
    conn = sched.connector
    side = conn._sched

    def turn(job: str, last: bool, n: int = 10):
        return SamplingParams(
            temperature=0.0, max_tokens=n, ignore_eos=True,
            extra_args={"job_id": job, "is_last_step": last},
        )

    def first_turn_then_flood(job: str, seed: int, gap_s: float = 0.0):
        first = _random_prompts(1, 190, seed=seed)[0]
        out1 = llm.generate([_ids(first)], turn(job, False), use_tqdm=False)[0]
        time.sleep(0.5)  # the tool outlives the 0.3 s TTL
        # The next step releases the lapsed pin into the store.
        llm.generate([_ids(_random_prompts(1, 20, seed=seed + 1)[0])], _greedy(1, None), use_tqdm=False)
        assert job not in sched.pins
        time.sleep(gap_s)
        # 8 x 6 = 48 new blocks through a 40-block store, 3 at a time.
        flood = _random_prompts(8, 200, seed=seed + 2)
        for i in range(0, len(flood), 3):
            llm.generate([_ids(p) for p in flood[i : i + 3]], _greedy(2, None), use_tqdm=False)
        _assert_store_consistent(llm)
        second = first + list(out1.outputs[0].token_ids) + _random_prompts(1, 40, seed=seed + 3)[0]
        before = conn.totals().get("load_hit_tokens", 0)
        out2 = llm.generate([_ids(second)], turn(job, True, 4), use_tqdm=False)[0]
        return conn.totals().get("load_hit_tokens", 0) - before, out2.num_cached_tokens

    saved = side.hold_seconds
    try:
        hit, cached = first_turn_then_flood("agent-held", seed=20)
        assert hit >= 192 and cached >= 192  # 6 full blocks reloaded
        assert "agent-held" not in side.job_holds  # ended when the turn was admitted

        side.hold_seconds = 0.0
        hit, cached = first_turn_then_flood("agent-unheld", seed=30)
        assert hit == 0 and cached == 0

        side.hold_seconds = 0.4
        hit, cached = first_turn_then_flood("agent-gone", seed=40, gap_s=0.6)
        assert hit == 0 and cached == 0
    finally:
        side.hold_seconds = saved
    assert conn.index.held_bytes == 0 and not side.job_holds and not side.pending_holds
    _assert_nothing_leaked(llm)


def _run_and_abort(llm, request_id: str, prompt: list[int], steps: int) -> None:
    from vllm import SamplingParams

    sched = _sched(llm)
    engine = llm.llm_engine
    engine.add_request(request_id, _ids(prompt), SamplingParams(max_tokens=300, ignore_eos=True))
    for _ in range(steps):
        engine.step()
    assert sched.requests, "the request must still be running when aborted"
    engine.abort_request([request_id])
    for _ in range(20):  # let the engine drain (delayed frees, pending copies)
        if not sched.has_requests():
            break
        engine.step()
    assert not sched.has_requests()


def _assert_nothing_leaked(llm) -> None:
    sched = _sched(llm)
    conn = sched.connector
    pool = sched.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
    assert not sched.requests
    side = conn._sched
    assert not side.requests and not side.stored_upto and not side.last_match
    assert not side.pending_loads and not side.pinned_for_load
    assert not side.job_holds and not side.pending_holds and conn.index.held_bytes == 0
    assert not side.deferred_holds
    assert not conn.has_pending_push_work()
    worker = _worker_connector()._worker
    assert not worker._expected_sends and not worker._done_sends
    _assert_store_consistent(llm)
    assert llm.reset_prefix_cache()


def test_d_aborted_request_leaves_no_blocks(tiny):
    prompt = _random_prompts(1, 150, seed=3)[0]
    _run_and_abort(tiny, "abort-eager", prompt, steps=40)
    _assert_nothing_leaked(tiny)


def test_d_request_aborted_while_its_load_runs_leaves_no_blocks_and_exact_kv(tiny):
    """An abort that arrives while the step loading a request's KV runs
    (EngineCore processes such aborts after the forward pass, before
    ``update_from_output``) leaks no GPU block or connector state, and the
    store still serves exact KV to the next request with that prompt."""
    llm = tiny
    engine = llm.llm_engine
    core = engine.engine_core.engine_core
    sched = core.scheduler
    conn = sched.connector
    prompt = _random_prompts(1, 180, seed=12)[0]
    params = _greedy(6, 3)
    first = _tokens_and_logprobs(llm.generate([_ids(prompt)], params, use_tqdm=False)[0])
    assert llm.reset_prefix_cache()  # only the CPU store has the prompt now
    before = conn.totals().get("load_hit_tokens", 0)

    engine.add_request("abort-mid-load", _ids(prompt), params)
    out = sched.schedule()
    loads = out.kv_connector_metadata.loads
    assert [job.req_id for job in loads] and conn.totals()["load_hit_tokens"] - before == 160
    future = core.model_executor.execute_model(out, non_block=True)
    grammar = sched.get_grammar_bitmask(out)
    model_output = future.result()
    if model_output is None:
        model_output = core.model_executor.sample_tokens(grammar)
    engine.abort_request(["abort-mid-load"])  # arrived during the step
    sched.update_from_output(out, model_output)
    for _ in range(10):
        if not sched.has_requests():
            break
        engine.step()
    assert not engine.has_unfinished_requests()
    _assert_nothing_leaked(llm)  # (also resets the GPU prefix cache)

    again = _tokens_and_logprobs(llm.generate([_ids(prompt)], params, use_tqdm=False)[0])
    assert again[0] == first[0]
    assert max(abs(a - b) for a, b in zip(first[1], again[1])) == 0.0
    _assert_nothing_leaked(llm)


def test_finish_mode_stores_at_finish_and_frees_after_the_copy(env):
    llm = _Engines.get("tiny-finish", lambda: _tiny_llm("finish"))
    conn = _sched(llm).connector
    prompt = _random_prompts(1, 150, seed=4)[0]
    params = _greedy(40, 3)
    first = _tokens_and_logprobs(llm.generate([_ids(prompt)], params, use_tqdm=False)[0])
    # The copy is shipped with the next step; drain it.
    sched = _sched(llm)
    for _ in range(5):
        if not sched.has_requests():
            break
        llm.llm_engine.step()
    assert conn.totals()["stored_blocks"] == (150 + 40 - 1) // 32
    _assert_nothing_leaked(llm)
    before = conn.totals().get("load_hit_tokens", 0)
    again = _tokens_and_logprobs(llm.generate([_ids(prompt)], params, use_tqdm=False)[0])
    assert conn.totals()["load_hit_tokens"] - before == 128
    assert again[0] == first[0]
    assert max(abs(a - b) for a, b in zip(first[1], again[1])) < 2e-2
    _run_and_abort(llm, "abort-finish", _random_prompts(1, 150, seed=5)[0], steps=40)
    _assert_nothing_leaked(llm)


def test_explicit_mode_saves_blocks_the_scheduler_frees(env):
    """``store_mode="explicit"``: only blocks handed over with
    ``save_request``/``save_blocks`` are stored -- here from a hook on the
    scheduler's free path, as the Continuum scheduler would for a turn it
    does not pin -- copied before the next forward pass, after the blocks
    went back to the pool."""
    llm = _Engines.get("tiny-explicit", lambda: _tiny_llm("explicit"))
    sched = _sched(llm)
    conn = sched.connector
    free_request_blocks = sched._free_request_blocks

    def hooked(request):
        if request.is_finished():
            conn.save_request(request)
        free_request_blocks(request)

    sched._free_request_blocks = hooked
    try:
        prompt = _random_prompts(1, 170, seed=9)[0]
        params = _greedy(8, 3)
        first = _tokens_and_logprobs(llm.generate([_ids(prompt)], params, use_tqdm=False)[0])
        assert conn.totals().get("stored_blocks", 0) == 0  # nothing stored while running
        assert conn.has_pending_push_work()  # queued by the hook, blocks already freed
        llm.llm_engine.step()  # the engine keeps stepping while copies are queued
        assert not conn.has_pending_push_work()
        assert conn.totals()["stored_blocks"] == (170 + 8 - 1) // 32
        assert llm.reset_prefix_cache()
        before = conn.totals().get("load_hit_tokens", 0)
        again = _tokens_and_logprobs(llm.generate([_ids(prompt)], params, use_tqdm=False)[0])
        assert conn.totals()["load_hit_tokens"] - before == (170 - 1) // 32 * 32
        assert again[0] == first[0] and max(abs(a - b) for a, b in zip(first[1], again[1])) == 0.0
        llm.llm_engine.step()
        _assert_nothing_leaked(llm)
    finally:
        sched._free_request_blocks = free_request_blocks


def test_victim_mode_stores_what_the_gpu_evicts_and_reloads_it_exactly(env):
    """``store_mode="victim"``: nothing is copied while the GPU pool holds a
    prompt's blocks; when other traffic makes the pool evict them, each is
    copied before its memory is reused, and the prompt then reloads from
    the host: the same greedy tokens and logprobs as computed cold."""
    llm = _Engines.get("tiny-victim", lambda: _tiny_llm("victim"))
    conn = _sched(llm).connector
    prompt = _random_prompts(1, 170, seed=21)[0]
    params = _greedy(8, 3)
    first = _tokens_and_logprobs(llm.generate([_ids(prompt)], params, use_tqdm=False)[0])
    assert conn.totals().get("stored_blocks", 0) == 0  # the GPU still has it: no copy
    # 24 GPU blocks of 32 tokens: four 200-token prompts evict the first.
    for flood in _random_prompts(4, 200, seed=22):
        llm.generate([_ids(flood)], _greedy(2, None), use_tqdm=False)
    totals = _assert_store_consistent(llm)
    assert totals["victim_blocks"] >= (170 + 8 - 1) // 32 and totals["stored_blocks"] == totals["victim_blocks"]
    before = totals.get("load_hit_tokens", 0)
    again = _tokens_and_logprobs(llm.generate([_ids(prompt)], params, use_tqdm=False)[0])
    assert conn.totals()["load_hit_tokens"] - before == (170 - 1) // 32 * 32
    assert again[0] == first[0] and max(abs(a - b) for a, b in zip(first[1], again[1])) == 0.0
    llm.llm_engine.step()
    _assert_nothing_leaked(llm)
