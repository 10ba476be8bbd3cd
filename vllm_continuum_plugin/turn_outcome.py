"""What a finished turn becomes: the rules of the block-freeing path as a value.

When vLLM frees a request's blocks (``Scheduler._free_request_blocks``), the
plugin decides what the turn means for its job and for its KV. The rules are
here, over plain values, so they can be read and tested without vLLM; the
scheduler gathers the facts, asks, and applies the answer.

A finished turn becomes exactly one of (:class:`TurnOutcomeKind`):

* ``STOCK`` -- not a turn of any job: vLLM frees the blocks as it would and
  no job state is touched. A preempted request (vLLM retries it); an
  untagged request while implicit jobs are off; an untagged reply that calls
  no tool (chat traffic) or a finish action (a one-turn agent), or a prompt
  of embeddings (no token ids to find its next turn by); a request that
  names a job whose context it does not continue. An untagged answer (a
  normal reply without a tool call or a last-step flag, token prompt) is
  still remembered (``registers_answer``): a later prompt that continues it
  starts an implicit chat, a job from then on -- or, where the scope's
  answers are seen to come back (``answers_return``: a chat client,
  AIPerf's sessions with no header the plugin reads), it is that chat's first turn at once
  (``starts_implicit_chat``, below).
* ``END_JOB`` -- the job's last turn (the client's ``is_last_step``, a
  finish action, a final answer) or a turn that did not finish normally
  (abort, error: reason ``abort``, the job is not over). The job's pin goes,
  the blocks are freed. A final answer after tool calls (reason
  ``answered``: under a client's session id, or an implicit job's, found
  again by its prompt) ends the agent's task but not the session: the
  user's next message may continue it, so the job stays known (its rank,
  its turns) and its blocks age as stock LRU. A sub-agent's answer (the
  request names one: ``agent_id``) is a final answer: it goes to the parent.
* ``FREE`` -- the job goes on but keeps nothing: pinning is off (prefix
  caching disabled), or the job's pin holds another context than this
  turn's (an overlapping turn of another branch keeps it).
* ``OFFLOAD`` -- the job goes on; its TTL is 0 (the tool is slow): the
  blocks go to the offload store, if there is one, and are freed.
* ``PIN`` -- the job goes on; its hashed blocks are pinned for ``ttl_s``.

An untagged answer in a scope whose answers come back is ``RETAIN`` with
``starts_implicit_chat``: its chat is a job from this turn on, and the
answer is kept as a session's answer is, so the user's next message finds
its context (served as stock, the first answer of every such chat would age
out of the prefix cache under load before its follow-up came).

Two questions, because the answer to the first decides whether the second is
asked: :func:`decide_turn` (from the request's metadata, its reply and the
job's state) gives ``STOCK``, ``END_JOB``, ``FREE`` or ``RETAIN`` -- the job
goes on and a TTL is to be decided; then :meth:`TurnOutcome.with_ttl` turns
``RETAIN`` and the TTL into ``FREE``, ``OFFLOAD`` or ``PIN``. A reply is read
only when :func:`needs_reply` says the rules look at it.

Invariants: the functions are pure (same facts, same outcome); a turn that
does not act on a job (``job_id`` None and no implicit job or chat
starting) is ``STOCK``; only a turn that finished normally and is not its
job's last is ``RETAIN``/``FREE``/``OFFLOAD``/``PIN``; a TTL is decided exactly for the
turns that reach ``RETAIN``; client metadata wins over the reply (an
``is_last_step`` turn ends its job whatever the reply says).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

__all__ = [
    "FinishedTurn",
    "PinRelation",
    "TurnOutcome",
    "TurnOutcomeKind",
    "TurnReason",
    "TurnReply",
    "TurnRules",
    "decide_turn",
    "needs_reply",
]


class TurnOutcomeKind(enum.Enum):
    """What a finished turn becomes (see module doc)."""

    STOCK = "stock"
    END_JOB = "end_job"
    RETAIN = "retain"  # not final: the job goes on, a TTL is to be decided
    FREE = "free"
    OFFLOAD = "offload"
    PIN = "pin"


class TurnReason(enum.Enum):
    """Why a turn has its outcome (one reason per outcome)."""

    # STOCK
    PREEMPTED = "preempted"
    UNTAGGED = "untagged"  # no job id, implicit jobs off
    NO_TOOL_CALL = "no_tool_call"  # untagged reply without a tool call: chat traffic
    ONE_TURN = "one_turn"  # untagged reply calling a finish action
    PROMPT_EMBEDS = "prompt_embeds"  # untagged prompt without token ids
    CONTEXT_MISMATCH = "context_mismatch"  # names a job, does not continue its context
    # END_JOB (the values are the metrics' job-end reasons)
    LAST_STEP = "last_step"
    FINISH_ACTION = "finish_action"
    FINAL_ANSWER = "final_answer"
    # A final answer after tool calls in a client-named job: the task ended,
    # the session may go on (the user's follow-up continues the job).
    ANSWERED = "answered"
    ABORT = "abort"  # aborted or failed: the job is not over, its pin goes
    # RETAIN, FREE, OFFLOAD, PIN
    CONTINUES = "continues"
    NO_PINNING = "no_pinning"
    OTHER_CONTEXT_PINNED = "other_context_pinned"
    TTL_ZERO = "ttl_zero"
    TTL = "ttl"


# The pin-release reason (metrics.RELEASE_REASONS) of a job's pin when its
# turn ends it: a final answer is the job's last step.
_RELEASE_REASON_AT_END = {
    TurnReason.LAST_STEP: "last_step",
    TurnReason.FINISH_ACTION: "finish_action",
    TurnReason.FINAL_ANSWER: "last_step",
    TurnReason.ANSWERED: "last_step",
    TurnReason.ABORT: "abort",
}


class PinRelation(enum.Enum):
    """The job's pin, seen from a finished turn of the job."""

    NONE = "none"  # the job holds no pin
    CONTINUED = "continued"  # it holds a prefix of this turn's context
    OTHER_CONTEXT = "other_context"  # it holds a context this turn does not continue


