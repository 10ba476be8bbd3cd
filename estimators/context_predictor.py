"""ContextServe: decide, per finished non-final agent turn, what to do with its
KV cache from the tool call the reply makes.

* FAST -> pin the KV for a TTL fitted to the tool (the next turn will be back
  before it matters);
* SLOW -> free it at once (the memory serves other jobs meanwhile);
* UNCERTAIN -> keep Continuum's TTL (the ``fallback`` callable: the
  configured ``ttl_policy``, ``priced`` by default).

``ContextAwarePredictor.predict`` asks, in order, and the first that does not
abstain decides:

1. the client's hint (``expected_tool_seconds``): FAST when it is at most
   ``fast_threshold_s`` (TTL ``(hint + round trip) * 1.2 + 0.05``, the
   round trip being the job's measured client overhead), SLOW when at least
   ``slow_threshold_s``, otherwise UNCERTAIN;
2. ``RulesLayer`` (``rules.py``): curated definitely-fast / definitely-slow
   commands;
3. ``BayesianLayer`` (``bayesian.py``): per-tool Normal-Inverse-Gamma
   posterior over log duration, Thompson-sampled;
4. ``XGBoostLayer`` (``xgb_classifier.py``): a 3-class classifier over
   ``features.FEATURE_NAMES``, bootstrapped from really timed commands and
   refitted online in a background thread (skipped when xgboost is missing);
5. the fallback: UNCERTAIN with the fallback's TTL.

Invariants of every returned ``Prediction``:

* ``speed == SLOW`` -> ``ttl_s == 0.0``;
* ``speed == FAST`` -> ``0 < ttl_s <= max_ttl_s``;
* ``speed == UNCERTAIN`` -> ``ttl_s`` is the fallback's TTL clamped to
  ``[0, max_ttl_s]``, whichever layer said UNCERTAIN;
* ``layer`` names who decided; ``predicted_seconds`` is that layer's point
  estimate of the tool's duration, or None.

A layer that raises is logged once and treated as abstaining: a predictor bug
must never take the engine down. ``predict`` never waits for training.

Scopes (``estimators.scopes``): a layer that learns per client scope sets
``scoped = True`` (the Bayesian and XGBoost layers); the predictor hands it
``TTLContext.scope`` and the scope ``observe`` is given, so one client's
tool times never decide another client's class.

Threading: ``predict``/``observe`` are called from the scheduler thread only;
the classifier's refits run in a daemon thread and swap the model in with a
single attribute assignment.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from .context_config import ContextServeConfig, data_path
from .parser import ToolCall
from .prediction import Prediction, ToolSpeed
from .scopes import DEFAULT_SCOPE
from .ttl import hint_ttl, TTLContext, TTLDecision

__all__ = [
    "ContextAwarePredictor",
    "ContextServeConfig",
    "Layer",
    "Prediction",
    "ToolSpeed",
    "data_path",
    "default_layers",
    "hint_ttl",
    "measure_decision_cost",
]

logger = logging.getLogger(__name__)


@runtime_checkable
class Layer(Protocol):
    """One opinion in the dispatch chain.

    ``predict`` returns None to abstain (the next layer decides); it must be
    cheap and must not block. ``observe`` feeds a measured tool duration
    (seconds >= 0, finite) and must be O(1) / O(log n).
    """

    name: str

    def predict(self, call: ToolCall) -> Prediction | None: ...

    def observe(self, call: ToolCall, seconds: float) -> None: ...


def _is_scoped(layer: Layer) -> bool:
    """Does ``layer`` learn per client scope? Such a layer sets ``scoped =
    True`` and takes ``scope=`` in ``predict`` and ``observe``; layers
    without it (the rules, custom layers) keep the two-argument protocol."""
    return getattr(layer, "scoped", False) is True


def default_layers(config: ContextServeConfig) -> list[Layer]:
    """RulesLayer, BayesianLayer, XGBoostLayer (the last only when xgboost
    is importable; see ``XGBoostLayer.create``)."""
    from .bayesian import BayesianLayer
    from .rules import RulesLayer
    from .xgb_classifier import XGBoostLayer

    layers: list[Layer] = [RulesLayer(config), BayesianLayer(config)]
    xgb_layer = XGBoostLayer.create(config)
    if xgb_layer is not None:
        layers.append(xgb_layer)
    return layers


class ContextAwarePredictor:
    """The layered FAST/SLOW/UNCERTAIN dispatch (see module docstring)."""

    def __init__(
        self,
        config: ContextServeConfig,
        fallback: Callable[[TTLContext], TTLDecision],
        layers: Sequence[Layer] | None = None,
    ) -> None:
        self.config = config
        self.fallback = fallback
        self.layers: tuple[Layer, ...] = tuple(default_layers(config) if layers is None else layers)
        names = [layer.name for layer in self.layers]
        if len(set(names)) != len(names):
            raise ValueError(f"ContextAwarePredictor: layer names must be unique, got {names}")
        # Decisions per layer name (hint, ..., fallback); read by metrics.
        self.decisions: dict[str, int] = {name: 0 for name in ("hint", *names, "fallback")}
        self._failed_layers: set[str] = set()
        self._scoped: tuple[bool, ...] = tuple(_is_scoped(layer) for layer in self.layers)

    # ------------------------------------------------------------------
    def predict(self, call: ToolCall | None, ctx: TTLContext, hint_seconds: float | None = None) -> Prediction:
        """Classify the tool call a finished turn makes (see module docstring).

        ``call`` is None when the reply has no parsable tool call (straight
        to the fallback). ``hint_seconds`` is the client's
        ``expected_tool_seconds``; a NaN, infinite or negative hint is
        ignored. ``ctx`` is used for the fallback's TTL, and its ``scope``
        selects what scoped layers learned from that client.
        """
        if hint_seconds is not None and math.isfinite(hint_seconds) and hint_seconds >= 0:
            return self._count(self._from_hint(hint_seconds, ctx))
        if call is not None:
            for layer, scoped in zip(self.layers, self._scoped):
                try:
                    if scoped:
                        prediction = layer.predict(call, scope=ctx.scope)  # type: ignore[call-arg]
                    else:
                        prediction = layer.predict(call)
                except Exception:
                    self._layer_failed(layer.name, "predict")
                    continue
                if prediction is not None:
                    return self._count(self._finish(prediction, ctx))
        return self._count(Prediction(ToolSpeed.UNCERTAIN, self._fallback_ttl(ctx), "fallback", None))

    def observe(self, call: ToolCall, seconds: float, scope: str = DEFAULT_SCOPE) -> None:
        """Feed a measured tool duration of a client of ``scope`` to every
        layer (a scoped layer learns it for that scope only). Invalid
        durations (negative, NaN, inf: clock skew) are ignored."""
        if not math.isfinite(seconds) or seconds < 0:
            return
        for layer, scoped in zip(self.layers, self._scoped):
            try:
                if scoped:
                    layer.observe(call, seconds, scope=scope)  # type: ignore[call-arg]
                else:
                    layer.observe(call, seconds)
            except Exception:
                self._layer_failed(layer.name, "observe")

    def close(self) -> None:
        """Stop background work (the classifier's refit thread)."""
        for layer in self.layers:
            close = getattr(layer, "close", None)
            if callable(close):
                close()

    # ------------------------------------------------------------------
    def _from_hint(self, seconds: float, ctx: TTLContext) -> Prediction:
        cfg = self.config
        if seconds <= cfg.fast_threshold_s:
            ttl = hint_ttl(seconds, cfg.max_ttl_s, ctx.round_trip_s)
            return Prediction(ToolSpeed.FAST, ttl, "hint", seconds)
        if seconds >= cfg.slow_threshold_s:
            return Prediction(ToolSpeed.SLOW, 0.0, "hint", seconds)
        return Prediction(ToolSpeed.UNCERTAIN, self._fallback_ttl(ctx), "hint", seconds)

    def _finish(self, prediction: Prediction, ctx: TTLContext) -> Prediction:
        """Enforce the TTL invariants of the module docstring."""
        speed = prediction.speed
        if speed is ToolSpeed.SLOW:
            ttl = 0.0
        elif speed is ToolSpeed.UNCERTAIN:
            ttl = self._fallback_ttl(ctx)
        else:
            ttl = prediction.ttl_s
            if not (math.isfinite(ttl) and ttl > 0):
                # FAST by definition returns within fast_threshold_s.
                ttl = self.config.fast_threshold_s
            if not prediction.learned_from_gaps:
                # The layer timed the tool; the next turn comes after the
                # client's own round trip as well.
                ttl += ctx.round_trip_s
            ttl = min(ttl, self.config.max_ttl_s)
        if ttl == prediction.ttl_s:
            return prediction
        return Prediction(speed, ttl, prediction.layer, prediction.predicted_seconds, prediction.learned_from_gaps)

    def _fallback_ttl(self, ctx: TTLContext) -> float:
        ttl = self.fallback(ctx).ttl_s
        if not math.isfinite(ttl):
            return self.config.max_ttl_s if ttl > 0 else 0.0
        return min(max(ttl, 0.0), self.config.max_ttl_s)

    def _count(self, prediction: Prediction) -> Prediction:
        self.decisions[prediction.layer] = self.decisions.get(prediction.layer, 0) + 1
        return prediction

    def _layer_failed(self, name: str, what: str) -> None:
        if name not in self._failed_layers:
            self._failed_layers.add(name)
            logger.exception("ContextServe layer %r failed in %s; treating it as abstaining", name, what)


# ----------------------------------------------------------------------
# Decision cost
# ----------------------------------------------------------------------
def _stats_us(samples_ns: list[int]) -> dict[str, float]:
    arr = np.asarray(samples_ns, dtype=np.float64) / 1000.0
    return {
        "n": float(arr.size),
        "mean_us": float(arr.mean()) if arr.size else 0.0,
        "p50_us": float(np.percentile(arr, 50)) if arr.size else 0.0,
        "p99_us": float(np.percentile(arr, 99)) if arr.size else 0.0,
    }


def measure_decision_cost(
    predictor: ContextAwarePredictor | Layer,
    calls: Sequence[ToolCall],
    repeats: int = 100,
    ctx: TTLContext | None = None,
) -> dict[str, object]:
    """Time ``predict`` per call (microseconds): ``{"n", "mean_us", "p50_us",
    "p99_us"}`` over ``len(calls) * repeats`` timed calls.

    For a ``ContextAwarePredictor`` the result also has ``"layers"``: the
    same statistics for each layer's own ``predict`` on the same calls, and
    ``"decided_by"``: how many of ``calls`` each layer decided. Caches
    (parsed commands, classifier rows) are warm after the first repeat,
    which is the steady state of an agent re-running the same commands; pass
    ``repeats=1`` with distinct calls for the cold cost.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    ctx = ctx or TTLContext(tool_key="<bench>", context_tokens=1024, queueing_delay_s=1.0, eta=1.0)
    if isinstance(predictor, ContextAwarePredictor):
        run: Callable[[ToolCall], object] = lambda c: predictor.predict(c, ctx)  # noqa: E731
    else:
        run = predictor.predict
    samples: list[int] = []
    clock = time.perf_counter_ns
    for _ in range(repeats):
        for call in calls:
            start = clock()
            run(call)
            samples.append(clock() - start)
    result: dict[str, object] = _stats_us(samples)
    if isinstance(predictor, ContextAwarePredictor):
        result["layers"] = {
            layer.name: measure_decision_cost(layer, calls, repeats) for layer in predictor.layers
        }
        decided: dict[str, int] = {}
        for call in calls:
            layer_name = predictor.predict(call, ctx).layer
            decided[layer_name] = decided.get(layer_name, 0) + 1
        result["decided_by"] = decided
    return result
