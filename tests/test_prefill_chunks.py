"""A job's next turn is not held behind another session's long prefill.

vLLM gives a step's token budget to running requests first; a long running
prefill takes all of it, step after step, and an agent's next turn that
needs a few new tokens over a context the pool keeps waits it out (on the
70B traces, 2-3 s: the turns that missed a 2 s TTFT bound in
docs/capacity.md). ``prefill_chunks`` cuts such prefills for the steps in
which a job's next turn waits, and leaves every other step as vLLM
schedules it. The scheduler tests run on a real vLLM scheduler with the
manual clock; each ends with every block free.
"""

from __future__ import annotations

import pytest
from harness import make_request, make_scheduler, prompt_of, run_until_finished, step
from scheduler_turns import assert_all_blocks_free, first_turn, next_turn_prompt

from vllm_continuum_plugin.prefill_chunks import chunk_share


BUDGET = 256  # tokens per step
LONG = 2048  # another session's prompt: 8 steps of the whole budget
FIXED = {"ttl_policy": "fixed", "fixed_ttl_s": 60.0, "default_ttl_s": 60.0}


def rig(cut: str = "always", policy: str = "continuum", kv_transfer=None):
    continuum = {**FIXED, "cut_long_prefills": cut} if policy != "fcfs" else None
    return make_scheduler(policy, num_blocks=400, max_num_batched_tokens=BUDGET, max_model_len=4096,
                          continuum=continuum, kv_transfer=kv_transfer)


def vllms_offloading():
    """vLLM's own OffloadingConnector (its scheduler side needs no GPU)."""
    import torch
    from vllm.config import KVTransferConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    page = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32).page_size_bytes
    return KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                            kv_connector_extra_config={"cpu_bytes_to_use": 800 * page})


def steps_to_first_token(s, turn, long) -> tuple[int, bool]:
    """Steps until ``turn`` has its first token, and whether ``long`` was
    still prefilling then."""
    for n in range(1, 200):
        step(s)
        if turn.num_output_tokens > 0:
            return n, long.num_computed_tokens < long.num_prompt_tokens
    raise AssertionError("the next turn got no token in 200 steps")


def next_turn_behind_a_long_prefill(s, extra: int = 40, lapse: bool = False):
    prompt, first = first_turn(s, "agent", length=160)
    if lapse:  # the agent's pin lapses before it returns: its context is not held
        s.clock.advance(1000.0)
        step(s)
        assert "agent" not in s.pins
    long = make_request(prompt_of(500, LONG), max_tokens=2, job_id="stranger", is_last_step=True)
    s.add_request(long)
    step(s)  # the stranger's prefill is running
    assert 0 < long.num_computed_tokens < LONG
    s.clock.advance(1.0)  # the agent's tool returns
    turn = make_request(next_turn_prompt(prompt, first, extra=extra), max_tokens=2, job_id="agent",
                        is_last_step=True)
    s.add_request(turn)
    return turn, long


@pytest.mark.parametrize("setting", ["always", "with_tier"])
def test_a_next_turn_runs_in_the_step_after_it_arrives_while_a_long_prefill_runs(setting):
    # The default ("with_tier") cuts under a KV connector: here vLLM's own
    # offloading, the way long-context agents are served.
    s = rig(setting, kv_transfer=vllms_offloading() if setting == "with_tier" else None)
    turn, long = next_turn_behind_a_long_prefill(s)
    n, long_still_prefilling = steps_to_first_token(s, turn, long)
    assert n == 1 and long_still_prefilling
    assert s.prefill_chunks.steps_cut == 1  # only the step the turn waited in
    assert s.continuum_metrics.snapshot()["prefill_cuts"] == 1  # vllm_continuum:prefill_cuts_total
    run_until_finished(s, [long, turn])
    assert_all_blocks_free(s)


