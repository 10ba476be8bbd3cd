"""What a ContextServe layer answers for a tool call: ``ToolSpeed`` and
``Prediction``.

A leaf module (it imports nothing from the project): the predictor
(``context_predictor``) and its layers (``rules``, ``bayesian``,
``xgb_classifier``) all take these types from here, so no layer imports the
module that imports it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Prediction", "ToolSpeed"]


class ToolSpeed(enum.Enum):
    FAST = "fast"
    SLOW = "slow"
    UNCERTAIN = "uncertain"


@dataclass(frozen=True)
class Prediction:
    """One layer's (or the predictor's final) answer for a tool call.

    Attributes:
        speed: FAST / SLOW / UNCERTAIN.
        ttl_s: FAST: the TTL to pin; UNCERTAIN: the fallback's (CDF) TTL,
            filled in by the predictor (a layer may leave 0.0); SLOW: 0.0.
        layer: "hint" | "rules" | "bayesian" | "xgboost" | "fallback" (or a
            custom layer's name).
        predicted_seconds: the layer's point estimate of the tool duration
            (for the prediction-error metric), None if it has none.
    """

    speed: ToolSpeed
    ttl_s: float
    layer: str
    predicted_seconds: float | None = None
    # True when the layer learned from measured gaps (next arrival minus
    # finish), which already hold the client's round trip; False when its
    # estimate is the tool's own run time, and the predictor adds the job's
    # measured overhead (``TTLContext.round_trip_s``) to its FAST TTL.
    learned_from_gaps: bool = False