@dataclass(frozen=True)
class TurnRules:
    """The settings the rules read."""

    # Untagged turns whose reply calls a tool start implicit jobs.
    implicit_jobs: bool
    # Prefix caching is on: finished turns' blocks can be kept and found.
    pinning: bool


@dataclass(frozen=True)
class TurnReply:
    """What the scheduler read from the finished turn's reply."""

    # Finished by a stop condition (EOS, stop token, length, a stop string),
    # not aborted or failed.
    normal: bool
    # The reply (or the client's tool hints) calls a tool. Only read for a
    # turn that finished normally and is not flagged as its job's last.
    calls_tool: bool = False
    # ... and that call ends its job (``estimators.parser.is_finish_action``).
    finish_action: bool = False
    # Replies can be decoded (a tokenizer is there): "no tool call" is known,
    # not assumed. Only consulted for a reply without a tool call.
    readable: bool = True


@dataclass(frozen=True)
class FinishedTurn:
    """The facts of one finished (or preempted) request, as plain values."""

    # False: the request was preempted, not finished (vLLM retries it).
    finished: bool = True
    # The job the request acts on (None: untagged, or unbound below).
    job_id: str | None = None
    # The request named a job whose context it does not continue.
    unbound: bool = False
    # The client's flag: True ends the job; False says the client decides
    # the end (a reply without a tool call is then no final answer).
    is_last_step: bool | None = None
    # ``job_id`` is an implicit job's that a tool call started (it exists
    # only because of tool calls). An implicit chat's (started by a prompt
    # continuing an answer) is not: its turns follow a session's rules.
    implicit_job: bool = False
    # Some earlier finished turn of the job called a tool.
    had_tool_call: bool = False
    # The request offered the model tools (the API server says; None: not
    # known, e.g. /v1/completions or the engine driven directly).
    tools_offered: bool | None = None
    # The client sent a tool hint (name, command, expected seconds): a tool
    # runs before the next turn, whatever the request offered the model.
    tool_hinted: bool = False
    # The request names a sub-agent (``agent_id``): its answer is its
    # parent's tool result, which no person follows up.
    sub_agent: bool = False
    # Another conversation of the job's session is live and is an agent's:
    # it offered the model tools or called one (conversations).
    side_conversation: bool = False
    # The prompt is token ids (not embeddings): implicit jobs match by them.
    token_prompt: bool = True
    # Untagged: the scope's recent answers were mostly followed up
    # (``ImplicitJobIndex.answers_return``), so an answer is a chat's start.
    answers_return: bool = False
    # The job's pin and this turn (the hand-over test of ``PinManager.held_for``).
    pin: PinRelation = PinRelation.NONE
    # The reply as read; None when it was not read (``needs_reply`` False).
    reply: TurnReply | None = None


