"""`LLM(..., scheduling_policy="continuum")`: the offline API selects the plugin."""

import pytest
from harness import ENGINE_DTYPE, TINY_MODEL


@pytest.fixture(scope="module")
def llm():
    import os

    saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # scheduler in this process
    from vllm import LLM

    engine = LLM(
        model=TINY_MODEL,
        scheduling_policy="continuum",
        dtype=ENGINE_DTYPE,
        block_size=32,
        kv_cache_memory_bytes=64 * 1024 * 1024,
        max_model_len=512,
        enforce_eager=True,
        additional_config={"continuum": {"default_ttl_s": 30}},
    )
    try:
        yield engine
    finally:
        engine.llm_engine.engine_core.shutdown()
        if saved is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved


def test_offline_llm_pins_non_final_turns_and_frees_last_ones(llm):
    from vllm import SamplingParams

    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert type(scheduler).__name__ == "ContinuumScheduler"
    prompt = "Run the tests and tell me what failed. " * 6
    first = SamplingParams(max_tokens=8, ignore_eos=True, extra_args={"job_id": "offline", "is_last_step": False})
    out = llm.generate([prompt], first)
    assert "offline" in scheduler.pins
    follow_up = prompt + out[0].outputs[0].text + " now fix it"
    last = SamplingParams(max_tokens=4, ignore_eos=True, extra_args={"job_id": "offline", "is_last_step": True})
    out2 = llm.generate([follow_up], last)
    assert out2[0].num_cached_tokens > 0
    assert "offline" not in scheduler.pins
    pool = scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
