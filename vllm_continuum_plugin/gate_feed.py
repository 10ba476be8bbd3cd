"""What the admission gate is told of each finished turn.

The :class:`~.admission.AdmissionGate` counts the jobs under way against the
pool; whether a finished turn's job still counts, and for how long, depends
on what the scheduler decided for the turn and on what the scope's measured
gaps say. :class:`GateFeed` is the one place that decides it:

* a turn that goes on (a tool call, or a reply without one) counts until its
  *quiet horizon*: the gate's own (``max_ttl_s``: no TTL holds a context
  longer) after a tool call; after a reply without one, what the scope's
  gaps after such replies say (:func:`~.admission.return_horizon`): such a
  reply may be the session's last, and a client that never says so (AIPerf's
  replay) would otherwise hold newcomers behind a session that is gone;
* a turn whose TTL chose not to hold its context (freed or offloaded) holds
  nothing and leaves the demand -- unless its tool is predicted back within
  the gate's horizon (the decider's estimate; for a classifier's verdict
  without one, the tool's measured mean in the scope): its blocks are still
  in the prefix cache, and a newcomer admitted in their place would make it
  rebuild them;
* with a host tier of known size (``tier_capacity``) a context leaving the
  GPU is still kept, so the job stays in the demand.
* an untagged request counts while it runs (the gate admitted it as a
  newcomer); when it ends it counts on as the implicit job it started: an
  agent's (a tool call), or a chat's (an answer, where the scope's answers
  are seen to come back) (:meth:`GateFeed.untagged_finished`).

Invariants: learned state is read per scope (one client's gaps never move
another client's horizons); the feed never removes a job that holds a pin
from the demand.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any

from vllm.v1.request import Request

from .admission import AdmissionGate, return_horizon
from .config import ContinuumConfig
from .decisions import PinDecision
from .estimators.parser import NO_TOOL_KEY
from .estimators.scopes import DEFAULT_SCOPE
from .estimators.ttl import ScopedToolHistory
from .tier_capacity import TierCapacity

__all__ = ["GateFeed"]


class GateFeed:
    """Reports finished turns to an :class:`AdmissionGate` (see module doc)."""

    def __init__(self, gate: AdmissionGate, tool_history: ScopedToolHistory, pinned: Container[str],
                 tier: TierCapacity | None = None) -> None:
        self.gate = gate
        self.tool_history = tool_history
        self._pinned = pinned  # job ids holding a pin (the scheduler's PinManager)
        self.tier = tier

    @classmethod
    def create(cls, cfg: ContinuumConfig, usable_blocks: int, block_size: int, rank: Callable[[Request], Any],
               tool_history: ScopedToolHistory, pinned: Container[str], tier: TierCapacity | None,
               connector: Any, has_waiting_turn: Callable[[str], bool] = lambda job_id: False) -> GateFeed | None:
        """The gate and its feed, or None when the gate is off: by
        ``cfg.admission``, or under a KV connector whose host tier's size is
        unknown (``tier`` None), where the pool alone is not what the server
        keeps. With a tier the gate bounds the pool and the tier together.
        ``has_waiting_turn``: whether a job has a later turn in the queue
        (such a job stays in the demand however long it is quiet)."""
        if not cfg.admission or (connector is not None and tier is None):
            return None
        retained = tier.retained_blocks(usable_blocks) if tier is not None else usable_blocks
        gate = AdmissionGate(
            capacity_blocks=max(1, retained),
            block_size=block_size,
            quiet_after_s=cfg.max_ttl_s,
            max_wait_s=cfg.admission_max_wait_s,
            rank=rank,
            forecast=cfg.admission_forecast,
            has_waiting_turn=has_waiting_turn,
        )
        return cls(gate, tool_history, pinned, tier)

    def turn_finished(self, job_id: str, request: Request, now: float, tool_key: str, scope: str) -> None:
        """A turn after which ``job_id`` goes on finished at ``now``: it
        counts with this context until its quiet horizon."""
        self.gate.on_turn_finished(job_id, request, now, self.quiet_horizon(tool_key, scope))

    def untagged_finished(self, key: str, job_id: str | None) -> None:
        """An untagged turn counted under ``key`` while it ran finished.
        ``job_id``: the implicit job it started -- an agent's (a tool call)
        or a chat's (an answer where the scope's answers come back,
        ``ImplicitJobIndex.answers_return``): it counts on as that job,
        whose finished turn the scheduler reports next. None: it started
        nothing (a one-shot request, an answer where answers are not
        followed up): it leaves the demand, and a chat that does come back
        is counted again when its next turn is admitted."""
        if job_id is None:
            self.gate.discard(key)
        else:
            self.gate.rename(key, job_id)

    def quiet_horizon(self, tool_key: str, scope: str) -> float | None:
        """How long the gate counts a job quiet after this turn: after a
        reply that called no tool, what the scope's gaps after such replies
        say (``admission.return_horizon``); else None (the gate's own)."""
        if tool_key != NO_TOOL_KEY:
            return None
        history = self.tool_history.get(scope)
        samples = history.samples(NO_TOOL_KEY) if history is not None else None
        return return_horizon(samples.as_array() if samples is not None else None, self.gate.quiet_after_s)

    def predicted_return(self, decision: PinDecision, tool_key: str, scope: str) -> float | None:
        """When the job's tool is expected back: the decider's estimate; for
        a classifier's verdict without one (ContextServe's rules call a tool
        SLOW and say no more), the tool's measured mean in the scope; else
        None (Continuum's TTL rule prices holding, it predicts no return)."""
        if decision.predicted_seconds is not None or decision.speed is None:
            return decision.predicted_seconds
        history = self.tool_history.get(scope)
        return history.mean(tool_key) if history is not None else None

    def holds_nothing(self, job_id: str, decision: PinDecision | None = None, tool_key: str = NO_TOOL_KEY,
                      scope: str = DEFAULT_SCOPE) -> None:
        """The job's finished turn keeps no blocks (its TTL ``decision``
        chose not to hold, or pinning is off: no decision): the gate stops
        counting it -- unless its tool is predicted back
        (:meth:`predicted_return`) within the gate's horizon, a host tier
        keeps the context, or a pin of the job still holds one (ContextServe
        frees a SLOW tool's context at once, and a 10 s tool is SLOW: its
        blocks are still cached when it comes back)."""
        if decision is not None:
            returns_in_s = self.predicted_return(decision, tool_key, scope)
            if returns_in_s is not None and returns_in_s <= self.gate.quiet_after_s:
                return
        if self.tier is None and job_id not in self._pinned:
            self.gate.on_job_end(job_id)
