"""The conversations of a job id: which job state a request acts on.

A job id is a name any client can send (``job_id``, ``X-Session-ID``, a
harness's session header), and one session often carries several
conversations at once: a coding agent's sub-agents (Claude Code's ``Task``,
Codex sub-agents) share their session id with the main conversation, and
harnesses send one-turn side requests (a session title, a summary) under it.
So a session id names up to ``max_conversations`` *conversations*, each a job
of its own: its own pin, tool-time measurement, queue order, soft-pin rank
and end. A request acts on the conversation whose context it continues,
decided by shared prefix (:mod:`~.prompt_prefix`):

1. among the session's conversations of the request's client scope, the one
   whose recent prompt (one of its last ``MAX_PROMPTS`` turns', in flight
   or finished) the request continues with the longest shared prefix: more
   than the conversation's *base* (what its first turn found in the prefix
   cache: a system prompt, tools, computed by earlier traffic) and at least
   half of that prompt's blocks beyond it. A prompt's rewritten tail
   (reasoning dropped from history, a reminder, AIPerf's hash-block
   prompts) still continues it; a compacted history or a sub-agent sharing
   only the system prompt does not. Ties go to the most recently used; a
   pin holds one of those prompts, so it is decided the same way. A
   conversation whose first turn is still running is continued by nothing
   (no reply yet: a request sharing its prompt is a parallel sub-agent);
2. else a new conversation of the session. The session's first keeps the
   session id as its job key; later ones get ``conversation_key(session,
   n)``, which no client can name (the separator is not printable, and job
   ids must be);
3. when the session already has ``max_conversations``: the least recently
   used one with nothing in flight and no pin is forgotten to make room;
   when every one is busy, the request is served as stock (untagged, with a
   DEBUG line and the ``context_mismatches`` counter).

This is what keeps a job id from being a bearer token: a request under
another client's id that does not continue its context, or comes from
another client scope, becomes a conversation of its own. It cannot end the
victim's job, have its arrival measured as the victim's tool time, rank by
the victim's first arrival or take the victim's pin.

A request that names a sub-agent (``agent_id``: Claude Code's
``x-claude-code-agent-id`` header) continues only a conversation of that
sub-agent, and one that names none only a conversation of no sub-agent: the
client's word keeps a sub-agent apart from its parent and its siblings even
where their prompts share most of their blocks (parallel sub-agents started
with near-identical prompts). Prefix and scope are still required, so a
client naming another's sub-agent gets a conversation of its own.

A prompt shorter than one block continues nothing (and is continued by
nothing): two such requests of a session are two conversations.

Matching costs O(conversations x ``MAX_PROMPTS`` x log checkpoints) hash
compares per request, whatever the prompts' lengths.

Invariants: at most ``max_jobs`` conversations in all (the sessions used
least recently go first), ``max_conversations`` per session and
``MAX_PROMPTS`` prompts per conversation (``CHECKPOINTS + TAIL_CHECKPOINTS``
hashes each at most) are
remembered; a conversation's key
is never another session's; a conversation whose job ends is forgotten (its
key is free again), and one forgotten to make room has its job state
forgotten too (``on_evict``), so a key used again starts a fresh job.
Nothing here imports vLLM.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .estimators.history import JobState
from .metadata import JobMetadata
from .prompt_prefix import PromptPrefix
from .request_record import request_record

logger = logging.getLogger("vllm.continuum_plugin")

__all__ = [
    "MAX_CONVERSATIONS",
    "MAX_PROMPTS",
    "Conversations",
    "conversation_key",
    "session_of",
]

# Recent turns' prompts remembered per conversation: a retry or an
# overlapping turn of the same conversation continues one of them.
MAX_PROMPTS = 2
# Conversations per session id: a main conversation, its sub-agents running
# at once, a side request or two.
MAX_CONVERSATIONS = 8
# Between a session id and a conversation's number. Not printable: no job id
# a client sends can contain it (metadata.parse_job_id), so no client can
# name another session's conversation.
SEPARATOR = "\x1f"


def conversation_key(session: str, number: int) -> str:
    """The job key of conversation ``number`` (0: the first) of ``session``."""
    if number < 0:
        raise ValueError(f"a conversation number is >= 0, got {number}")
    return session if number == 0 else f"{session}{SEPARATOR}{number}"


def session_of(key: str) -> str:
    """The session id a conversation's job key belongs to."""
    return key.split(SEPARATOR, 1)[0]


def shown(key: str) -> str:
    """A conversation's key for a log line: ``session#n``."""
    session, _, number = key.partition(SEPARATOR)
    return f"{session}#{number}" if number else session