@pytest.mark.parametrize("policy", ["fcfs", "continuum"])
def test_without_the_cut_the_next_turn_waits_the_long_prefill_out(policy):
    # What vLLM does (and the plugin with cut_long_prefills "never"): the
    # contrast the test above is measured against.
    s = rig("never", policy=policy)
    prompt, first = first_turn(s, "agent", length=160)
    long = make_request(prompt_of(500, LONG), max_tokens=2, job_id="stranger", is_last_step=True)
    s.add_request(long)
    step(s)
    turn = make_request(next_turn_prompt(prompt, first, extra=40), max_tokens=2, job_id="agent", is_last_step=True)
    s.add_request(turn)
    n, long_still_prefilling = steps_to_first_token(s, turn, long)
    assert n >= LONG // BUDGET - 1 and not long_still_prefilling
    run_until_finished(s, [long, turn])
    assert not s.running


@pytest.mark.parametrize(("extra", "lapse"), [(400, False), (40, True)])
def test_a_next_turn_that_would_be_a_long_prefill_itself_does_not_cut(extra, lapse):
    # A long tool result beyond the pinned context, or a context whose pin
    # lapsed (no host tier holds it): the turn must compute more than its
    # share, so cutting would only interleave two long prefills (and its
    # early blocks press on other jobs' pins). The step stays vLLM's.
    s = rig()
    turn, long = next_turn_behind_a_long_prefill(s, extra=extra, lapse=lapse)
    steps_to_first_token(s, turn, long)
    assert s.prefill_chunks.steps_cut == 0
    run_until_finished(s, [long, turn])
    assert_all_blocks_free(s)


def test_a_new_sessions_first_turn_does_not_cut_a_running_prefill():
    # Only a job's next turn (a context returning) is let in early: a
    # stranger's first turn queues as under vLLM, so two long prefills are
    # not interleaved for nobody's benefit.
    s = rig()
    long = make_request(prompt_of(500, LONG), max_tokens=2, job_id="stranger", is_last_step=True)
    s.add_request(long)
    step(s)
    newcomer = make_request(prompt_of(501, 64), max_tokens=2, job_id="newcomer", is_last_step=True)
    s.add_request(newcomer)
    n, long_still_prefilling = steps_to_first_token(s, newcomer, long)
    assert not long_still_prefilling and s.prefill_chunks.steps_cut == 0
    run_until_finished(s, [long, newcomer])
    assert_all_blocks_free(s)


def test_by_default_without_a_host_tier_nothing_is_cut():
    # Without a tier, the blocks a cut prefill holds longer press on the
    # pins: the default cuts only under a KV connector.
    s = rig("with_tier")
    assert s.prefill_chunks is None
    turn, long = next_turn_behind_a_long_prefill(s)
    n, long_still_prefilling = steps_to_first_token(s, turn, long)
    assert not long_still_prefilling
    run_until_finished(s, [long, turn])
    assert_all_blocks_free(s)


def test_a_bad_setting_names_itself():
    with pytest.raises(ValueError, match="cut_long_prefills='sometimes' is invalid"):
        rig("sometimes")


def test_the_users_own_threshold_is_restored_after_every_step():
    s = rig()
    s.scheduler_config.long_prefill_token_threshold = 192
    turn, long = next_turn_behind_a_long_prefill(s)
    steps_to_first_token(s, turn, long)
    assert s.scheduler_config.long_prefill_token_threshold == 192
    run_until_finished(s, [long, turn])
    assert_all_blocks_free(s)


@pytest.mark.parametrize(("budget", "prefills", "block", "share"), [
    (8192, 1, 16, 4096),  # one long prefill: half the budget each
    (8192, 2, 16, 2720),  # 8192 // 3 = 2730, whole blocks
    (256, 40, 16, 16),  # never below one block
    (100, 0, 16, 96),
])
def test_chunk_share_leaves_a_waiting_turn_a_share_in_whole_blocks(budget, prefills, block, share):
    assert chunk_share(budget, prefills, block) == share


@pytest.mark.parametrize("bad", [(0, 1, 16), (8192, -1, 16), (8192, 1, 0)])
def test_chunk_share_names_a_bad_argument(bad):
    with pytest.raises(ValueError, match="chunk_share needs"):
        chunk_share(*bad)
