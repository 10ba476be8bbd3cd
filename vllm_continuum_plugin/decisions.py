"""What to do with a finished non-final turn's KV: the per-policy decision.

The scheduler hooks are shared by both policies; only this decision differs:

* ``ContinuumDecider`` -- a TTL from the configured TTL policy
  (``ttl_policy``: ``priced`` by default, the paper's CDF rule with both
  sides priced in GPU-seconds; ``cdf`` and ``fixed`` on request, see
  ``estimators.ttl``); a client's ``expected_tool_seconds`` hint overrides.
* ``ContextServeDecider`` -- classifies the tool call FAST / SLOW / UNCERTAIN
  with the layered ``ContextAwarePredictor`` (hint, rules, Bayesian,
  XGBoost, fallback): FAST pins for the layer's TTL, SLOW frees at once,
  UNCERTAIN uses the configured TTL policy's TTL.

Deciders are called on the scheduler thread and must stay cheap; the
classifier's refits run in a background thread.

Scopes (``estimators.scopes``): ``decide`` reads the client scope from
``TTLContext.scope`` and ``observe`` is given the scope of the job whose tool
time was measured, so what one client's traffic teaches decides only that
client's TTLs (and, through the bounded shared prior, nobody's by itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .config import ContinuumConfig
from .estimators.parser import ToolCall
from .estimators.prefill import PrefillCostModel
from .estimators.scopes import DEFAULT_SCOPE
from .estimators.ttl import TTLContext, TTLPolicy, hint_ttl
from .metadata import JobMetadata

__all__ = ["ContextServeDecider", "ContinuumDecider", "Decider", "PinDecision", "make_decider"]


@dataclass(frozen=True)
class PinDecision:
    """``ttl_s`` 0 frees the blocks now. ``speed``/``layer`` are set by
    ContextServe (for metrics); ``predicted_seconds`` feeds the
    prediction-error histogram when the tool time is measured."""

    ttl_s: float
    source: str
    speed: str | None = None
    layer: str | None = None
    predicted_seconds: float | None = None
    # The tool's own expected run time behind a TTL that added the client's
    # round trip (hint, rule, classifier), else None: the next measured gap
    # minus it is a sample of the client overhead.
    tool_seconds: float | None = None


class Decider(Protocol):
    def decide(self, meta: JobMetadata, call: ToolCall | None, ctx: TTLContext) -> PinDecision: ...

    def observe(self, call: ToolCall | None, seconds: float, scope: str = DEFAULT_SCOPE) -> None: ...

    def close(self) -> None: ...


class ContinuumDecider:
    def __init__(self, ttl_policy: TTLPolicy, prefill_cost: PrefillCostModel, config: ContinuumConfig) -> None:
        self.ttl_policy = ttl_policy
        self.prefill_cost = prefill_cost
        self.config = config

    def decide(self, meta: JobMetadata, call: ToolCall | None, ctx: TTLContext) -> PinDecision:
        expected = meta.expected_tool_seconds
        if expected is not None:
            # The client knows its tool: keep the KV just past the expected
            # return when waiting is cheaper than rebuilding the context.
            rebuild_s = (
                ctx.rebuild_seconds if ctx.rebuild_seconds is not None
                else self.prefill_cost.seconds(ctx.context_tokens)
            )
            worth_it = expected <= max(rebuild_s, self.config.default_ttl_s)
            if not worth_it:
                return PinDecision(0.0, "hint", predicted_seconds=expected)
            ttl = hint_ttl(expected, self.config.max_ttl_s, ctx.round_trip_s)
            return PinDecision(ttl, "hint", predicted_seconds=expected, tool_seconds=expected)
        decision = self.ttl_policy.decide(ctx)
        return PinDecision(decision.ttl_s, decision.source)

    def observe(self, call: ToolCall | None, seconds: float, scope: str = DEFAULT_SCOPE) -> None:
        pass  # the scheduler's ScopedToolHistory is the CDF rule's data

    def close(self) -> None:
        pass


class ContextServeDecider:
    def __init__(self, predictor: object) -> None:
        self.predictor = predictor

    def decide(self, meta: JobMetadata, call: ToolCall | None, ctx: TTLContext) -> PinDecision:
        prediction = self.predictor.predict(call, ctx, hint_seconds=meta.expected_tool_seconds)  # type: ignore[attr-defined]
        speed = prediction.speed.value
        ttl = 0.0 if speed == "slow" else prediction.ttl_s
        tool_s = prediction.predicted_seconds if speed == "fast" and not prediction.learned_from_gaps else None
        return PinDecision(
            ttl, f"{speed}/{prediction.layer}", speed, prediction.layer, prediction.predicted_seconds, tool_s,
        )

    def observe(self, call: ToolCall | None, seconds: float, scope: str = DEFAULT_SCOPE) -> None:
        if call is not None:
            self.predictor.observe(call, seconds, scope)  # type: ignore[attr-defined]

    def close(self) -> None:
        self.predictor.close()  # type: ignore[attr-defined]


def make_decider(
    policy: str, config: ContinuumConfig, ttl_policy: TTLPolicy, prefill_cost: PrefillCostModel
) -> Decider:
    continuum = ContinuumDecider(ttl_policy, prefill_cost, config)
    if policy != "context_serve":
        return continuum
    from .estimators.context_predictor import ContextAwarePredictor, ContextServeConfig

    cs_config = ContextServeConfig(
        fast_threshold_s=config.fast_threshold_s,
        slow_threshold_s=config.slow_threshold_s,
        confidence=config.confidence,
        max_ttl_s=config.max_ttl_s,
        rules_path=config.rules_path or None,
        xgb_model_path=config.xgb_model_path or None,
        max_training_samples=config.xgb_max_training_samples,
        max_scopes=config.max_scopes,
    )
    predictor = ContextAwarePredictor(cs_config, fallback=ttl_policy.decide)
    return ContextServeDecider(predictor)