@dataclass
class _Conversation:
    key: str
    # The sub-agent whose conversation it is (``JobMetadata.agent_id``), or
    # None: only that agent's requests continue it, and it continues no other.
    agent: str | None = None
    # Its recent turns' prompts, oldest first.
    prompts: list[PromptPrefix] = field(default_factory=list)

    def continuation(self, block_hashes: Sequence[Any], base_blocks: int) -> int | None:
        """The most blocks a request shares with a recent prompt it
        continues (:meth:`PromptPrefix.continuation`), else None."""
        best: int | None = None
        for prompt in self.prompts:
            shared = prompt.continuation(block_hashes, base_blocks)
            if shared is not None and (best is None or shared > best):
                best = shared
        return best

    def add(self, prompt: PromptPrefix) -> None:
        if prompt.num_blocks == 0:
            return  # continues nothing, so nothing continues it
        if prompt in self.prompts:
            self.prompts.remove(prompt)
        self.prompts.append(prompt)
        del self.prompts[:-MAX_PROMPTS]


@dataclass
class _Session:
    # key -> conversation, least recently used first.
    conversations: OrderedDict[str, _Conversation] = field(default_factory=OrderedDict)
    # The number the next new conversation gets (0 is the session id itself).
    next_number: int = 1


class Conversations:
    """The conversations of each session id (see module doc)."""

    def __init__(
        self,
        block_size: int,
        max_jobs: int,
        max_conversations: int = MAX_CONVERSATIONS,
        on_mismatch: Callable[[], None] = lambda: None,
        on_new_conversation: Callable[[], None] = lambda: None,
        on_evict: Callable[[str], None] = lambda key: None,
    ) -> None:
        if max_jobs < 1:
            raise ValueError(f"max_jobs must be >= 1, got {max_jobs}")
        if max_conversations < 1:
            raise ValueError(f"max_conversations must be >= 1, got {max_conversations}")
        self._block_size = block_size
        self._max_jobs = max_jobs
        self._max_conversations = max_conversations
        # Conversations remembered, over all sessions.
        self._count = 0
        # Called with the key of a conversation forgotten to make room (its
        # job state goes too: the key may be used again).
        self._on_evict = on_evict
        # Called for a request served as stock because every conversation of
        # its session is busy (a counter).
        self._on_mismatch = on_mismatch
        # Called when a session gets a conversation besides its first.
        self._on_new_conversation = on_new_conversation
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def __len__(self) -> int:
        """Conversations remembered, over all sessions."""
        return self._count

    def keys_of(self, session: str) -> list[str]:
        """The job keys of ``session``'s live conversations, least recently
        used first."""
        entry = self._sessions.get(session)
        return list(entry.conversations) if entry is not None else []

    def beside_an_agent(self, key: str, job_of: Callable[[str], JobState | None]) -> bool:
        """Does ``key``'s session hold another live conversation that is an
        agent's (it offered the model tools or called one)? Only beside one
        is a tool-less one-turn conversation a side request (a title, a
        summary); a session of tool-less conversations (a chat, a replay
        tool) has none."""
        entry = self._sessions.get(session_of(key))
        if entry is None:
            return False
        for other in entry.conversations:
            job = job_of(other) if other != key else None
            if job is not None and (job.had_tool_call or job.tools_offered):
                return True
        return False

    def has_siblings(self, key: str) -> bool:
        """Does ``key``'s session hold a live conversation besides ``key``?"""
        entry = self._sessions.get(session_of(key))
        return entry is not None and any(k != key for k in entry.conversations)

    def side_requests(self, key: str, job_of: Callable[[str], JobState | None], scope: str) -> list[str]:
        """The conversations beside ``key`` (a conversation that offered the
        model tools and just started) that were one-turn side requests of
        the same client scope: one finished turn, nothing in flight, no tool
        called, no tool offered (a session title sent before the agent's
        first turn). Nothing comes after such a turn: the caller ends them.
        A conversation that ran more than one turn (a chat) is never one."""
        entry = self._sessions.get(session_of(key))
        if entry is None:
            return []
        found = []
        for other in entry.conversations:
            job = job_of(other) if other != key else None
            if (job is not None and job.turns_finished == 1 and job.in_flight == 0 and not job.had_tool_call
                    and job.tools_offered is False and job.scope == scope):
                found.append(other)
        return found

    def resolve(
        self,
        request: Any,
        meta: JobMetadata,
        job_of: Callable[[str], JobState | None],
        continues_pin: Callable[[str], bool | None],
    ) -> JobMetadata:
        """``meta`` with ``job_id`` set to the key of the conversation
        ``request`` acts on; without a job when every conversation of its
        session is busy (served as stock, its record keeps the name in
        ``unbound_job_id``). ``job_of`` gives a key's job state,
        ``continues_pin(key)`` whether ``request`` continues the key's pin
        (None: it holds none; a conversation holding a pin is never
        forgotten to make room)."""
        session_id = meta.job_id
        assert session_id is not None
        prompt = PromptPrefix.of_request(request, self._block_size)
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = _Session()
        self._sessions.move_to_end(session_id)
        key = self._continued(session, request.block_hashes, meta.scope, meta.agent_id, job_of)
        if key is None and session.conversations and logger.isEnabledFor(logging.DEBUG):
            logger.debug("continuum: request %s (%d prompt blocks) continues no conversation of session %s: %s",
                         request.request_id, prompt.num_blocks, session_id,
                         self._why_not(session, request.block_hashes, meta.scope, meta.agent_id, job_of))
        if key is None:
            key = self._start(session_id, session, meta.agent_id, job_of, continues_pin)
            if key is None:
                request_record(request).unbound_job_id = session_id
                self._on_mismatch()
                logger.debug("continuum: request %s names session %s, whose %d conversations are all busy, and "
                             "continues none of them; served as stock",
                             request.request_id, session_id, len(session.conversations))
                return dataclasses.replace(meta, job_id=None)
        conversation = session.conversations[key]
        session.conversations.move_to_end(key)
        conversation.add(prompt)
        self._evict_sessions()
        return meta if key == session_id else dataclasses.replace(meta, job_id=key)

    def _continued(
        self, session: _Session, block_hashes: Sequence[Any], scope: str, agent: str | None,
        job_of: Callable[[str], JobState | None],
    ) -> str | None:
        """The conversation of ``scope`` and sub-agent ``agent`` (None: no
        sub-agent's) that ``block_hashes`` continue with the longest shared
        prefix (ties: the most recently used), else None.
        (A pin holds the prompt of one of its conversation's recent turns,
        so the prompts decide for it too, base included: a sub-agent sharing
        only the system prompt never takes its parent's pin.)"""
        best: str | None = None
        best_shared = 0
        for key in reversed(session.conversations):
            job = job_of(key)
            if job is not None and job.scope != scope:
                continue  # another client's conversation is never continued
            if session.conversations[key].agent != agent:
                continue  # another agent's (the main conversation is no sub-agent's)
            if job is not None and job.turns_finished == 0 and job.in_flight > 0:
                # Its first turn has no reply yet, so nothing can be its next
                # turn: a request sharing its prompt is a parallel branch
                # (Claude Code starts Explore sub-agents with near-identical
                # prompts at once), a conversation of its own.
                continue
            base = (job.first_hit_tokens or 0) // self._block_size if job is not None else 0
            shared = session.conversations[key].continuation(block_hashes, base)
            if shared is not None and shared > best_shared:
                best, best_shared = key, shared
        return best

    def _why_not(
        self, session: _Session, block_hashes: Sequence[Any], scope: str, agent: str | None,
        job_of: Callable[[str], JobState | None],
    ) -> str:
        """For a DEBUG line: each conversation's shared blocks / prompt blocks
        (base), or its other scope."""
        parts = []
        for key, conversation in session.conversations.items():
            job = job_of(key)
            if job is not None and job.scope != scope:
                parts.append(f"{shown(key)}: another scope")
                continue
            if conversation.agent != agent:
                parts.append(f"{shown(key)}: another agent's")
                continue
            base = (job.first_hit_tokens or 0) // self._block_size if job is not None else 0
            shared = ", ".join(f"{p.shared_blocks(block_hashes)}/{p.num_blocks}" for p in conversation.prompts)
            parts.append(f"{shown(key)}: shares {shared or 'nothing remembered'} (base {base})")
        return "; ".join(parts)

    def _start(
        self, session_id: str, session: _Session, agent: str | None, job_of: Callable[[str], JobState | None],
        continues_pin: Callable[[str], bool | None],
    ) -> str | None:
        """A new conversation's key (room made if needed), or None; ``agent``:
        the sub-agent it belongs to (None: none's)."""
        conversations = session.conversations
        if len(conversations) >= self._max_conversations:
            idle = next((k for k in conversations if _idle(job_of(k)) and continues_pin(k) is None), None)
            if idle is None:
                return None
            del conversations[idle]
            self._count -= 1
            self._on_evict(idle)
        if session_id not in conversations:
            key = session_id
        else:
            key = conversation_key(session_id, session.next_number)
            session.next_number += 1
        if conversations:
            self._on_new_conversation()
            logger.debug("continuum: session %s: conversation %s starts beside %d others",
                         session_id, shown(key), len(conversations))
        conversations[key] = _Conversation(key, agent)
        self._count += 1
        return key

    def _evict_sessions(self) -> None:
        """Forget the least recently used sessions past ``max_jobs``
        conversations (never the one just used: it is the last)."""
        while self._count > self._max_jobs and len(self._sessions) > 1:
            _, session = self._sessions.popitem(last=False)
            self._count -= len(session.conversations)
            for key in session.conversations:
                self._on_evict(key)

    def forget(self, key: str) -> None:
        """The conversation's job ended: its key is free again."""
        session_id = session_of(key)
        session = self._sessions.get(session_id)
        if session is None:
            return
        if session.conversations.pop(key, None) is not None:
            self._count -= 1
        if not session.conversations:
            del self._sessions[session_id]


def _idle(job: JobState | None) -> bool:
    return job is None or job.in_flight == 0