@dataclass(frozen=True)
class TurnOutcome:
    """A turn's outcome: its kind, why, and for a pin the TTL (frozen)."""

    kind: TurnOutcomeKind
    reason: TurnReason
    # An untagged turn that called a tool: it starts an implicit job (and
    # then goes on as that job's turn). Only with RETAIN/FREE/OFFLOAD/PIN.
    starts_implicit_job: bool = False
    # An untagged answer (STOCK only): remembered, so that a prompt that
    # continues it starts an implicit chat (implicit_jobs.register_answer).
    registers_answer: bool = False
    # An untagged answer where the scope's answers come back (RETAIN only):
    # registered as an answer and made its chat's first turn, kept as a
    # session's answer is.
    starts_implicit_chat: bool = False
    # The job's pin holds a prefix of this turn: the new pin supersedes it
    # (released as a hand-over first). RETAIN, OFFLOAD, PIN.
    supersedes_pin: bool = False
    # The TTL decided (OFFLOAD: 0; PIN: > 0; FREE with another context's pin:
    # the TTL that was decided and not used); None before one is decided.
    ttl_s: float | None = None

    @property
    def ends_job(self) -> bool:
        """The job is over (its state is forgotten); an abort is not an end,
        nor an answer its session may follow up (``answered``)."""
        return self.kind is TurnOutcomeKind.END_JOB and self.reason not in (TurnReason.ABORT, TurnReason.ANSWERED)

    @property
    def answered(self) -> bool:
        """The job's task ended with an answer its user may follow up: its
        pin goes, its state stays (END_JOB only)."""
        return self.kind is TurnOutcomeKind.END_JOB and self.reason is TurnReason.ANSWERED

    @property
    def end_reason(self) -> str | None:
        """The metrics' job-end reason (``metrics.JOB_END_REASONS``) of a
        turn that ends its job's task, else None (an abort)."""
        if self.ends_job:
            return self.reason.value
        return TurnReason.FINAL_ANSWER.value if self.answered else None

    @property
    def release_reason(self) -> str:
        """The reason the job's pin is released with (END_JOB only)."""
        return _RELEASE_REASON_AT_END[self.reason]

    def with_ttl(self, ttl_s: float) -> TurnOutcome:
        """RETAIN, with the TTL decided for the turn: FREE when the job's pin
        holds another context (that pin stays, this turn is not kept),
        OFFLOAD for a TTL of 0, else PIN."""
        if self.kind is not TurnOutcomeKind.RETAIN:
            raise ValueError(f"a TTL decides only a RETAIN outcome, not {self.kind.name}")
        if self.reason is TurnReason.OTHER_CONTEXT_PINNED:
            return dataclasses.replace(self, kind=TurnOutcomeKind.FREE, ttl_s=ttl_s)
        if ttl_s <= 0:
            return dataclasses.replace(self, kind=TurnOutcomeKind.OFFLOAD, reason=TurnReason.TTL_ZERO, ttl_s=0.0)
        return dataclasses.replace(self, kind=TurnOutcomeKind.PIN, reason=TurnReason.TTL, ttl_s=ttl_s)


def needs_reply(turn: FinishedTurn, rules: TurnRules) -> bool:
    """Do the rules read ``turn``'s reply? Not for a preempted or unbound
    request, nor for an untagged one while implicit jobs are off: those are
    STOCK whatever it says (and reading a reply costs a decode)."""
    if not turn.finished or turn.unbound:
        return False
    return turn.job_id is not None or rules.implicit_jobs


def _stock(reason: TurnReason) -> TurnOutcome:
    return TurnOutcome(TurnOutcomeKind.STOCK, reason)


