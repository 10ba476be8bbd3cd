"""Plugin settings: one dataclass, two documented sources.

Precedence (later wins): defaults < ``CONTINUUM_<NAME>`` environment variables
< ``--additional-config '{"continuum": {"<name>": ...}}'``. Unknown keys and
bad values raise ``ValueError`` naming the key, the value and what is allowed,
so a typo fails at startup instead of silently doing nothing.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["ContinuumConfig", "ENV_PREFIX", "load_config"]

ENV_PREFIX = "CONTINUUM_"
ADDITIONAL_CONFIG_SECTION = "continuum"
TTL_POLICIES = ("priced", "cdf", "fixed")
MAX_TTL_LIMIT_S = 86400.0
# mini-swe-agent's, SWE-agent's, OpenHands', Cline's and Codex-style finish actions.
DEFAULT_FINISH_ACTIONS = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT|submit|finish|attempt_completion|task_complete"


@dataclass(frozen=True)
class ContinuumConfig:
    """Settings of the ``continuum`` and ``context_serve`` policies.

    Each field's comment is what README's configuration table repeats.
    """

    # TTL rule: "priced" (the paper's CDF rule with holding priced by the
    # pin's share of the pool times its usage), "cdf" (the paper's rule as
    # published) or "fixed" (released fork: fixed_ttl_s if the tool's mean
    # <= fixed_ttl_s).
    ttl_policy: str = "priced"
    # TTL used before cold_start_samples tool durations have been measured.
    default_ttl_s: float = 2.0
    # Upper bound on any TTL.
    max_ttl_s: float = 60.0
    # TTL of the "fixed" policy and its fast/slow threshold.
    fixed_ttl_s: float = 2.0
    # Samples needed before the global (then per-tool) distribution is used.
    cold_start_samples: int = 100
    # Client overhead in a tool gap (gap minus the tool's own run time)
    # assumed until it is measured; TTLs from tool-duration estimates add it.
    round_trip_default_s: float = 2.5
    # Job order: a job's turns rank by its arrival, but never by more than
    # this many seconds before their own arrival.
    job_priority_window_s: float = 600.0
    # Job order: a turn arriving this long after its job's last finish starts
    # the job afresh (ranks by its own arrival).
    job_idle_reset_s: float = 300.0
    # Largest share of the KV pool that pins may hold (0 < x <= 1).
    max_pinned_fraction: float = 0.5
    # Admission: hold a new job's first turn while the contexts of the jobs
    # under way fill the KV pool (at most job_priority_window_s; off with a
    # KV connector, whose tier the pool bound does not count).
    admission: bool = True
    # Samples kept per tool key (and globally) for the CDF.
    history_max_samples: int = 4096
    # Tool keys kept (least recently used dropped).
    history_max_tools: int = 1024
    # Jobs tracked (least recently used idle job dropped).
    max_jobs: int = 65536
    # Rebuild cost per context token before prefill times have been measured.
    prefill_seconds_per_token: float = 2e-4
    # Treat a turn aborted by the API server because a stop string matched as
    # a normal finish (its KV is complete and the next turn will come).
    pin_on_stop_string: bool = True
    # ContextServe: a tool is FAST if it likely returns within this.
    fast_threshold_s: float = 2.0
    # ContextServe: SLOW if it likely takes at least this (between: UNCERTAIN).
    slow_threshold_s: float = 10.0
    # ContextServe: probability needed to call a tool FAST or SLOW.
    confidence: float = 0.8
    # ContextServe: JSON rules file added to the shipped rules ("" = none).
    rules_path: str = ""
    # ContextServe: XGBoost model file ("" = the shipped bootstrap model).
    xgb_model_path: str = ""
    # ContextServe: labelled tool calls the classifier keeps for refits (FIFO;
    # each holds at most 2048 characters of command).
    xgb_max_training_samples: int = 5000
    # Recognise agent turns that carry no job id by their prompt continuing a
    # finished turn that called a tool (implicit jobs).
    implicit_jobs: bool = True
    # Finished turns of implicit jobs remembered for their next turn (LRU).
    implicit_max_jobs: int = 4096
    # Block hashes those turns may hold in all (bounds their memory; LRU).
    implicit_max_blocks: int = 262144
    # Tool calls that end a job (its last turn, without an is_last_step flag):
    # a shell command equal to one of these simple commands, or a tool of this
    # name; "|"-separated (or a JSON list in --additional-config).
    finish_actions: str = DEFAULT_FINISH_ACTIONS

    @property
    def finish_action_list(self) -> tuple[str, ...]:
        return tuple(" ".join(a.split()) for a in self.finish_actions.split("|") if a.strip())

    def __post_init__(self) -> None:
        if self.ttl_policy not in TTL_POLICIES:
            raise ValueError(
                f"continuum setting ttl_policy={self.ttl_policy!r} is invalid; "
                f"expected one of {TTL_POLICIES}"
            )
        _require(self.default_ttl_s >= 0, "default_ttl_s", self.default_ttl_s, ">= 0")
        _require(0 <= self.max_ttl_s <= MAX_TTL_LIMIT_S, "max_ttl_s", self.max_ttl_s,
                 f"in [0, {MAX_TTL_LIMIT_S:.0f}] (a pin longer than a day is a leak)")
        _require(
            1 <= self.xgb_max_training_samples <= 1_000_000,
            "xgb_max_training_samples", self.xgb_max_training_samples, "in [1, 1000000]",
        )
        _require(self.fixed_ttl_s >= 0, "fixed_ttl_s", self.fixed_ttl_s, ">= 0")
        for name in ("round_trip_default_s", "job_priority_window_s", "job_idle_reset_s"):
            value = getattr(self, name)
            _require(math.isfinite(value) and value >= 0, name, value, "a finite number >= 0")
        _require(self.cold_start_samples >= 1, "cold_start_samples", self.cold_start_samples, ">= 1")
        _require(
            0.0 < self.max_pinned_fraction <= 1.0,
            "max_pinned_fraction", self.max_pinned_fraction, "in (0, 1]",
        )
        _require(self.history_max_samples >= 1, "history_max_samples", self.history_max_samples, ">= 1")
        _require(self.history_max_tools >= 1, "history_max_tools", self.history_max_tools, ">= 1")
        _require(self.max_jobs >= 1, "max_jobs", self.max_jobs, ">= 1")
        _require(
            self.prefill_seconds_per_token >= 0,
            "prefill_seconds_per_token", self.prefill_seconds_per_token, ">= 0",
        )

        _require(self.fast_threshold_s > 0, "fast_threshold_s", self.fast_threshold_s, "> 0")
        _require(
            self.slow_threshold_s >= self.fast_threshold_s,
            "slow_threshold_s", self.slow_threshold_s, f">= fast_threshold_s ({self.fast_threshold_s!r})",
        )
        _require(self.implicit_max_jobs >= 0, "implicit_max_jobs", self.implicit_max_jobs, ">= 0")
        _require(self.implicit_max_blocks >= 0, "implicit_max_blocks", self.implicit_max_blocks, ">= 0")
        _require(0.5 <= self.confidence < 1.0, "confidence", self.confidence, "in [0.5, 1)")


def _require(ok: bool, name: str, value: Any, expectation: str) -> None:
    if not ok:
        raise ValueError(f"continuum setting {name}={value!r} is invalid; expected {expectation}")


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(name: str, field_type: Any, raw: Any, source: str) -> Any:
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
    except (TypeError, ValueError):
        raise ValueError(
            f"continuum setting {name}={raw!r} from {source} is not a valid {kind.__name__}"
        ) from None


def load_config(
    additional_config: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ContinuumConfig:
    """Build the config from the environment and vLLM's additional_config."""
    environ = os.environ if environ is None else environ
    by_name = {f.name: f for f in fields(ContinuumConfig)}
    values: dict[str, Any] = {}
    for name, f in by_name.items():
        env_name = ENV_PREFIX + name.upper()
        if env_name in environ:
            values[name] = _coerce(name, f.type, environ[env_name], env_name)
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
            values[key] = _coerce(key, by_name[key].type, raw, "--additional-config")
    return dataclasses.replace(ContinuumConfig(), **values)
