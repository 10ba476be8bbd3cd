"""What a step-time model sees of one engine step.

A step's cost depends on the shape of the batch the scheduler built, not on
the token values: for each request that prefills in the step, how many new
tokens it computes and how much context it already has in the KV cache; for
each request that decodes, its context length.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchShape", "PrefillChunk"]


@dataclass(frozen=True)
class PrefillChunk:
    """One request's prefill work in a step.

    Invariants: ``new_tokens >= 1``; ``cached_tokens >= 0`` (context computed
    before this chunk: a prefix-cache hit, an earlier chunk, or reloaded KV).
    """

    new_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class BatchShape:
    """The batch of one step.

    ``prefills``: requests computing prompt tokens (chunked prefill gives a
    request one chunk a step). ``decode_contexts``: for each request that
    samples one token in the step from a finished prompt, the tokens already
    in its KV cache (prompt plus earlier output).
    ``loaded_tokens``: KV tokens copied host -> GPU in the step (offload
    reloads), ``stored_tokens``: GPU -> host; a step model that prices
    transfers adds them, others ignore them.
    """

    prefills: tuple[PrefillChunk, ...] = ()
    decode_contexts: tuple[int, ...] = ()
    loaded_tokens: int = 0
    stored_tokens: int = 0

    @property
    def num_prefill_tokens(self) -> int:
        return sum(p.new_tokens for p in self.prefills)

    @property
    def num_decodes(self) -> int:
        return len(self.decode_contexts)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decode_contexts
