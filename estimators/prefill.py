"""Online model of what it costs to rebuild a turn's KV cache.

``PrefillCostModel`` prices computing ``n`` new tokens on top of ``c`` tokens
already cached as

    seconds = overhead + a * n + b * n * (c + n / 2)

``a * n`` is the work linear in the tokens (the weight matmuls); ``b * n *
(c + n / 2)`` is attention: each new token attends to the ``c`` cached ones
and, causally, to the new ones before it (``n / 2`` on average). A linear
model is not enough: for an 8B model the attention FLOPs of a 100k-token
prefill exceed the linear ones, so a fit to short prefills prices a long
context at about half of what it costs.

The three coefficients are fitted online by non-negative least squares over
a sliding window of observed prefills (tokens computed, tokens cached, wall
time from admission to first token). Every prefill of one length gives a
proportional price (``a * n`` alone). Before ``min_samples`` observations, or
when no non-negative fit with a per-token cost explains the times better than
their mean (e.g. longer prefills measured faster), it answers with the
configured default: ``default_overhead_s + default_seconds_per_token * n``
(no attention term), so the TTL rule works from the first request. An
offload connector or a KV tier can feed its measured reload times through the
same interface (``quadratic=False``: a copy has no attention term).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PrefillCostModel", "PrefillFit", "PrefillTimer"]

# Column subsets of the design matrix [1, n, n * (c + n / 2)] tried by the
# non-negative fit, in order of preference: a later subset replaces an
# earlier one only when it fits strictly better, so on ties (all prefills of
# one length, exact linear data) the simpler, linear answer stands. Every
# subset holds a per-token column: an overhead alone prices no tokens.
_SUBSETS: tuple[tuple[int, ...], ...] = ((1,), (0, 1), (1, 2), (0, 1, 2), (2,), (0, 2))
_LINEAR_SUBSETS: tuple[tuple[int, ...], ...] = ((1,), (0, 1))
# Relative singular value below which a subset's columns count as collinear
# (the window cannot tell them apart: a smaller subset fits as well).
_RCOND = 1e-10


@dataclass(frozen=True)
class PrefillFit:
    """Coefficients of ``seconds = overhead_s + seconds_per_token * n +
    seconds_per_token_pair * n * (c + n / 2)``; ``fitted`` is False while
    they are the configured defaults. All are >= 0."""

    overhead_s: float
    seconds_per_token: float
    seconds_per_token_pair: float
    fitted: bool

    def seconds(self, tokens: int, cached: int = 0) -> float:
        n = float(max(0, tokens))
        c = float(max(0, cached))
        return self.overhead_s + self.seconds_per_token * n + self.seconds_per_token_pair * n * (c + n / 2.0)


class PrefillCostModel:
    """Seconds to compute ``tokens`` new tokens on top of ``cached`` ones
    (see module doc).

    Invariants: at most ``window`` samples are kept (oldest dropped); every
    coefficient of the answer is >= 0; ``seconds`` never decreases in
    ``tokens`` or ``cached``. Cost: ``observe`` is O(1); the first
    ``seconds`` after an observation refits (a few least-squares solves over
    ``window`` x 3 numbers), later ones reuse the fit.
    """

    def __init__(
        self,
        default_seconds_per_token: float = 2e-4,
        default_overhead_s: float = 0.01,
        window: int = 512,
        min_samples: int = 16,
        quadratic: bool = True,
    ) -> None:
        if default_seconds_per_token < 0:
            raise ValueError(
                f"default_seconds_per_token must be >= 0, got {default_seconds_per_token}"
            )
        if default_overhead_s < 0:
            raise ValueError(f"default_overhead_s must be >= 0, got {default_overhead_s}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.default_slope = default_seconds_per_token
        self.default_intercept = default_overhead_s
        self.min_samples = min_samples
        self.quadratic = quadratic
        self._window = window
        # Ring buffer of (tokens computed, tokens cached, seconds).
        self._samples = np.zeros((window, 3), dtype=np.float64)
        self._count = 0
        self._next = 0
        self._fit: PrefillFit | None = None

    def observe(self, tokens: int, seconds: float, cached: int = 0) -> None:
        """One measured prefill: ``tokens`` computed on top of ``cached``
        in ``seconds`` (nonsense -- no tokens, negative or hour-long times
        -- is ignored)."""
        if tokens <= 0 or not (0.0 <= seconds < 3600.0):
            return
        self._samples[self._next] = (float(tokens), float(max(0, cached)), float(seconds))
        self._next = (self._next + 1) % self._window
        self._count = min(self._count + 1, self._window)
        self._fit = None

    def coefficients(self) -> PrefillFit:
        """The current fit (or the defaults; see module doc)."""
        if self._fit is None:
            self._fit = self._solve()
        return self._fit

    def _default(self) -> PrefillFit:
        return PrefillFit(self.default_intercept, self.default_slope, 0.0, False)

    def _solve(self) -> PrefillFit:
        if self._count < max(1, self.min_samples):
            return self._default()
        data = self._samples[: self._count]
        n, c, y = data[:, 0], data[:, 1], data[:, 2]
        columns = np.column_stack((np.ones_like(n), n, n * (c + n / 2.0)))
        # Columns differ by ten orders of magnitude (1, 1e4, 1e9): scale each
        # to at most 1 so the rank test and the solve are well conditioned.
        scale = np.abs(columns).max(axis=0)
        scale[scale == 0.0] = 1.0
        scaled = columns / scale
        # Exact non-negative least squares in three unknowns: the optimum is
        # the plain least-squares solution on its own support, so the best
        # non-negative answer over all supports is it.
        tolerance = 1e-12 * float(y @ y)
        best: np.ndarray | None = None
        best_rss = np.inf
        for subset in (_SUBSETS if self.quadratic else _LINEAR_SUBSETS):
            design = scaled[:, subset]
            coef, _, rank, _ = np.linalg.lstsq(design, y, rcond=_RCOND)
            if rank < len(subset) or (coef < 0.0).any():
                continue
            residual = design @ coef - y
            rss = float(residual @ residual)
            if rss < best_rss - tolerance:
                full = np.zeros(3)
                full[list(subset)] = coef
                best, best_rss = full / scale, rss
        centred = y - y.mean()
        if (
            best is None
            or not np.isfinite(best).all()
            or best[1] + best[2] <= 0.0  # no positive per-token cost: not physics
            # Worse than pricing every prefill at the mean: the window says
            # nothing about tokens (e.g. longer prefills measured faster).
            or best_rss > float(centred @ centred) + tolerance
        ):
            return self._default()
        return PrefillFit(float(best[0]), float(best[1]), float(best[2]), True)

    def seconds(self, tokens: int, cached: int = 0) -> float:
        """Seconds to compute ``tokens`` new tokens on top of ``cached``
        tokens already in the cache (a rebuild from nothing: ``cached`` 0)."""
        return self.coefficients().seconds(tokens, cached)

    @property
    def num_samples(self) -> int:
        return self._count


class PrefillTimer:
    """Times admitted prefills for a ``PrefillCostModel``: from the step that
    admits a request (with the tokens it must compute and those it found
    cached) until its first output token. At most one entry per request in
    flight; an entry leaves when the request produces a token, finishes or
    disappears."""

    def __init__(self, model: PrefillCostModel) -> None:
        self.model = model
        # request id -> (monotonic admission time, tokens to compute, tokens cached)
        self._started: dict[str, tuple[float, int, int]] = {}

    def __bool__(self) -> bool:
        return bool(self._started)

    def start(self, request_id: str, now: float, tokens: int, cached: int = 0) -> None:
        self._started[request_id] = (now, max(1, tokens), max(0, cached))

    def forget(self, request_id: str) -> None:
        self._started.pop(request_id, None)

    def observe(self, requests: Mapping[str, Any], now: float) -> None:
        """Record the prefills that produced their first token by ``now``
        (``requests``: the scheduler's live requests by id)."""
        done: list[str] = []
        for req_id, (started, tokens, cached) in self._started.items():
            request = requests.get(req_id)
            if request is None:
                done.append(req_id)
            elif request.num_output_tokens > 0:
                self.model.observe(tokens, now - started, cached)
                done.append(req_id)
        for req_id in done:
            del self._started[req_id]
