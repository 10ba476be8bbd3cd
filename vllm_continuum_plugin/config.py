"""Plugin settings: one dataclass, two documented sources.

Precedence (later wins): defaults < ``CONTINUUM_<NAME>`` environment variables
< ``--additional-config '{"continuum": {"<name>": ...}}'``. Unknown keys and
bad values raise ``ValueError`` naming the key, the value and what is allowed,
so a typo fails at startup instead of silently doing nothing.

Every numeric setting is declared with its range (``ranged(default,
Range(...))``, see ``ranges.py``): finite bounds, so ``inf``, ``nan`` and
absurd values (a TTL of 1e308 s, 10**12 jobs) stop startup with an error
naming the setting, the value, where it came from and the allowed range.
Durations are at most a day (``DAY_S``); table sizes and counts have caps
whose reasons (memory, work per decision) the field comments give.
docs/configuration.md's settings table states each range.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .ranges import DAY_S, RANGE_KEY, Range, check_ranges, ranged
from .session_ids import DEFAULT_SESSION_HEADERS, parse_session_headers

__all__ = ["ContinuumConfig", "ENV_PREFIX", "load_config", "tier_mode_on"]

ENV_PREFIX = "CONTINUUM_"
ADDITIONAL_CONFIG_SECTION = "continuum"
TTL_POLICIES = ("priced", "cdf", "fixed")
# When a mechanism that matters under a host tier is on (cut_long_prefills,
# backfill): see ``tier_mode_on``.
PREFILL_CUTS = ("with_tier", "always", "never")


def tier_mode_on(mode: str, has_tier: bool) -> bool:
    """Is a ``PREFILL_CUTS`` setting's mechanism on (``has_tier``: a KV
    connector is configured)?"""
    return mode == "always" or (mode == "with_tier" and has_tier)

# Ranges shared by several settings.
_SECONDS = Range(0.0, DAY_S)  # a duration; 0 allowed (e.g. "never pin")
_POSITIVE_SECONDS = Range(0.0, DAY_S, lo_open=True)  # a threshold; 0 is meaningless
# Tables that fill with traffic hold roughly 1 KiB per job or implicit turn,
# so 2**20 entries stay near a GiB.
_MAX_TABLE_ENTRIES = 2**20
# mini-swe-agent's, SWE-agent's, OpenHands', Cline's and Codex-style finish
# actions, and smolagents' (ToolCallingAgent) / Agents-SDK-style final_answer tool.
DEFAULT_FINISH_ACTIONS = (
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT|submit|finish|attempt_completion|task_complete|final_answer"
)


@dataclass(frozen=True)
class ContinuumConfig:
    """Settings of the ``continuum`` and ``context_serve`` policies.

    Each field's comment is what docs/configuration.md's settings table repeats.

    Invariants after construction (``__post_init__`` raises ``ValueError``
    naming the field, the value and the allowed range otherwise): every
    ranged field lies in its declared ``Range`` (finite, typed: an ``int``
    field holds an ``int``, never a ``bool``); ``ttl_policy`` is one of
    ``TTL_POLICIES``; ``cut_long_prefills`` and ``backfill`` one of ``PREFILL_CUTS``;
    ``slow_threshold_s >= fast_threshold_s``;
    ``session_headers`` is at most ``MAX_SESSION_HEADERS`` distinct HTTP
    header names (see ``session_ids.parse_session_headers``).
    """

    # TTL rule: "priced" (the paper's CDF rule in GPU-seconds: the rebuild
    # a hold saves against the other jobs' work it displaces, the pin's
    # share of the pool times the others' pressure on it), "cdf" (the
    # paper's rule as published) or "fixed" (released fork: fixed_ttl_s if
    # the tool's mean <= fixed_ttl_s).
    ttl_policy: str = "priced"
    # TTL used before cold_start_samples tool durations have been measured.
    default_ttl_s: float = ranged(2.0, _SECONDS)
    # Upper bound on any TTL (at most a day: a longer pin is a leak), and the
    # longest the admission gate counts a quiet job (admission.return_horizon
    # shortens it after a reply without a tool call).
    max_ttl_s: float = ranged(60.0, _SECONDS)
    # Upper bound on a client's declared retention (retention directives'
    # durations, and the hold of a range without one); 0 ignores directives.
    retention_max_s: float = ranged(600.0, _SECONDS)
    # TTL of the "fixed" policy and its fast/slow threshold (the policy
    # clamps it to max_ttl_s, like every other TTL).
    fixed_ttl_s: float = ranged(2.0, _SECONDS)
    # Samples needed before the global (then per-tool) distribution is used.
    # Only a threshold (no memory): above history_max_samples the default
    # TTL is kept for good, which benchmarks use; capped only to refuse
    # absurd input.
    cold_start_samples: int = ranged(100, Range(1, 2**31 - 1, integer=True))
    # Client overhead in a tool gap (gap minus the tool's own run time)
    # assumed until it is measured; TTLs from tool-duration estimates add it.
    round_trip_default_s: float = ranged(2.5, _SECONDS)
    # Job order: a job's turns rank by its arrival, but never by more than
    # this many seconds before their own arrival.
    job_priority_window_s: float = ranged(600.0, _SECONDS)
    # Job order: a turn arriving this long after its job's last finish starts
    # the job afresh (ranks by its own arrival).
    job_idle_reset_s: float = ranged(300.0, _SECONDS)
    # Largest share of the KV pool that pins may hold (0 < x <= 1).
    max_pinned_fraction: float = ranged(0.5, Range(0.0, 1.0, lo_open=True))
    # Admission: hold a new job's first turn while the contexts of the jobs
    # under way fill the KV pool (at most admission_max_wait_s; off with a
    # KV connector, whose tier the pool bound does not count).
    admission: bool = True
    # Admission: the longest a new job's first turn is held back (then it
    # passes whatever the pool holds). About one agent session's length at
    # overload: a newcomer forced in sooner finds the pool still held by
    # the sessions that made it wait, and every session thrashes (on the
    # Claude Code traces, H100 8B at 1 session/min, 600 s trailed the best
    # fixed session cap; docs/retention_clients.md).
    admission_max_wait_s: float = ranged(1200.0, _SECONDS)
    # Admission: count a job under way as the size it is forecast to reach
    # (its size at admission plus the mean growth of the jobs that ended),
    # not as its context last seen: sessions grow after admission, and a
    # gate that counts them as last seen admits jobs that will not fit.
    admission_forecast: bool = True
    # Admission: also hold an untagged request that continues no earlier
    # untagged turn -- a new chat or agent that sends no session id -- as a
    # new job's first turn, and count it while it runs and after it as the
    # implicit job it starts (gate_feed.untagged_finished); implicit_jobs
    # must be on. Off: untagged traffic is never held nor counted.
    admission_untagged: bool = True
    # Admission: also hold a known session's new conversation (a sub-agent,
    # a side request) while the pool is spoken for -- ahead of every
    # stranger's new job, so never behind one -- instead of letting it pass
    # at once. Off by default: in the simulator on the Claude Code traces
    # (sub-agents, H100 roofline, three arrival seeds) it sped up the
    # headers-only client profile on 70B TP4 in every run but not on 8B,
    # where a parent waiting on its held sub-agent can cost more than the
    # sub-agent's context; and a held sub-agent stalls an interactive
    # user's session for up to admission_max_wait_s. (AIPerf sends each
    # sub-agent under a session id of its own: a stranger's new job, which
    # this setting does not touch.)
    admission_sub_agents: bool = False
    # While a later turn of a job under way whose context is held heads the
    # waiting queue, cut each running prefill in that step to a share of the
    # token budget (vLLM's long_prefill_token_threshold, for that step only),
    # so the turn is not held behind another session's long prefill
    # (prefill_chunks): "with_tier" (under a KV connector: a host tier keeps
    # what the GPU lets go), "always" or "never". Without a tier the blocks a
    # cut prefill holds longer press on the pins (70B traces at 0.5
    # sessions/min, no tier: 6.8% slower mean JCT with "always").
    cut_long_prefills: str = "with_tier"
    # Under a foreign KV connector's host tier (vLLM's native offloading,
    # LMCache), when a later turn of a job under way whose context is held
    # heads the waiting queue for preempt_for_turns_after_s without GPU room,
    # and the tier's measured reload beats a prefill, preempt decodes of jobs
    # ranked after it until their blocks make room (turn_room): the tier
    # reloads them when they resume.
    preempt_for_turns: bool = True
    # How long such a turn waits for room before decodes are preempted for
    # it (0: at once. Traces, 256 GiB tier: 0 s gave H100 8B at 1 session/min
    # a mean TTFT of 0.42 s against 1.01 s with 0.5 s, and a lower mean JCT,
    # on 7b551b3).
    preempt_for_turns_after_s: float = ranged(0.0, Range(0.0, 3600.0))
    # Under vLLM's native offloading with its default LRU host tier, the
    # blocks of a turn that ends its job (is_last_step, a finish action) go
    # first out of the tier instead of last (host_tier_order): vLLM counts a
    # request's finish as a use, so an ended job's context would outlive
    # those of agents whose tools still run.
    tier_finished_first: bool = True
    # Under a foreign KV connector's host tier that loads asynchronously
    # (vLLM's native offloading), load a job's context back to the GPU
    # before its tool is predicted back (prefetch): from when the
    # prefetch_quantile of the scope's measured times of the tool, less twice
    # the tier's measured reload time, has passed, while no request waits
    # and the pool keeps prefetch_reserve of its blocks free; the loaded
    # blocks are pinned for the job (until the tool's 90th percentile).
    # Opt-in: on the Claude Code traces the GPU pool is full when contexts
    # come back, so a prefetch takes another context's place: with a 256
    # GiB tier (H100 8B, 1 session/min) it cut mean TTFT by a few percent
    # and moved mean JCT by a few tenths of a percent either way, with a 64
    # GiB tier it raised both; swept for capacity at 256 GiB it served no
    # more sessions per minute on 8B and fewer on 70B TP4 (docs/capacity.md,
    # docs/offload.md).
    prefetch: bool = False
    prefetch_quantile: float = ranged(0.5, Range(0.0, 1.0, lo_open=True, hi_open=True))
    # Bytes the plans may hold (a context's tokens as int32 and its block
    # hashes; the oldest plans go first): what a client's long contexts can
    # grow.
    prefetch_max_bytes: int = ranged(256 * 2**20, Range(0, 2**40, integer=True))
    # (0.25: on the traces, H100 8B, 256 GiB, 1 session/min, two draws of
    # sessions, 0.1 prefetched more and displaced more; 0.4 and 0.6 fewer,
    # with no lower TTFT on the second draw.)
    prefetch_reserve: float = ranged(0.25, Range(0.0, 1.0, hi_open=True))
    # When the request at the head of the waiting queue surely cannot be
    # allocated in a step (its prompt's blocks beyond its GPU prefix-cache
    # hits exceed the free ones), let the requests behind it that may fit go
    # first, for at most backfill_max_defer_s per passed-over request
    # (backfill): "never" (default: stock vLLM's head-of-line order),
    # "with_tier" (under a KV connector, where the pool is full of long
    # decodes while the tier holds the returning turns' contexts) or
    # "always". Opt-in: on the traces its effect on mean JCT was within 0.2%
    # (docs/scheduling.md).
    backfill: str = "never"
    # How long one request may be passed over before it blocks the queue as
    # in stock vLLM (so the blocks that free up go to it).
    backfill_max_defer_s: float = ranged(30.0, Range(0.0, 3600.0))
    # Samples kept per tool key (and globally) for the CDF. Capped at 2**16:
    # each new sample is an O(n) insert and each decision an O(n) pass on
    # the scheduler thread.
    history_max_samples: int = ranged(4096, Range(1, 2**16, integer=True))
    # Tool keys kept (least recently used dropped).
    history_max_tools: int = ranged(1024, Range(1, 2**16, integer=True))
    # Jobs tracked (least recently used idle job dropped).
    max_jobs: int = ranged(65536, Range(1, _MAX_TABLE_ENTRIES, integer=True))
    # Client scopes whose learned state (tool times, round trips, ContextServe
    # posteriors, classifier samples) is kept apart (least recently active
    # dropped; docs/scoped-learning.md). Each costs at most ~25 KiB of
    # round-trip window plus its samples, which stay within the unscoped
    # bounds summed over all scopes: 4096 scopes stay near 100 MiB.
    max_scopes: int = ranged(256, Range(1, 4096, integer=True))
    # Rebuild cost per context token before prefill times have been measured
    # (a second per token is slower than any real prefill).
    prefill_seconds_per_token: float = ranged(2e-4, Range(0.0, 1.0))
    # Treat a turn aborted by the API server because a stop string matched as
    # a normal finish (its KV is complete and the next turn will come).
    pin_on_stop_string: bool = True
    # ContextServe: a tool is FAST if it likely returns within this.
    fast_threshold_s: float = ranged(2.0, _POSITIVE_SECONDS)
    # ContextServe: SLOW if it likely takes at least this (between: UNCERTAIN).
    slow_threshold_s: float = ranged(10.0, _POSITIVE_SECONDS)
    # ContextServe: probability needed to call a tool FAST or SLOW.
    confidence: float = ranged(0.8, Range(0.5, 1.0, hi_open=True))
    # ContextServe: JSON rules file added to the shipped rules ("" = none).
    rules_path: str = ""
    # ContextServe: XGBoost model file ("" = the shipped bootstrap model).
    xgb_model_path: str = ""
    # ContextServe: labelled tool calls the classifier keeps for refits (FIFO;
    # each holds at most 2048 characters of command).
    xgb_max_training_samples: int = ranged(5000, Range(1, 1_000_000, integer=True))
    # Recognise agent turns that carry no job id by their prompt continuing a
    # finished turn that called a tool (implicit jobs).
    implicit_jobs: bool = True
    # Finished turns of implicit jobs remembered for their next turn (LRU).
    implicit_max_jobs: int = ranged(4096, Range(0, _MAX_TABLE_ENTRIES, integer=True))
    # Block hashes those turns may hold in all (bounds their memory; LRU).
    # ~150 B per hash counted: 2**22 stay under a GiB.
    implicit_max_blocks: int = ranged(262144, Range(0, 2**22, integer=True))
    # Tool calls that end a job (its last turn, without an is_last_step flag):
    # a shell command equal to one of these simple commands, or a tool of this
    # name; "|"-separated (or a JSON list in --additional-config).
    finish_actions: str = DEFAULT_FINISH_ACTIONS
    # Request headers whose value is the job id when the request names no
    # job_id and vLLM found no session id (body session_id, X-Session-ID),
    # first present wins; "|"-separated (or a JSON list). Read by the API
    # server (see session_ids).
    session_headers: str = DEFAULT_SESSION_HEADERS

    @property
    def finish_action_list(self) -> tuple[str, ...]:
        return tuple(" ".join(a.split()) for a in self.finish_actions.split("|") if a.strip())

    @property
    def session_header_list(self) -> tuple[str, ...]:
        """``session_headers`` as names, in order (validated at construction)."""
        return parse_session_headers(self.session_headers)

    def __post_init__(self) -> None:
        if self.ttl_policy not in TTL_POLICIES:
            raise ValueError(
                f"continuum setting ttl_policy={self.ttl_policy!r} is invalid; "
                f"expected one of {TTL_POLICIES}"
            )
        for name in ("cut_long_prefills", "backfill"):
            if getattr(self, name) not in PREFILL_CUTS:
                raise ValueError(
                    f"continuum setting {name}={getattr(self, name)!r} is invalid; expected one of {PREFILL_CUTS}"
                )
        # Every numeric field against its declared range, then the one
        # constraint that relates two fields.
        check_ranges(self, _fail)
        try:
            parse_session_headers(self.session_headers)
        except ValueError as e:
            _fail("session_headers", self.session_headers, f"HTTP header names, '|'-separated ({e})")
        _require(
            self.slow_threshold_s >= self.fast_threshold_s,
            "slow_threshold_s", self.slow_threshold_s, f">= fast_threshold_s ({self.fast_threshold_s!r})",
        )


def _require(ok: bool, name: str, value: Any, expectation: str) -> None:
    if not ok:
        _fail(name, value, expectation)


def _fail(name: str, value: Any, expectation: str, source: str | None = None) -> None:
    origin = f" from {source}" if source else ""
    raise ValueError(f"continuum setting {name}={value!r}{origin} is invalid; expected {expectation}")


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(name: str, field_type: Any, raw: Any, source: str, expected: str | None = None) -> Any:
    """``raw`` as ``field_type``; a value of the wrong type raises
    ``ValueError`` naming the setting, the value, its source and (when
    given) the ``expected`` range. Booleans take ``true/false``, ``1/0``,
    ``yes/no``, ``on/off`` as bools, strings or ints."""
    kind = field_type if isinstance(field_type, type) else {"str": str, "float": float, "int": int, "bool": bool}[field_type]
    try:
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError
        if kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(raw)
        if kind is float:
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if isinstance(raw, (list, tuple)):  # a list setting given as a JSON list
            if not all(isinstance(item, str) and "|" not in item for item in raw):
                raise ValueError
            return "|".join(raw)
        if not isinstance(raw, str):
            raise ValueError
        return raw
    except (TypeError, ValueError, OverflowError):
        # OverflowError: float() of a JSON integer literal beyond 1.8e308.
        hint = f"; expected {expected}" if expected else ""
        raise ValueError(
            f"continuum setting {name}={raw!r} from {source} is not a valid {kind.__name__}{hint}"
        ) from None


def _read(f: dataclasses.Field[Any], raw: Any, source: str) -> Any:
    """``raw`` from ``source`` as field ``f``'s type, checked against its
    declared range here so the error also says where the value came from
    (``ContinuumConfig.__post_init__`` checks the whole config again)."""
    value_range: Range | None = f.metadata.get(RANGE_KEY)
    expected = value_range.describe() if value_range is not None else None
    value = _coerce(f.name, f.type, raw, source, expected)
    if value_range is not None and not value_range.contains(value):
        _fail(f.name, value, value_range.describe(), source)
    return value


def load_config(
    additional_config: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ContinuumConfig:
    """Build the config from the environment and vLLM's additional_config.

    Every value read is type-checked and range-checked before it is used,
    including an environment value that ``--additional-config`` overrides:
    a bad setting anywhere stops startup rather than lying in wait.
    """
    environ = os.environ if environ is None else environ
    by_name = {f.name: f for f in fields(ContinuumConfig)}
    values: dict[str, Any] = {}
    for name, f in by_name.items():
        env_name = ENV_PREFIX + name.upper()
        if env_name in environ:
            values[name] = _read(f, environ[env_name], env_name)
    section = (additional_config or {}).get(ADDITIONAL_CONFIG_SECTION)
    if section is not None:
        if not isinstance(section, Mapping):
            raise ValueError(
                f"--additional-config section {ADDITIONAL_CONFIG_SECTION!r} must be an "
                f"object, got {type(section).__name__}"
            )
        for key, raw in section.items():
            if key not in by_name:
                raise ValueError(
                    f"unknown continuum setting {key!r} in --additional-config; "
                    f"known settings: {', '.join(sorted(by_name))}"
                )
            values[key] = _read(by_name[key], raw, "--additional-config")
    return dataclasses.replace(ContinuumConfig(), **values)
