"""No client can push another client's implicit job out of the index.

The threat model of issue 23, finding 6, one test per attack. A victim runs
an unchanged agent (no job id): its turns are recognised by prefix
(``implicit_jobs``). Another client, in another scope (an API key's, or the
``continuum_scope`` it names), sends untagged requests that used to drop the
victim's registered turn, so that its next turn was not recognised and its
pin lapsed:

* a twin: the same first prompt, answered with the same reply;
* more requests with the same first prompt than a key keeps candidates;
* a flood of its own agent turns past the index's entry bound;
* a prompt rebuilt from the victim's context (a continuation by shared
  prefix), then a flood of answers sharing its system prompt.

Each test asserts the victim's outcome: its next turn is recognised as the
same job and takes its pin over. Real vLLM scheduler, no weights
(``harness``); time is the manual clock.
"""

from __future__ import annotations

import pytest
from harness import (
    admitted_cached_tokens,
    free_blocks,
    make_request,
    make_scheduler,
    prompt_of,
    run_until_finished,
    scripted,
    step,
    tiny_tokens,
    usable_blocks,
)

from vllm_continuum_plugin.implicit_jobs import MAX_CANDIDATES, is_implicit_job
from vllm_continuum_plugin.request_record import request_meta

BLOCK = 16
EOS = 2
TEMPLATE = [3, 1]
LS = tiny_tokens("```bash\nls -la\n```") + [EOS]
SYSTEM = prompt_of(7, 100)
FIRST = SYSTEM + prompt_of(1, 30)  # the victim's task; a twin sends the same
VICTIM = {"continuum_scope": "alice"}
ATTACKER = {"continuum_scope": "mallory"}


def agent_turn(s, prompt: list[int], reply: list[int], scope: dict):
    r = scripted(make_request(prompt, max_tokens=len(reply), extra=scope), reply)
    s.add_request(r)
    run_until_finished(s, [r])
    return r


def reply_with(command: str) -> list[int]:
    return tiny_tokens(f"```bash\n{command}\n```") + [EOS]


def victim_next_turn_takes_its_pin_over(s, first) -> None:
    job = request_meta(first).job_id
    assert is_implicit_job(job) and job in s.pins
    pinned = s.pins.get(job).num_blocks
    s.clock.advance(0.5)
    nxt = make_request(FIRST + LS + TEMPLATE + prompt_of(2, 20), max_tokens=4, extra=VICTIM)
    s.add_request(nxt)
    assert request_meta(nxt).job_id == job  # recognised: the same job
    assert admitted_cached_tokens(step(s), nxt) == pinned * BLOCK
    run_until_finished(s, [nxt])
    assert s.continuum_metrics.snapshot()["pins_released"]["handoff"] >= 1


@pytest.fixture
def s():
    return make_scheduler(num_blocks=400, max_num_seqs=4, continuum={"implicit_max_jobs": 16})


def test_a_twin_in_another_scope_does_not_drop_the_victims_turn(s):
    first = agent_turn(s, FIRST, LS, VICTIM)
    agent_turn(s, FIRST, LS, ATTACKER)  # byte-identical prompt and reply
    victim_next_turn_takes_its_pin_over(s, first)


def test_more_same_prompt_requests_than_a_key_keeps_do_not_drop_the_victims_turn(s):
    first = agent_turn(s, FIRST, LS, VICTIM)
    for i in range(MAX_CANDIDATES + 2):
        agent_turn(s, FIRST, reply_with(f"cat file{i}.py"), ATTACKER)
    victim_next_turn_takes_its_pin_over(s, first)


def test_a_flood_past_the_index_bound_does_not_drop_the_victims_turn(s):
    first = agent_turn(s, FIRST, LS, VICTIM)
    for i in range(40):  # 16 entries fit: the flood evicts its own turns
        agent_turn(s, SYSTEM + prompt_of(200 + i, 30), LS, ATTACKER)
    victim_next_turn_takes_its_pin_over(s, first)


def test_every_block_is_free_once_the_attackers_pins_lapse(s):
    first = agent_turn(s, FIRST, LS, VICTIM)
    agent_turn(s, FIRST, LS, ATTACKER)
    victim_next_turn_takes_its_pin_over(s, first)
    s.clock.advance(3600)
    step(s)
    assert not s.running and len(s.pins) == 0 and free_blocks(s) == usable_blocks(s)


def test_a_continuation_by_prefix_from_another_scope_cannot_take_the_victims_job(s):
    # The attacker knows the victim's context and sends it rebuilt (its
    # blocks, fresh content: what continues a turn by shared prefix), and a
    # flood of answers sharing the system prompt: neither is the victim's
    # next turn, so the victim keeps its job and its pin.
    first = agent_turn(s, FIRST, LS, VICTIM)
    rebuilt = FIRST[: len(FIRST) // BLOCK * BLOCK] + prompt_of(300, 40)
    stolen = agent_turn(s, rebuilt, LS, ATTACKER)
    assert request_meta(stolen).job_id != request_meta(first).job_id
    for i in range(20):
        agent_turn(s, SYSTEM + prompt_of(400 + i, 30), tiny_tokens("Done.") + [EOS], ATTACKER)
    victim_next_turn_takes_its_pin_over(s, first)
