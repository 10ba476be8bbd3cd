"""Implicit jobs: recognise an agent's next turn without a job id.

An agent re-sends its whole conversation every turn, so the next turn's
prompt starts with the previous turn's prompt *and reply*. When an untagged
turn finishes with a tool call, the scheduler registers it here under a job
id of its own; a later untagged request whose prompt continues it is that
job's next turn (it takes the pin over, job ordering and tool-time
measurement apply), exactly as if the client had sent the job id.

How a continuation is found:

* **The prompt, by vLLM's own block hashes.** A registered turn is keyed by
  the hash of its prompt's last full block (a block's hash covers every
  token before it, so equal hashes mean equal prefixes). Every block hash of
  every registered prompt is counted in ``_known``; that set is closed under
  prefixes, so for a new prompt "block ``i`` is known" holds for
  ``i = 0..L`` and for no later block, and a binary search finds ``L`` in
  O(log n) set lookups -- never a scan over tokens or jobs.
* **The reply, by its text.** The chat template re-renders the reply in the
  next prompt, and the re-rendered tokens need not be the tokens the model
  sampled (constrained decoding and tool parsers produce non-canonical
  tokenisations; tool-call JSON is re-serialised). So the turn keeps a digest
  of its text from the key block's end to the end of the reply, whitespace
  removed; the candidate continues the turn when the new prompt's text from
  the same position starts with that text. The match therefore covers the
  whole reply: two jobs that share a system prompt and task but not a reply
  are never confused. At most ``MAX_CANDIDATES`` turns share one key, so a
  match decodes one bounded window and compares a few digests.
* **Else by shared prefix.** Many prompts do not re-send the previous turn
  verbatim: AIPerf rebuilds each prompt from hash blocks (the previous
  prompt's partial tail block is not carried over, the reply not
  appended), templates drop earlier reasoning, harnesses rewrite a
  reminder at the tail. A prompt continues turn ``T`` by prefix when the
  longest prefix it shares with the scope's turns ends in a block that
  ``T`` alone holds (a prefix two turns hold -- a system prompt, a task
  sent twice -- says nothing about whose turn this is), that prefix
  covers at least ``PREFIX_SHARE`` of ``T``'s blocks beyond its *base*
  (what ``T`` shared with the scope's other turns when it was
  registered), and the prompt is longer than ``T``'s (a continuation adds
  content; a resend does not). Same O(log n) lookups, no decode.

Two kinds of turn are registered: an implicit job's turn that called a tool
(the job exists from that call on), and an untagged *answer* (a reply
without a tool call, :meth:`ImplicitJobIndex.register_answer`) under a chat
id (:func:`implicit_chat_id`): a chat, or a one-shot request. Where the
scope's answers are mostly followed up (:meth:`ImplicitJobIndex.answers_return`)
the chat is a job from that answer on (the scheduler keeps it as a
session's answer); elsewhere it becomes one only when a later prompt
continues the answer, and one-shot traffic, never continued, never holds
anything. An answer's turn keeps no reply text and is found again by prefix
only.

A match consumes the entry (the job has moved on): a second request that
continues the same turn (a branch, a retry, the same prompt sent twice) finds
nothing and is served as stock vLLM would serve it.

**Scoped** (``estimators.scopes``: an API key's, or a name the client
sends; untagged traffic shares one). A turn is registered in its client's
scope and only a request of the same scope can continue it, so no other
client can push a client's turn out of the index:

* two turns with the same prompt and reply in *one* scope cannot be told
  apart, so neither is kept; in two scopes they are two entries;
* the ``MAX_CANDIDATES`` cap on turns sharing a key holds per scope;
* when the index is full, the scope holding the most entries (or, when the
  block bound is what is hit, the most block hashes) gives up its least
  recently registered one: a flood from one scope evicts its own turns
  before anyone else's;
* the known-prefix search runs over the request's scope's blocks only.

Invariants: at most ``max_entries`` registered turns and at most
``max_blocks`` block hashes counted over all scopes; ``_known[scope]`` holds
exactly the multiset of that scope's live entries' block hashes; a block
hash's ``_holder``, where one is recorded, is a live entry of that scope
that holds it (a stale one is dropped, never re-pointed: a holder is only
trusted where exactly one live entry holds the hash); every job has at most
one entry.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from .estimators.scopes import DEFAULT_SCOPE

__all__ = [
    "IMPLICIT_JOB_PREFIX",
    "PREFIX_SHARE",
    "ImplicitJobIndex",
    "ImplicitTurn",
    "MIN_ANSWERS",
    "MIN_ANSWER_RETURN_RATE",
    "has_token_prompt",
    "implicit_chat_id",
    "is_implicit_chat",
    "is_implicit_job",
    "untagged_turn_key",
]

# Implicit job ids start with a control character, which client job ids may
# not contain (``metadata.parse_job_id``): no client can name one.
IMPLICIT_JOB_PREFIX = "\x00implicit-"
# An implicit job that a continued answer started (a chat, not a tool call):
# its answers do not end it (see turn_facts).
_CHAT_MARK = "chat-"
# Share of a turn's own blocks (beyond its base) a prompt must re-send to
# continue it by prefix. A rewritten tail (AIPerf's partial block, a
# reminder, a cache-control edit) costs a block or two; a compacted or
# re-templated history loses most of it and is not a continuation. Stricter
# than a named session's half (``conversations``): untagged traffic of a
# scope has no session id to narrow the candidates.
PREFIX_SHARE = 0.75
# Answers a scope's continuation rate is measured over (halved past twice
# this), the fewest before it is trusted, and the scopes it is kept for.
ANSWER_WINDOW = 128
MIN_ANSWERS = 8
MAX_RATE_SCOPES = 1024
# A scope's answers "come back" where at least this share of its recent ones
# were followed up: an answer there is kept as its chat's first turn, and
# the admission gate counts it as the chat it starts.
MIN_ANSWER_RETURN_RATE = 0.5
# Turns registered under one key (e.g. many jobs with the same first prompt);
# the oldest goes first. Bounds the work of a match.
MAX_CANDIDATES = 8
# A reply longer than this (from the key block on) keeps no text (it is found
# by prefix only): the match would have to decode it all.
MAX_SEGMENT_TOKENS = 8192
# Extra tokens decoded past a candidate's own length: re-rendering may
# tokenise the same text into more tokens.
_DECODE_SLACK_TOKENS = 64

Decode = Callable[[Sequence[int]], str]


def is_implicit_job(job_id: str | None) -> bool:
    return job_id is not None and job_id.startswith(IMPLICIT_JOB_PREFIX)


def is_implicit_chat(job_id: str | None) -> bool:
    """An implicit job started by a prompt that continued an answer."""
    return job_id is not None and job_id.startswith(IMPLICIT_JOB_PREFIX + _CHAT_MARK)


def untagged_turn_key(request_id: str) -> str:
    """The key the admission gate counts an untagged request under while it
    runs (its job, if any, gets its id when it finishes). Not printable: no
    client job id can equal it."""
    return f"\x00untagged-{request_id}"


def implicit_chat_id(number: int) -> str:
    """The job id of implicit chat ``number``."""
    return f"{IMPLICIT_JOB_PREFIX}{_CHAT_MARK}{number}"


def has_token_prompt(request: Any) -> bool:
    """The prompt is token ids (not ``prompt_embeds``): only then can an
    untagged request be matched, or registered, by its tokens."""
    return request.prompt_token_ids is not None and getattr(request, "prompt_embeds", None) is None


def _normalise(text: str) -> str:
    # Templates re-render whitespace (JSON separators, newlines) their own way.
    return "".join(text.split())


def _no_decode(token_ids: Sequence[int]) -> str:
    raise AssertionError("an answer's turn is registered without its text")


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


@dataclass(frozen=True)
class ImplicitTurn:
    """A finished turn that a later prompt may continue."""

    job_id: str
    # vLLM's hashes of the turn's full prompt blocks.
    block_hashes: tuple[Any, ...]
    # Tokens from the last full prompt block to the end of the reply.
    segment_tokens: int
    # Length and digest of that segment's text, whitespace removed (None: an
    # answer's turn, found by prefix only).
    text_len: int
    text_digest: bytes | None
    # The client scope it was registered in: only that scope continues it.
    scope: str = DEFAULT_SCOPE
    # Tokens of the turn's prompt: a continuation is longer.
    prompt_tokens: int = 0
    # Leading blocks it shared with the scope's other turns when registered
    # (a system prompt): sharing only those continues nothing.
    base_blocks: int = 0
    # An untagged answer (register_answer), not yet any job's turn.
    answer: bool = False


class ImplicitJobIndex:
    """Registered turns of implicit jobs, found again by prefix (module doc)."""

    def __init__(self, block_size: int, max_entries: int, max_blocks: int) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size!r}")
        if max_entries < 0 or max_blocks < 0:
            raise ValueError(f"max_entries and max_blocks must be >= 0, got {max_entries!r}, {max_blocks!r}")
        self.block_size = block_size
        self.max_entries = max_entries
        self.max_blocks = max_blocks
        # job id -> turn.
        self._turns: dict[str, ImplicitTurn] = {}
        # scope -> its job ids, least recently registered first.
        self._by_scope: dict[str, OrderedDict[str, None]] = {}
        # scope -> block hashes its entries count.
        self._scope_blocks: dict[str, int] = {}
        # (scope, key: last full prompt block's hash) -> job ids registered under it.
        self._by_key: dict[tuple[str, Any], list[str]] = {}
        # scope -> block hash -> number of the scope's live entries whose prompt contains it.
        self._known: dict[str, dict[Any, int]] = {}
        # scope -> block hash -> the entry that last registered it (trusted
        # only where ``_known`` counts exactly one holder).
        self._holder: dict[str, dict[Any, str]] = {}
        self._num_blocks = 0
        self._ids = itertools.count(1)
        # scope -> [answers registered, answers continued], decayed; LRU.
        self._answers: OrderedDict[str, list[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._turns)

    @property
    def num_blocks(self) -> int:
        """Block hashes counted over all live entries (bounded by ``max_blocks``)."""
        return self._num_blocks

    def new_job_id(self) -> str:
        return f"{IMPLICIT_JOB_PREFIX}{next(self._ids)}"

    def new_chat_id(self) -> str:
        return implicit_chat_id(next(self._ids))

    # -- registering ------------------------------------------------------
    def register(
        self,
        job_id: str,
        block_hashes: Sequence[Any],
        token_ids: Sequence[int],
        num_prompt_tokens: int,
        decode: Decode,
        stop_token_ids: Collection[int] = (),
        scope: str = DEFAULT_SCOPE,
        with_text: bool = True,
        answer: bool = False,
    ) -> bool:
        """Register ``job_id``'s finished turn in ``scope``: all its tokens
        (prompt, then reply), how many are prompt, and vLLM's hashes of its
        full blocks. Replaces the job's previous entry. Returns False when
        the turn cannot be found again (no full prompt block, no reply, a
        twin in the same scope) or does not fit the bounds.
        ``with_text`` False: keep no reply text (the turn is found by prefix
        only, and nothing is decoded); ``answer``: an untagged answer, no
        job's turn yet (``register_answer``)."""
        self.forget(job_id)
        end = len(token_ids)
        while end > num_prompt_tokens and token_ids[end - 1] in stop_token_ids:
            end -= 1
        num_full = min(num_prompt_tokens // self.block_size, len(block_hashes))
        start = num_full * self.block_size
        if num_full == 0 or num_full > self.max_blocks or self.max_entries == 0:
            return False
        if end <= num_prompt_tokens:
            return False
        # A reply too long to decode at every match is found by prefix only.
        with_text = with_text and end - start <= MAX_SEGMENT_TOKENS
        hashes = tuple(block_hashes[:num_full])
        known = self._known.get(scope)
        base = self._longest_known_prefix(known, hashes) if known else 0
        if with_text:
            text = _normalise(decode(token_ids[start:end]))
            text_len, digest = len(text), _digest(text)
        else:
            text_len, digest = 0, None
        turn = ImplicitTurn(job_id, hashes, end - start, text_len, digest, scope, num_prompt_tokens, base, answer)
        key = (scope, turn.block_hashes[-1])
        same_key = self._by_key.get(key, [])
        twins = [j for j in same_key if self._turns[j].text_digest == turn.text_digest]
        if twins:
            # Another job of this scope has the same prompt and reply:
            # neither can be told from the other, so neither is kept.
            for twin in twins:
                self.forget(twin)
            return False
        if len(same_key) >= MAX_CANDIDATES:
            self.forget(same_key[0])
        while len(self._turns) >= self.max_entries or self._num_blocks + num_full > self.max_blocks:
            self._evict(by_blocks=len(self._turns) < self.max_entries)
        self._turns[job_id] = turn
        self._by_scope.setdefault(scope, OrderedDict())[job_id] = None
        self._scope_blocks[scope] = self._scope_blocks.get(scope, 0) + num_full
        self._by_key.setdefault(key, []).append(job_id)
        known = self._known.setdefault(scope, {})
        holder = self._holder.setdefault(scope, {})
        for block_hash in turn.block_hashes:
            known[block_hash] = known.get(block_hash, 0) + 1
            holder[block_hash] = job_id
        self._num_blocks += num_full
        return True

    def register_answer(
        self, request: Any, stop_token_ids: Collection[int], scope: str = DEFAULT_SCOPE,
    ) -> str | None:
        """Register an untagged request's finished answer in ``scope`` under
        a new chat id (:func:`implicit_chat_id`), found again by prefix only:
        a later prompt that continues it starts that implicit job. Returns
        the chat id, or None when the turn was not registered."""
        chat_id = self.new_chat_id()
        registered = self.register(
            chat_id, request.block_hashes, request.all_token_ids, request.num_prompt_tokens,
            _no_decode, stop_token_ids, scope, with_text=False, answer=True,
        )
        if not registered:
            return None
        counts = self._answer_counts(scope)
        counts[0] += 1
        if counts[0] >= 2 * ANSWER_WINDOW:  # a window, not all time: halve both
            counts[0] /= 2
            counts[1] /= 2
        return chat_id

    def _answer_counts(self, scope: str) -> list[float]:
        counts = self._answers.pop(scope, None) or [0.0, 0.0]
        self._answers[scope] = counts
        if len(self._answers) > MAX_RATE_SCOPES:
            self._answers.popitem(last=False)
        return counts

    def answer_return_rate(self, scope: str = DEFAULT_SCOPE) -> float | None:
        """Share of the scope's recent untagged answers that a later prompt
        continued (a chat), or None before ``MIN_ANSWERS`` were registered.
        One-shot traffic is near 0; chats and AIPerf's sessions near 1."""
        counts = self._answers.get(scope)
        if counts is None or counts[0] < MIN_ANSWERS:
            return None
        return counts[1] / counts[0]

    def answers_return(self, scope: str = DEFAULT_SCOPE) -> bool:
        """Are the scope's answers mostly followed up (a known rate of at
        least ``MIN_ANSWER_RETURN_RATE``)?"""
        rate = self.answer_return_rate(scope)
        return rate is not None and rate >= MIN_ANSWER_RETURN_RATE

    def _evict(self, by_blocks: bool) -> None:
        """Forget the least recently registered turn of the scope holding
        the most entries (``by_blocks``: the most block hashes)."""
        if by_blocks:
            scope = max(self._scope_blocks, key=self._scope_blocks.__getitem__)
        else:
            scope = max(self._by_scope, key=lambda s: len(self._by_scope[s]))
        self.forget(next(iter(self._by_scope[scope])))

    def forget(self, job_id: str) -> None:
        """Drop ``job_id``'s entry (its job ended or moved on), if it has one."""
        turn = self._turns.pop(job_id, None)
        if turn is None:
            return
        scope = turn.scope
        key = (scope, turn.block_hashes[-1])
        same_key = self._by_key[key]
        same_key.remove(job_id)
        if not same_key:
            del self._by_key[key]
        entries = self._by_scope[scope]
        del entries[job_id]
        blocks = self._scope_blocks[scope] - len(turn.block_hashes)
        known = self._known[scope]
        holder = self._holder[scope]
        for block_hash in turn.block_hashes:
            count = known[block_hash] - 1
            if count:
                known[block_hash] = count
            else:
                del known[block_hash]
            if holder.get(block_hash) == job_id:
                # Another entry may hold it too, but which is not recorded:
                # forget the holder rather than point at the wrong one.
                del holder[block_hash]
        if entries:
            self._scope_blocks[scope] = blocks
        else:  # the scope's last entry: nothing of it is kept
            del self._by_scope[scope], self._scope_blocks[scope], self._known[scope], self._holder[scope]
        self._num_blocks -= len(turn.block_hashes)

    # -- finding ----------------------------------------------------------
    def _longest_known_prefix(self, known: dict[Any, int], block_hashes: Sequence[Any]) -> int:
        """Number of leading blocks of ``block_hashes`` in ``known`` (binary
        search: a scope's knowledge is closed under prefixes)."""
        lo, hi = 0, len(block_hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if block_hashes[mid - 1] in known:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def register_request(
        self, job_id: str, request: Any, decode: Decode, stop_token_ids: Collection[int], scope: str = DEFAULT_SCOPE,
    ) -> bool:
        """:meth:`register` a finished vLLM request (its block hashes, all
        its tokens and its prompt length) in ``scope``."""
        return self.register(
            job_id, request.block_hashes, request.all_token_ids, request.num_prompt_tokens, decode, stop_token_ids,
            scope,
        )

    def match(
        self, block_hashes: Sequence[Any], prompt_token_ids: Sequence[int], decode: Decode,
        scope: str = DEFAULT_SCOPE,
    ) -> str | None:
        """The job of ``scope`` whose registered turn this prompt continues,
        or None.

        A match consumes the entry: the job's next turn has arrived.
        """
        scope_known = self._known.get(scope)
        if not scope_known:
            return None
        known = self._longest_known_prefix(scope_known, block_hashes)
        if known == 0:
            return None
        candidates = [
            self._turns[j] for j in self._by_key.get((scope, block_hashes[known - 1]), ())
            if len(self._turns[j].block_hashes) == known and self._turns[j].text_digest is not None
        ]
        if candidates:
            start = known * self.block_size
            window = max(c.segment_tokens for c in candidates) + _DECODE_SLACK_TOKENS
            text = _normalise(decode(prompt_token_ids[start : start + window]))
            for turn in reversed(candidates):  # the most recent first
                # The prompt must go on past the reply: a continuation, not a resend.
                if len(text) > turn.text_len and _digest(text[: turn.text_len]) == turn.text_digest:
                    self.forget(turn.job_id)
                    return turn.job_id
        turn = self._prefix_match(scope, block_hashes, known, len(prompt_token_ids))
        if turn is None:
            return None
        self.forget(turn.job_id)
        if turn.answer:  # an answer was followed up: a chat
            counts = self._answers.get(scope)
            if counts is not None:
                counts[1] = min(counts[0], counts[1] + 1)
        return turn.job_id

    def _prefix_match(
        self, scope: str, block_hashes: Sequence[Any], known: int, prompt_tokens: int,
    ) -> ImplicitTurn | None:
        """The turn a prompt sharing ``known`` leading blocks with the
        scope's turns continues by prefix (module doc), or None."""
        last = block_hashes[known - 1]
        if self._known[scope].get(last) != 1:
            return None  # held by several turns: a shared prefix, nobody's context
        job_id = self._holder[scope].get(last)
        if job_id is None:
            return None
        turn = self._turns[job_id]
        own = len(turn.block_hashes) - turn.base_blocks
        if known <= turn.base_blocks or known - turn.base_blocks < PREFIX_SHARE * own:
            return None
        if prompt_tokens <= turn.prompt_tokens:
            return None  # a resend or a shorter rewrite: no new content
        return turn
