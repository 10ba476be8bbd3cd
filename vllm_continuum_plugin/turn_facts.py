"""Reading a finished vLLM request into the facts ``turn_outcome`` decides on.

The rules (``turn_outcome``) see plain values; this is where they come from:
the request's record (metadata, whether it named a job it does not
continue), the job's state, the job's pin and, only when the rules look at
it, the reply (:class:`~.reply_reader.ReplyReader`: how the request finished,
the tool it calls). Read-only: nothing here changes a job, a pin or the
request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .estimators.history import JobTracker
from .estimators.parser import ToolCall, is_finish_action
from .implicit_jobs import has_token_prompt, is_implicit_chat, is_implicit_job
from .pin_manager import PinManager
from .reply_reader import ReplyReader
from .request_record import peek_record, request_meta
from .turn_outcome import FinishedTurn, PinRelation, TurnReply, TurnRules, needs_reply

__all__ = ["TurnReader"]


class TurnReader:
    """The facts of one scheduler's finished turns (see module doc)."""

    def __init__(
        self, replies: ReplyReader, jobs: JobTracker, pins: PinManager, finish_actions: frozenset[str],
        rules: TurnRules, beside_an_agent: Callable[[str], bool] = lambda key: False,
        answers_return: Callable[[str], bool] = lambda scope: False,
    ) -> None:
        self._replies = replies
        self._jobs = jobs
        self._pins = pins
        self._finish_actions = finish_actions
        self.rules = rules
        # Does a job key's session hold another live conversation that is an
        # agent's (offered tools or called one)?
        self._beside_an_agent = beside_an_agent
        # Are a scope's untagged answers mostly followed up (implicit chats)?
        self._answers_return = answers_return

    def read(self, request: Any) -> tuple[FinishedTurn, ToolCall | None]:
        """The facts ``decide_turn`` reads for ``request`` (finished or
        preempted), and the reply's tool call. The reply is read once, and
        only when ``needs_reply`` says the rules look at it."""
        record = peek_record(request)
        meta = request_meta(request)
        job_id = meta.job_id
        job = self._jobs.get(job_id) if job_id is not None else None
        continues_pin = self._pins.continued_by(job_id, request.block_hashes) if job_id is not None else None
        turn = FinishedTurn(
            finished=request.is_finished(),
            job_id=job_id,
            unbound=record is not None and record.unbound_job_id is not None,
            is_last_step=meta.is_last_step,
            implicit_job=is_implicit_job(job_id) and not is_implicit_chat(job_id),
            had_tool_call=job is not None and job.had_tool_call,
            tools_offered=meta.tools_offered,
            tool_hinted=(meta.tool_name is not None or meta.tool_command is not None
                         or meta.expected_tool_seconds is not None),
            sub_agent=job_id is not None and meta.agent_id is not None,
            side_conversation=job_id is not None and self._beside_an_agent(job_id),
            token_prompt=has_token_prompt(request),
            answers_return=job_id is None and self._answers_return(meta.scope),
            pin=(PinRelation.NONE if continues_pin is None
                 else PinRelation.CONTINUED if continues_pin else PinRelation.OTHER_CONTEXT),
        )
        if not needs_reply(turn, self.rules):
            return turn, None
        normal, reply_text = self._replies.finished_normally(request)
        call = self._replies.tool_call(meta, request, reply_text) if normal and not meta.is_last_step else None
        reply = TurnReply(
            normal=normal,
            calls_tool=call is not None,
            finish_action=call is not None and is_finish_action(call, self._finish_actions),
            # "No tool call" counts only if replies can be decoded at all.
            readable=call is not None or not normal or self._replies.can_read(),
        )
        return dataclasses.replace(turn, reply=reply), call
