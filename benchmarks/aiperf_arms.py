"""The arms of a live AIPerf replay: a scheduling policy, its settings, the
pool and how AIPerf names a session.

An arm is what one ``vllm serve`` of the replay runs. Besides the plain
``--scheduling-policy`` values (``fcfs``, ``continuum``, ``context_serve``),
the names of the simulator's arms (``benchmarks.sim.arms``) mean the same
live:

* ``continuum-paper`` -- Continuum as the paper has it: its TTL rule as
  published (``ttl_policy: cdf``), no admission gate;
* ``oracle`` -- stock FCFS over a pool that never evicts (room for every
  session's peak context at once): the bound no policy can beat;
* ``<policy>-claude-header`` -- the session id sent as Claude Code sends it
  (``X-Claude-Code-Session-Id``, one of the plugin's ``session_headers``)
  instead of vLLM's ``X-Session-ID``;
* ``<policy>-affinity`` -- AIPerf's own headers only (no
  ``--session-header``): the session id in ``X-Correlation-ID`` and, by
  AIPerf 0.13's default, ``X-Session-Affinity`` (one of the plugin's
  ``session_headers``): what a user who runs AIPerf with no session flag
  sends;
* ``<policy>-no-header`` -- no session id at all (AIPerf's
  ``X-Session-Affinity`` turned off with
  ``AIPERF_HTTP_X_SESSION_AFFINITY_FROM_CORRELATION_ID=false``; its
  ``X-Correlation-ID`` is not read): the plugin sees untagged traffic and
  has only implicit jobs (prefix matching) to go on;
* ``native-offload`` / ``continuum-native-offload`` -- vLLM's own CPU
  offloading under the stock / Continuum scheduler;
* ``continuum-offload-explicit`` -- Continuum with the plugin's connector as
  a victim tier (``store_mode: explicit``: only what leaves a pin or a SLOW
  turn is stored), with the same host tier as the native arms;
* ``continuum-offload-victim`` / ``offload-victim`` -- the plugin's connector
  storing what the GPU prefix cache evicts (``store_mode: victim``), under
  the Continuum / stock scheduler, with the same host tier.

AIPerf sends a session id only as a header (``--session-header``), so the
plugin's own ``job_id`` body field cannot be replayed per session; the
header arms are what an unchanged client sends.

Invariants: a name maps to exactly one arm; an unknown name is a
``ValueError`` naming it and the known ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LiveArm", "POLICIES", "SESSION_HEADER", "parse_live_arms"]

# The header AIPerf sends the session id in by default: vLLM's own.
SESSION_HEADER = "X-Session-ID"
# Claude Code 2.1.x's session header (a default of the plugin's session_headers).
CLAUDE_CODE_HEADER = "X-Claude-Code-Session-Id"
POLICIES = ("fcfs", "continuum", "context_serve")


@dataclass(frozen=True)
class LiveArm:
    """One server of a replay."""

    name: str
    policy: str
    # Plugin settings of this arm (``--additional-config '{"continuum": ...}'``),
    # under the run's ``--continuum-config``.
    continuum: Mapping[str, Any] = field(default_factory=dict)
    # The pool never evicts (the oracle): room for every session's peak.
    unbounded_pool: bool = False
    # The header AIPerf names each session in (``--session-header``); None:
    # the flag is not passed.
    session_header: str | None = SESSION_HEADER
    # AIPerf's own ``X-Session-Affinity`` header (on by default in 0.13, the
    # session's id whatever ``--session-header`` says): off only where the
    # arm sends no session id at all.
    affinity_header: bool = True
    # vLLM's own CPU offloading (its OffloadingConnector, as vLLM documents
    # it) under this arm, with a host tier of the run's ``--host-tier``
    # share of the sessions' peak working set.
    native_offload: bool = False
    # The plugin's ContinuumOffloadConnector under this arm, in this
    # ``store_mode`` ("" -- none), with the same host tier.
    plugin_offload: str = ""

    @property
    def session_source(self) -> str:
        """How the arm names a session, for the run's log and results."""
        if self.session_header:
            return self.session_header
        return "X-Session-Affinity (AIPerf's default)" if self.affinity_header else "none"

    @property
    def host_tier(self) -> bool:
        """The arm runs a host tier (``--host-tier`` of the working set)."""
        return self.native_offload or bool(self.plugin_offload)


def _named() -> dict[str, LiveArm]:
    arms = {p: LiveArm(p, p) for p in POLICIES}
    arms["continuum-paper"] = LiveArm("continuum-paper", "continuum",
                                      continuum={"ttl_policy": "cdf", "admission": False})
    arms["oracle"] = LiveArm("oracle", "fcfs", unbounded_pool=True)
    arms["native-offload"] = LiveArm("native-offload", "fcfs", native_offload=True)
    arms["continuum-native-offload"] = LiveArm("continuum-native-offload", "continuum", native_offload=True)
    arms["continuum-offload-explicit"] = LiveArm("continuum-offload-explicit", "continuum", plugin_offload="explicit")
    arms["continuum-offload-victim"] = LiveArm("continuum-offload-victim", "continuum", plugin_offload="victim")
    arms["offload-victim"] = LiveArm("offload-victim", "fcfs", plugin_offload="victim")
    for p in POLICIES:
        arms[f"{p}-claude-header"] = LiveArm(f"{p}-claude-header", p, session_header=CLAUDE_CODE_HEADER)
        arms[f"{p}-affinity"] = LiveArm(f"{p}-affinity", p, session_header=None)
        arms[f"{p}-no-header"] = LiveArm(f"{p}-no-header", p, session_header=None, affinity_header=False)
    return arms


ARMS = _named()


def parse_live_arms(names: str) -> list[LiveArm]:
    """``"fcfs,continuum,oracle"`` -> arms, in that order."""
    out = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        if name not in ARMS:
            raise ValueError(f"unknown arm {name!r}; known: {', '.join(sorted(ARMS))}")
        out.append(ARMS[name])
    if not out:
        raise ValueError(f"no arm named in {names!r}")
    return out