def _end(reason: TurnReason) -> TurnOutcome:
    return TurnOutcome(TurnOutcomeKind.END_JOB, reason)


def decide_turn(turn: FinishedTurn, rules: TurnRules) -> TurnOutcome:
    """``turn``'s outcome: STOCK, END_JOB, FREE or RETAIN (see module doc).

    ``turn.reply`` must be set when :func:`needs_reply` is True."""
    if not turn.finished:
        return _stock(TurnReason.PREEMPTED)
    if turn.unbound:
        # A job id belongs to nobody: a request that names a job without
        # continuing its context must not end it, time it or keep blocks
        # for it (nor become an implicit job: the client named a job).
        return _stock(TurnReason.CONTEXT_MISMATCH)
    if turn.job_id is None and not rules.implicit_jobs:
        return _stock(TurnReason.UNTAGGED)
    reply = turn.reply
    if reply is None:
        raise ValueError("decide_turn needs the reply of a turn that may act on a job (see needs_reply)")
    starts_implicit = False
    if turn.job_id is None:
        # Only a normally finished reply without a last-step flag is read
        # for a call, so a job started here goes on.
        if not reply.normal or turn.is_last_step or not reply.calls_tool:
            answer = reply.normal and not turn.is_last_step and turn.token_prompt and rules.pinning
            if answer and turn.answers_return:
                return TurnOutcome(TurnOutcomeKind.RETAIN, TurnReason.CONTINUES, starts_implicit_chat=True)
            return TurnOutcome(TurnOutcomeKind.STOCK, TurnReason.NO_TOOL_CALL, registers_answer=answer)
        if reply.finish_action:
            return _stock(TurnReason.ONE_TURN)
        if not turn.token_prompt:
            return _stock(TurnReason.PROMPT_EMBEDS)
        starts_implicit = True
    elif turn.is_last_step:
        return _end(TurnReason.LAST_STEP)
    elif not reply.normal:
        return _end(TurnReason.ABORT)
    elif reply.calls_tool and reply.finish_action:
        return _end(TurnReason.FINISH_ACTION)
    elif not reply.calls_tool and _is_final_answer(turn, reply):
        # After tool calls the user may follow up (under the job id, or an
        # implicit job's by prompt); a side request that called no tool has
        # nothing to follow, nor a sub-agent (its answer goes to its parent).
        answered = turn.had_tool_call and not turn.sub_agent
        return _end(TurnReason.ANSWERED if answered else TurnReason.FINAL_ANSWER)
    if not rules.pinning:
        return TurnOutcome(TurnOutcomeKind.FREE, TurnReason.NO_PINNING, starts_implicit_job=starts_implicit)
    # A new implicit job holds no pin yet.
    pin = PinRelation.NONE if starts_implicit else turn.pin
    return TurnOutcome(
        TurnOutcomeKind.RETAIN,
        TurnReason.OTHER_CONTEXT_PINNED if pin is PinRelation.OTHER_CONTEXT else TurnReason.CONTINUES,
        starts_implicit_job=starts_implicit,
        supersedes_pin=pin is PinRelation.CONTINUED,
    )


def _is_final_answer(turn: FinishedTurn, reply: TurnReply) -> bool:
    """A normally finished reply without a tool call: does it end its job?
    An implicit agent's always does (it exists only because of tool calls;
    an implicit chat's turns follow an explicit job's rules). An explicit
    job's does when the reply was actually read ("no tool call"
    is then known, not assumed), the client did not send ``is_last_step``
    (an explicit ``false`` keeps the answer pinned while its user reads
    it), and either an earlier turn of the job called a tool, or the job is
    a sub-agent's (the client named it: its answer is its parent's tool
    result), or a side request: a conversation beside another of its session whose
    request offered the model no tool and hinted none (a session title, a
    summary: nothing comes after it). A lone tool-less conversation (a chat
    under a session id) is not ended here. A job forgotten (ended, evicted)
    and started again under the same id has had no tool call yet."""
    if turn.implicit_job:
        return True
    side_request = turn.side_conversation and turn.tools_offered is False and not turn.tool_hinted
    return turn.is_last_step is None and reply.readable and (turn.had_tool_call or turn.sub_agent or side_request)
