"""A finished job's own blocks leave the prefix cache first, on a real vLLM
scheduler and block pool (``harness``: no weights, a manual clock)."""

from __future__ import annotations

from harness import free_blocks, make_request, make_scheduler, prompt_of, run_until_finished, usable_blocks

BLOCK = 16


def _front_of_free_queue(scheduler, n: int) -> list[int]:
    """Block ids of the next ``n`` cached blocks vLLM would evict (blocks
    that hold no cached prefix, e.g. never used, are reused before them and
    evict nothing)."""
    return [b.block_id for b in scheduler.kv_cache_manager.block_pool.free_block_queue.get_all_free_blocks()
            if b.block_hash is not None][:n]


def _blocks_of(scheduler, request) -> list[int]:
    return [b.block_id for b in scheduler.kv_cache_manager.get_blocks(request.request_id).blocks[0]]


def _blocks_of_finished(scheduler, request) -> list[int]:
    """Cached blocks holding ``request``'s prompt (looked up by its hashes)."""
    pool = scheduler.kv_cache_manager.block_pool
    ids = []
    for block_hash in request.block_hashes:
        block = pool.get_cached_block(block_hash, [0])
        if block is not None:
            ids.append(block[0].block_id)
    return ids


def _two_turn_job(scheduler, job: str, system: list[int], own: int, last: bool):
    """A job whose prompt starts with ``system`` (shared with other jobs) and
    adds ``own`` tokens of its own; returns (turn 1, turn 2) once turn 2 is
    admitted and finished (``last``: it is the job's last step)."""
    prompt = system + prompt_of(hash(job) % 500 + 1, own)
    r1 = make_request(prompt, max_tokens=4, job_id=job, is_last_step=False)
    scheduler.add_request(r1)
    run_until_finished(scheduler, [r1])
    r2 = make_request(prompt + list(r1.output_token_ids) + list(range(20, 60)), max_tokens=4,
                      job_id=job, is_last_step=last)
    scheduler.add_request(r2)
    blocks: list[int] = []
    for _ in range(50):
        from harness import step
        step(scheduler)
        if r2.request_id in scheduler.requests and not blocks:
            try:
                blocks = _blocks_of(scheduler, r2)
            except KeyError:
                pass
        if r2.is_finished():
            break
    return r1, r2, blocks


def test_an_ended_jobs_own_blocks_are_evicted_before_the_shared_system_prompt_and_earlier_contexts():
    s = make_scheduler(num_blocks=128)
    system = prompt_of(900, 4 * BLOCK)  # 4 shared blocks
    # A context freed earlier that someone may still ask for (a chat turn,
    # a job whose pin lapsed): under plain LRU it would be evicted first.
    other = make_request(system + prompt_of(904, 3 * BLOCK), max_tokens=4)
    s.add_request(other)
    run_until_finished(s, [other])
    other_blocks = set(_blocks_of_finished(s, other))
    # A job whose second turn is its last: its first turn hit the system prompt.
    _, ended_r2, ended_blocks = _two_turn_job(s, "ended", system, own=3 * BLOCK, last=True)
    assert ended_blocks, "the last turn was never seen running"
    assert s.jobs.get("ended") is None
    shared = set(ended_blocks[:4])
    own_full = [b for b in ended_blocks[4:] if s.kv_cache_manager.block_pool.blocks[b].block_hash is not None]
    assert own_full, "the ended job has full blocks of its own"
    front = _front_of_free_queue(s, len(own_full))
    # Its own blocks are next in line, its context's tail first...
    assert front == own_full[::-1]
    # ...and neither the shared system prompt nor the earlier context is.
    assert not shared & set(front)
    assert not other_blocks & set(front)


def test_ending_a_job_changes_only_the_eviction_order_not_what_is_free():
    s = make_scheduler(num_blocks=128)
    system = prompt_of(901, 4 * BLOCK)
    _two_turn_job(s, "a", system, own=5 * BLOCK, last=True)
    assert not s.running and len(s.pins) == 0
    assert free_blocks(s) == usable_blocks(s)  # every block free: the invariant holds
    # The ended context is still cached: an identical prompt still hits it.
    queue = s.kv_cache_manager.block_pool.free_block_queue
    assert queue.num_free_blocks == len(queue.get_all_free_blocks())


def test_an_aborted_turn_keeps_its_lru_place():
    from vllm.v1.request import RequestStatus
    s = make_scheduler(num_blocks=128)
    system = prompt_of(902, 4 * BLOCK)
    prompt = system + prompt_of(77, 3 * BLOCK)
    r1 = make_request(prompt, max_tokens=4, job_id="a", is_last_step=False)
    s.add_request(r1)
    run_until_finished(s, [r1])
    r2 = make_request(prompt + list(r1.output_token_ids) + list(range(20, 60)), max_tokens=50, job_id="a")
    s.add_request(r2)
    from harness import step
    step(s)
    blocks = _blocks_of(s, r2)
    other = make_request(prompt_of(903, 3 * BLOCK), max_tokens=4)  # freed before the abort
    s.add_request(other)
    run_until_finished(s, [other])
    s.finish_requests([r2.request_id], RequestStatus.FINISHED_ABORTED)
    # An abort may be retried: its blocks join the free queue's tail, as in
    # vLLM, behind the blocks freed before it.
    assert not set(_front_of_free_queue(s, 3)) & set(blocks)
    assert free_blocks(s) == usable_blocks(s)
