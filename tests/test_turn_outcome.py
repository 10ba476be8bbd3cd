"""What a finished turn becomes, without vLLM: ``turn_outcome`` over plain values.

One row per way out of the block-freeing path: the facts of the turn (its
metadata, its reply, its job, its pin, the settings, the TTL) and the outcome
a user cares about (kept or not, the job ended or not, and why).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile

import pytest

from vllm_continuum_plugin.turn_outcome import (
    FinishedTurn,
    PinRelation,
    TurnOutcome,
    TurnOutcomeKind,
    TurnReason,
    TurnReply,
    TurnRules,
    decide_turn,
    needs_reply,
)

K = TurnOutcomeKind
R = TurnReason
ON = TurnRules(implicit_jobs=True, pinning=True)
NO_IMPLICIT = TurnRules(implicit_jobs=False, pinning=True)
NO_PINNING = TurnRules(implicit_jobs=True, pinning=False)

TOOL = TurnReply(normal=True, calls_tool=True)
FINISH = TurnReply(normal=True, calls_tool=True, finish_action=True)
PROSE = TurnReply(normal=True)
PROSE_UNREAD = TurnReply(normal=True, readable=False)
ABORTED = TurnReply(normal=False)
JOB = "job-1"
IMPLICIT = "\x00implicit-1"


def explicit(reply: TurnReply, **facts) -> FinishedTurn:
    return FinishedTurn(job_id=JOB, reply=reply, **facts)


def untagged(reply: TurnReply | None, **facts) -> FinishedTurn:
    return FinishedTurn(job_id=None, reply=reply, **facts)


def outcome_of(turn: FinishedTurn, rules: TurnRules = ON, ttl_s: float | None = 5.0) -> TurnOutcome:
    """The final outcome, as the scheduler reaches it: a TTL is decided
    exactly when the rules ask for one (RETAIN)."""
    outcome = decide_turn(turn, rules)
    if outcome.kind is K.RETAIN:
        assert ttl_s is not None
        outcome = outcome.with_ttl(ttl_s)
    return outcome


# (case, turn, rules, ttl, kind, reason)
CASES = [
    # -- stock: no job acts ------------------------------------------------
    ("preempted job turn", FinishedTurn(finished=False, job_id=JOB), ON, 5.0, K.STOCK, R.PREEMPTED),
    ("preempted untagged", FinishedTurn(finished=False), ON, 5.0, K.STOCK, R.PREEMPTED),
    ("untagged, implicit jobs off", untagged(None), NO_IMPLICIT, 5.0, K.STOCK, R.UNTAGGED),
    ("untagged tool call, implicit jobs off", untagged(TOOL), NO_IMPLICIT, 5.0, K.STOCK, R.UNTAGGED),
    ("chat reply", untagged(PROSE), ON, 5.0, K.STOCK, R.NO_TOOL_CALL),
    ("untagged abort", untagged(ABORTED), ON, 5.0, K.STOCK, R.NO_TOOL_CALL),
    ("untagged last step", untagged(TOOL, is_last_step=True), ON, 5.0, K.STOCK, R.NO_TOOL_CALL),
    ("one-turn agent's finish action", untagged(FINISH), ON, 5.0, K.STOCK, R.ONE_TURN),
    # Where answers come back, only a normal answer of token ids, kept by
    # prefix caching, starts a chat.
    ("untagged abort where answers come back", untagged(ABORTED, answers_return=True), ON, 5.0,
     K.STOCK, R.NO_TOOL_CALL),
    ("answer where answers come back, pinning off", untagged(PROSE, answers_return=True), NO_PINNING, 5.0,
     K.STOCK, R.NO_TOOL_CALL),
    ("answer of embeddings where answers come back", untagged(PROSE, answers_return=True, token_prompt=False),
     ON, 5.0, K.STOCK, R.NO_TOOL_CALL),
    ("prompt of embeddings", untagged(TOOL, token_prompt=False), ON, 5.0, K.STOCK, R.PROMPT_EMBEDS),
    ("names a job it does not continue", FinishedTurn(unbound=True, is_last_step=True), ON, 5.0,
     K.STOCK, R.CONTEXT_MISMATCH),
    ("names a job it does not continue, with a finish action", FinishedTurn(unbound=True, reply=FINISH), ON, 5.0,
     K.STOCK, R.CONTEXT_MISMATCH),
    # -- end of job ----------------------------------------------------------
    ("last step", explicit(TOOL, is_last_step=True), ON, 5.0, K.END_JOB, R.LAST_STEP),
    ("aborted last step still ends", explicit(ABORTED, is_last_step=True), ON, 5.0, K.END_JOB, R.LAST_STEP),
    ("abort", explicit(ABORTED), ON, 5.0, K.END_JOB, R.ABORT),
    ("finish action", explicit(FINISH), ON, 5.0, K.END_JOB, R.FINISH_ACTION),
    ("finish action, pinning off", explicit(FINISH), NO_PINNING, 5.0, K.END_JOB, R.FINISH_ACTION),
    # Under a client's job id the user may follow an answer up: answered, not over.
    ("final answer after tool calls", explicit(PROSE, had_tool_call=True), ON, 5.0, K.END_JOB, R.ANSWERED),
    ("final answer after tool calls, side conversation",
     explicit(PROSE, had_tool_call=True, side_conversation=True), ON, 5.0, K.END_JOB, R.ANSWERED),
    # A named sub-agent's answer goes to its parent: it ends the sub-agent.
    ("sub-agent's answer after tool calls", explicit(PROSE, had_tool_call=True, sub_agent=True), ON, 5.0,
     K.END_JOB, R.FINAL_ANSWER),
    ("sub-agent's first reply is its answer", explicit(PROSE, sub_agent=True), ON, 5.0, K.END_JOB, R.FINAL_ANSWER),
    ("side request: prose beside another conversation, no tools offered",
     explicit(PROSE, tools_offered=False, side_conversation=True), ON, 5.0, K.END_JOB, R.FINAL_ANSWER),
    ("implicit job's reply without a call", FinishedTurn(job_id=IMPLICIT, implicit_job=True, reply=PROSE_UNREAD),
     ON, 5.0, K.END_JOB, R.FINAL_ANSWER),
    ("implicit job's last step", FinishedTurn(job_id=IMPLICIT, implicit_job=True, is_last_step=True, reply=TOOL),
     ON, 5.0, K.END_JOB, R.LAST_STEP),
    # -- the job goes on, nothing kept ----------------------------------------
    ("pinning off", explicit(TOOL), NO_PINNING, 5.0, K.FREE, R.NO_PINNING),
    ("pinning off, implicit job starts", untagged(TOOL), NO_PINNING, 5.0, K.FREE, R.NO_PINNING),
    ("pin of another context", explicit(TOOL, pin=PinRelation.OTHER_CONTEXT), ON, 5.0,
     K.FREE, R.OTHER_CONTEXT_PINNED),
    ("pin of another context, TTL 0", explicit(TOOL, pin=PinRelation.OTHER_CONTEXT), ON, 0.0,
     K.FREE, R.OTHER_CONTEXT_PINNED),
    # -- kept: offload or pin --------------------------------------------------
    ("slow tool: TTL 0", explicit(TOOL), ON, 0.0, K.OFFLOAD, R.TTL_ZERO),
    ("slow tool superseding its own pin", explicit(TOOL, pin=PinRelation.CONTINUED), ON, 0.0,
     K.OFFLOAD, R.TTL_ZERO),
    ("tool call", explicit(TOOL), ON, 5.0, K.PIN, R.TTL),
    ("next turn of a pinned context", explicit(TOOL, pin=PinRelation.CONTINUED), ON, 5.0, K.PIN, R.TTL),
    ("untagged tool call starts an implicit job", untagged(TOOL), ON, 5.0, K.PIN, R.TTL),
    ("untagged answer where the scope's answers come back starts its chat", untagged(PROSE, answers_return=True),
     ON, 5.0, K.PIN, R.TTL),
    ("untagged answer starting its chat, TTL 0", untagged(PROSE, answers_return=True), ON, 0.0,
     K.OFFLOAD, R.TTL_ZERO),
    ("prose without earlier tool calls", explicit(PROSE), ON, 5.0, K.PIN, R.TTL),
    ("prose, client flags its own end", explicit(PROSE, is_last_step=False, had_tool_call=True), ON, 5.0,
     K.PIN, R.TTL),
    ("prose, replies cannot be read", explicit(PROSE_UNREAD, had_tool_call=True), ON, 5.0, K.PIN, R.TTL),
    ("sub-agent's tool call", explicit(TOOL, sub_agent=True), ON, 5.0, K.PIN, R.TTL),
    ("sub-agent's prose, client flags its own end", explicit(PROSE, sub_agent=True, is_last_step=False), ON, 5.0,
     K.PIN, R.TTL),
    ("sub-agent's prose, replies cannot be read", explicit(PROSE_UNREAD, sub_agent=True), ON, 5.0, K.PIN, R.TTL),
    ("lone chat under a session id: no tools offered, no sibling", explicit(PROSE, tools_offered=False), ON, 5.0,
     K.PIN, R.TTL),
    ("prose beside another conversation, tools offered", explicit(PROSE, tools_offered=True, side_conversation=True),
     ON, 5.0, K.PIN, R.TTL),
    ("prose beside another conversation, no tools offered but a tool hinted",
     explicit(PROSE, tools_offered=False, side_conversation=True, tool_hinted=True), ON, 5.0, K.PIN, R.TTL),
    ("side request, client flags its own end",
     explicit(PROSE, tools_offered=False, side_conversation=True, is_last_step=False), ON, 5.0, K.PIN, R.TTL),
    ("side request, replies cannot be read",
     explicit(PROSE_UNREAD, tools_offered=False, side_conversation=True), ON, 5.0, K.PIN, R.TTL),
    ("tool call of the implicit job", FinishedTurn(job_id=IMPLICIT, implicit_job=True, reply=TOOL), ON, 5.0,
     K.PIN, R.TTL),
]


@pytest.mark.parametrize(
    "turn, rules, ttl_s, kind, reason", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_finished_turn_has_one_outcome(turn, rules, ttl_s, kind, reason):
    outcome = outcome_of(turn, rules, ttl_s)
    assert (outcome.kind, outcome.reason) == (kind, reason)


@pytest.mark.parametrize(
    "turn, starts", [(untagged(TOOL), True), (explicit(TOOL), False), (untagged(PROSE), False)],
    ids=["untagged tool call", "explicit job", "chat"],
)
def test_only_an_untagged_tool_call_starts_an_implicit_job(turn, starts):
    assert outcome_of(turn).starts_implicit_job is starts


@pytest.mark.parametrize(
    "turn, starts",
    [(untagged(PROSE, answers_return=True), True), (untagged(PROSE), False),
     (untagged(TOOL, answers_return=True), False), (explicit(PROSE, answers_return=True), False),
     (untagged(PROSE, answers_return=True, is_last_step=True), False)],
    ids=["answer where answers come back", "answer where they do not", "tool call", "explicit job",
         "last step"],
)
def test_only_an_untagged_answer_where_answers_come_back_starts_a_chat(turn, starts):
    outcome = outcome_of(turn)
    assert outcome.starts_implicit_chat is starts
    assert not (starts and outcome.starts_implicit_job)  # a chat, not an agent's job


def test_a_pin_carries_its_ttl_and_an_offload_none():
    assert outcome_of(explicit(TOOL), ttl_s=7.5).ttl_s == 7.5
    assert outcome_of(explicit(TOOL), ttl_s=0.0).ttl_s == 0.0
    assert outcome_of(explicit(TOOL), ttl_s=-1.0).kind is K.OFFLOAD


@pytest.mark.parametrize(
    "pin, ttl_s, supersedes",
    [(PinRelation.CONTINUED, 5.0, True), (PinRelation.CONTINUED, 0.0, True), (PinRelation.NONE, 5.0, False),
     (PinRelation.OTHER_CONTEXT, 5.0, False)],
)
def test_only_a_turn_of_the_pinned_context_supersedes_the_pin(pin, ttl_s, supersedes):
    assert outcome_of(explicit(TOOL, pin=pin), ttl_s=ttl_s).supersedes_pin is supersedes


def test_a_new_implicit_job_supersedes_no_pin():
    # (A fresh implicit job id holds no pin, whatever the facts say.)
    assert not outcome_of(untagged(TOOL, pin=PinRelation.CONTINUED)).supersedes_pin


@pytest.mark.parametrize(
    "reason, ends, release, end_reason",
    [(R.LAST_STEP, True, "last_step", "last_step"), (R.FINISH_ACTION, True, "finish_action", "finish_action"),
     (R.FINAL_ANSWER, True, "last_step", "final_answer"), (R.ANSWERED, False, "last_step", "final_answer"),
     (R.ABORT, False, "abort", None)],
)
def test_an_end_says_whether_the_job_is_over_and_how_its_pin_goes(reason, ends, release, end_reason):
    outcome = TurnOutcome(K.END_JOB, reason)
    assert outcome.ends_job is ends and outcome.release_reason == release
    assert outcome.end_reason == end_reason
    assert outcome.answered is (reason is R.ANSWERED)


@pytest.mark.parametrize(
    "turn, rules, reads",
    [
        (FinishedTurn(finished=False, job_id=JOB), ON, False),
        (FinishedTurn(unbound=True), ON, False),
        (FinishedTurn(), NO_IMPLICIT, False),
        (FinishedTurn(), ON, True),
        (FinishedTurn(job_id=JOB), NO_IMPLICIT, True),
    ],
    ids=["preempted", "unbound", "untagged, implicit off", "untagged, implicit on", "job"],
)
def test_the_reply_is_read_only_when_the_rules_look_at_it(turn, rules, reads):
    assert needs_reply(turn, rules) is reads


def test_a_turn_that_may_act_on_a_job_needs_its_reply():
    with pytest.raises(ValueError, match="reply"):
        decide_turn(FinishedTurn(job_id=JOB), ON)


def test_only_retain_takes_a_ttl():
    with pytest.raises(ValueError, match="RETAIN"):
        decide_turn(explicit(TOOL), NO_PINNING).with_ttl(5.0)


def test_outcomes_are_frozen_values():
    outcome = outcome_of(explicit(TOOL))
    with pytest.raises(AttributeError):
        outcome.kind = K.STOCK  # type: ignore[misc]
    assert outcome == outcome_of(explicit(TOOL))


def test_the_rules_import_without_vllm():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'vllm' or name.startswith('vllm.'):\n"
        "            raise ImportError('vllm is blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import vllm_continuum_plugin.turn_outcome, vllm_continuum_plugin.request_record\n"
        "import vllm_continuum_plugin.conversations\n"
    )
    # From an empty directory: the installed package, not a source tree's.
    with tempfile.TemporaryDirectory() as empty:
        subprocess.run([sys.executable, "-c", code], check=True, cwd=empty)
