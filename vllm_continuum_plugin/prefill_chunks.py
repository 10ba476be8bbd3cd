"""Prefill chunks: a job's next turn does not wait behind a long prefill.

vLLM's scheduler gives the step's token budget to the running requests
first, in order, and the waiting queue gets what is left. A running prefill
of 49k tokens takes the whole budget (8,192 tokens on an H100 by default)
step after step, so an agent's next turn that needs a few hundred new
tokens over a context the pool already holds waits the whole prefill out:
2-3 s on Llama-3.1-70B, and the turn misses a 2 s TTFT bound it would have
kept by a wide margin. This head-of-line blocking is what made the turns
that returned to a context they kept miss the SLO in docs/capacity.md.

vLLM already has the knob that stops it, ``long_prefill_token_threshold``
(each request's chunk in a step is cut to it), but it is static: set, it
slows every long prefill in every step, whether anyone waits or not.
:class:`PrefillChunks` sets it for one step at a time, only while a later
turn of a job under way heads the waiting queue (Continuum ranks those
first) and a running prefill would take more than its share: each prefill
is cut to ``budget // (prefills running + 1)`` tokens (a whole number of
blocks), so the turn fits in the same step. Steps without such a turn run
exactly as vLLM would.

Invariants: the scheduler config's threshold is changed only inside one
``schedule()`` call (:meth:`PrefillChunks.apply` before it,
:meth:`PrefillChunks.restore` after, also when it raises); a threshold the
user set is never raised, only lowered; a step is never cut below one block
per request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from vllm.v1.request import Request

__all__ = ["PrefillChunks", "chunk_share"]


def chunk_share(budget: int, prefills: int, block_size: int) -> int:
    """The most tokens each of ``prefills`` running prefills may take in a
    step whose token ``budget`` must also leave one share to a waiting turn:
    ``budget // (prefills + 1)``, rounded down to whole blocks (a chunk that
    ends mid-block leaves that block unhashed until the next chunk), at
    least one block."""
    if budget <= 0 or prefills < 0 or block_size <= 0:
        raise ValueError(f"chunk_share needs budget > 0, prefills >= 0, block_size > 0; got "
                         f"budget={budget}, prefills={prefills}, block_size={block_size}")
    share = budget // (prefills + 1)
    return max(block_size, share // block_size * block_size)


class PrefillChunks:
    """Cuts long prefills for one step while a job's next turn waits (see
    module doc). ``is_next_turn`` says whether a waiting request is a later
    turn of a job under way (the scheduler's job table knows)."""

    def __init__(self, scheduler_config: Any, budget: int, block_size: int,
                 is_next_turn: Callable[[Request], bool], on_cut: Callable[[], None] = lambda: None) -> None:
        self._config = scheduler_config
        self._budget = budget
        self._block_size = block_size
        self._is_next_turn = is_next_turn
        self._on_cut = on_cut  # the metrics' counter
        self._saved: int | None = None  # the threshold to restore; None: untouched this step
        # Steps in which a cut was applied.
        self.steps_cut = 0

    def cut_for(self, waiting_head: Request | None, running: Iterable[Request]) -> int | None:
        """This step's chunk cut, or None to leave the step as vLLM would
        schedule it: only when ``waiting_head`` is a job's next turn and a
        running prefill has more left than its share."""
        if waiting_head is None or not self._is_next_turn(waiting_head):
            return None
        remaining = [r.num_prompt_tokens - r.num_computed_tokens for r in running
                     if r.num_computed_tokens < r.num_prompt_tokens]
        if not remaining:
            return None
        share = chunk_share(self._budget, len(remaining), self._block_size)
        current = int(self._config.long_prefill_token_threshold)
        if 0 < current <= share or max(remaining) <= share:
            return None  # the user's own cut is tighter, or no prefill is long
        return share

    def apply(self, waiting_head: Request | None, running: Iterable[Request]) -> None:
        """Before ``schedule()``: set this step's cut, if it needs one."""
        cut = self.cut_for(waiting_head, running)
        if cut is None:
            return
        self._saved = int(self._config.long_prefill_token_threshold)
        self._config.long_prefill_token_threshold = cut
        self.steps_cut += 1
        self._on_cut()

    def restore(self) -> None:
        """After ``schedule()``: the user's threshold again."""
        if self._saved is not None:
            self._config.long_prefill_token_threshold = self._saved
            self._saved = None
