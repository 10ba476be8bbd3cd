"""What rebuilding a context costs when a KV connector the plugin does not
drive keeps a second tier (vLLM's native ``OffloadingConnector``, LMCache).

Such a connector stores KV on its own terms (the native one writes every
computed block through to host memory) and, when a later turn's prefix is
not on the GPU, loads it asynchronously: the request waits in
``WAITING_FOR_REMOTE_KVS`` until its load is reported. Dropping a pinned
context then costs that wait, not a prefill. The plugin learns the price
from what it sees, with no bandwidth constant:

* :class:`TierReloadModel` fits ``seconds = a + b * tokens`` over observed
  loads (tokens loaded, seconds from the step that started the load to the
  step that found it finished) and keeps the *coverage*: the share of the
  missing prefix tokens of returning turns that the tier served (a tier that
  evicts, or stores nothing, covers little, and a rebuild is then mostly
  prefill). Coverage is weighted by tokens (:class:`TokenCoverage`), not a
  mean of per-turn shares: most returning turns miss only the few hundred
  tokens at their tail that no tier (and no pin) holds -- the reply as the
  client re-rendered it -- and a mean of shares would let those price every
  dropped 100k-token context as a prefill;
* :class:`TierLoadTimer` times the loads for it.

Invariants: before ``min_samples`` loads and ``min_samples`` coverage
observations, :meth:`TierReloadModel.rebuild_seconds` answers None (the
scheduler then prices a rebuild as a prefill, as without a tier); the timer
holds at most one entry per request, and an entry leaves when the load is
reported or the request goes away.
"""

from __future__ import annotations

from collections.abc import Callable

from .history import SlidingMean
from .prefill import PrefillCostModel

__all__ = ["TierLoadTimer", "TierReloadModel", "TokenCoverage"]


class TokenCoverage:
    """Share of missing tokens a tier supplied, over the last ``window``
    returning turns: ``sum(loaded) / sum(missing)``, as the ratio of two
    sliding means over the same turns (O(1) per update).

    Invariant: ``0 <= share() <= 1`` (each turn's loaded tokens are clamped
    to its missing ones)."""

    def __init__(self, window: int = 256) -> None:
        self._missing = SlidingMean(window)
        self._loaded = SlidingMean(window)

    def add(self, missing_tokens: int, loaded_tokens: int) -> None:
        self._missing.add(missing_tokens)
        self._loaded.add(min(max(0, loaded_tokens), missing_tokens))

    def share(self) -> float:
        missing = self._missing.mean()
        return self._loaded.mean() / missing if missing > 0 else 0.0

    def __len__(self) -> int:
        return len(self._missing)


class TierReloadModel:
    """Learned cost of reloading a context from a connector's tier."""

    def __init__(self, window: int = 256, min_samples: int = 8) -> None:
        if min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {min_samples}")
        # No default slope: until loads are seen, the tier's cost is unknown.
        # A load is a copy: linear in tokens, no attention term.
        self.loads = PrefillCostModel(0.0, 0.0, window=window, min_samples=min_samples, quadratic=False)
        self.coverage = TokenCoverage(window)
        self.min_samples = min_samples

    def observe_load(self, tokens: int, seconds: float) -> None:
        self.loads.observe(tokens, seconds)

    def observe_return(self, missing_tokens: int, loaded_tokens: int) -> None:
        """A returning turn lacked ``missing_tokens`` of its prompt on the
        GPU; the tier supplied ``loaded_tokens`` of them."""
        if missing_tokens > 0:
            self.coverage.add(missing_tokens, loaded_tokens)

    @property
    def ready(self) -> bool:
        """Enough loads and returns seen, and the loads fit a positive
        per-token cost. A fit that does not (noisy timings, longer loads
        measured faster) is no price: the model's zero defaults would price
        every reload at nothing, so the scheduler keeps pricing a prefill."""
        return (self.loads.num_samples >= self.min_samples and len(self.coverage) >= self.min_samples
                and self.loads.coefficients().fitted)

    def rebuild_seconds(self, tokens: int, prefill_seconds: Callable[[int, int], float]) -> float | None:
        """Expected cost of rebuilding ``tokens`` of context dropped from the
        GPU: the covered share reloaded, the rest prefilled on top of it
        (``prefill_seconds(new, cached)``); None while the tier has not been
        observed enough to say."""
        if not self.ready or tokens <= 0:
            return None
        covered = self.coverage.share()
        loaded = int(tokens * covered)
        return (self.loads.seconds(loaded) if loaded > 0 else 0.0) + (
            prefill_seconds(tokens - loaded, loaded) if loaded < tokens else 0.0
        )


class TierLoadTimer:
    """Times asynchronous loads for a :class:`TierReloadModel`: from the step
    that put a request into ``WAITING_FOR_REMOTE_KVS`` (with the tokens the
    tier will supply) to the step that found its load finished."""

    def __init__(self, model: TierReloadModel) -> None:
        self.model = model
        self._started: dict[str, tuple[float, int]] = {}  # request id -> (monotonic start, tokens)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._started

    def __len__(self) -> int:
        return len(self._started)

    def start(self, request_id: str, now: float, tokens: int) -> None:
        if tokens > 0 and request_id not in self._started:
            self._started[request_id] = (now, tokens)

    def finish(self, request_id: str, now: float, failed: bool = False) -> None:
        entry = self._started.pop(request_id, None)
        if entry is not None and not failed:
            self.model.observe_load(entry[1], max(0.0, now - entry[0]))

    def forget(self, request_id: str) -> None:
        self._started.pop(request_id, None)
