"""Online model of what it costs to rebuild a turn's KV cache.

``PrefillCostModel`` fits ``seconds = a + b * tokens`` by least squares over a
sliding window of observed prefills (tokens actually computed, wall time from
admission to first token). Before ``min_samples`` observations with some
spread in length it answers with the configured default slope, so the TTL
rule works from the first request. An offload connector can feed its measured
reload times through the same interface instead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

__all__ = ["PrefillCostModel", "PrefillTimer"]


class PrefillCostModel:
    def __init__(
        self,
        default_seconds_per_token: float = 2e-4,
        default_overhead_s: float = 0.01,
        window: int = 512,
        min_samples: int = 16,
    ) -> None:
        if default_seconds_per_token < 0:
            raise ValueError(
                f"default_seconds_per_token must be >= 0, got {default_seconds_per_token}"
            )
        self.default_slope = default_seconds_per_token
        self.default_intercept = default_overhead_s
        self.min_samples = min_samples
        self._window = window
        self._points: deque[tuple[float, float]] = deque()
        self._sx = self._sy = self._sxx = self._sxy = 0.0
        self._fit: tuple[float, float] | None = None

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or not (0.0 <= seconds < 3600.0):
            return
        x, y = float(tokens), float(seconds)
        self._points.append((x, y))
        self._sx += x
        self._sy += y
        self._sxx += x * x
        self._sxy += x * y
        if len(self._points) > self._window:
            ox, oy = self._points.popleft()
            self._sx -= ox
            self._sy -= oy
            self._sxx -= ox * ox
            self._sxy -= ox * oy
        self._fit = None

    def _coefficients(self) -> tuple[float, float]:
        if self._fit is not None:
            return self._fit
        n = len(self._points)
        fit = (self.default_intercept, self.default_slope)
        if n >= self.min_samples:
            var_x = self._sxx - self._sx * self._sx / n
            mean_x = self._sx / n
            if var_x > 1e-9 * max(1.0, mean_x * mean_x) * n:
                slope = (self._sxy - self._sx * self._sy / n) / var_x
                intercept = (self._sy - slope * self._sx) / n
                if slope > 0:  # a negative slope is noise, not physics
                    fit = (max(0.0, intercept), slope)
            else:  # all prefills had the same length: proportional model
                fit = (0.0, self._sy / self._sx) if self._sx > 0 else fit
        self._fit = fit
        return fit

    def seconds(self, tokens: int) -> float:
        intercept, slope = self._coefficients()
        return intercept + slope * max(0, tokens)

    @property
    def num_samples(self) -> int:
        return len(self._points)


class PrefillTimer:
    """Times admitted prefills for a ``PrefillCostModel``: from the step that
    admits a request (with the tokens it must compute) until its first
    output token. At most one entry per request in flight; an entry leaves
    when the request produces a token, finishes or disappears."""

    def __init__(self, model: PrefillCostModel) -> None:
        self.model = model
        # request id -> (monotonic admission time, tokens to compute)
        self._started: dict[str, tuple[float, int]] = {}

    def __bool__(self) -> bool:
        return bool(self._started)

    def start(self, request_id: str, now: float, tokens: int) -> None:
        self._started[request_id] = (now, max(1, tokens))

    def forget(self, request_id: str) -> None:
        self._started.pop(request_id, None)

    def observe(self, requests: Mapping[str, Any], now: float) -> None:
        """Record the prefills that produced their first token by ``now``
        (``requests``: the scheduler's live requests by id)."""
        done: list[str] = []
        for req_id, (started, tokens) in self._started.items():
            request = requests.get(req_id)
            if request is None:
                done.append(req_id)
            elif request.num_output_tokens > 0:
                self.model.observe(tokens, now - started)
                done.append(req_id)
        for req_id in done:
            del self._started[req_id]
