"""Summaries of simulated runs: one line per arm, tables, sweeps, plots.

Everything here is a function of the runs' records, which are deterministic;
wall-clock figures (the simulator's own speed) are formatted separately, by
:func:`speed_line`, for stderr.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..stats import format_table, gap_closed, percentile
from .engine import RunRecords

__all__ = ["ArmSummary", "SLOW_TTFT_S", "slow_turn_causes", "summarize_run", "summary_table", "speed_line",
           "add_gap_closed", "plot_sweep"]

# A turn slower than this to its first token is "slow" (the capacity SLO's
# TTFT bound, docs/capacity.md); ``slow_turn_causes`` says why each was.
SLOW_TTFT_S = 2.0
# Recomputing fewer tokens than this is not what made a turn slow (well
# under 0.1 s of prefill on the profiles' GPUs).
_RECOMPUTE_CAUSE_TOKENS = 4096


@dataclass(frozen=True)
class ArmSummary:
    """Per-run figures of one arm (seconds are virtual, on the profile's GPU)."""

    arm: str
    jobs: int
    turns: int
    jct_mean_s: float
    jct_p50_s: float
    jct_p90_s: float
    ttft_mean_s: float
    ttft_p90_s: float
    queue_mean_s: float
    # Of the queueing, the mean wait for a host tier's asynchronous loads.
    load_wait_mean_s: float
    # Longest a job waited from its arrival until its first turn was first
    # scheduled (the admission gate's, a session cap's and the queue's wait):
    # the starvation bound that a policy must state, as measured.
    first_wait_max_s: float
    hit_share: float  # prompt tokens served from the prefix cache at admission / all prompt tokens
    reusable_share: float  # what a pool that never evicts could serve / all prompt tokens
    recomputed_tokens: int
    prefill_tokens: int
    busy_fraction: float
    preemptions: int
    pins_created: int
    pins_handed_over: int
    pins_expired: int
    pins_released_under_pressure: int  # pressure + cap
    makespan_s: float
    steps: int
    loaded_tokens: int = 0  # KV reloaded from host memory (offload arms)
    stored_tokens: int = 0
    gap_closed: float | None = None  # share of the fcfs→oracle mean-JCT gap
    # Per job (session or sub-agent), for SLO attainment (scripts/capacity_scoring.py):
    # {"job", "arrival_s", "jct_s", "turns", "ttft_p90_s", "ttft_max_s", "tokens"}
    # (tokens: prompt + output of its turns).
    sessions: tuple[dict[str, Any], ...] = ()
    # Turns slower than SLOW_TTFT_S to their first token, by cause
    # (``slow_turn_causes``).
    slow_turns: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        gap = "" if self.gap_closed is None else f" gap_closed={self.gap_closed:+.1%}"
        return (
            f"{self.arm}: jobs={self.jobs} turns={self.turns} jct_mean={self.jct_mean_s:.2f}s "
            f"jct_p90={self.jct_p90_s:.2f}s ttft_mean={self.ttft_mean_s:.3f}s queue_mean={self.queue_mean_s:.3f}s "
            f"hit={self.hit_share:.1%} (of {self.reusable_share:.1%} reusable) recomputed={self.recomputed_tokens} "
            f"busy={self.busy_fraction:.1%} preemptions={self.preemptions} pins={self.pins_created} "
            f"handoff={self.pins_handed_over} expired={self.pins_expired} "
            f"pressure={self.pins_released_under_pressure}"
            + (f" reloaded={self.loaded_tokens} stored={self.stored_tokens}" if self.stored_tokens else "")
            + gap
        )

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def summarize_run(arm: str, records: RunRecords) -> ArmSummary:
    jct = sorted(records.jct_s().values())
    turns = records.turns
    ttft = [t.ttft_s for t in turns]
    prompt = sum(t.prompt_tokens for t in turns)
    c = records.counters
    released = c.get("pins_released", {})
    return ArmSummary(
        sessions=job_figures(records),
        arm=arm,
        jobs=len(jct),
        turns=len(turns),
        jct_mean_s=_mean(jct),
        jct_p50_s=percentile(jct, 50) if jct else math.nan,
        jct_p90_s=percentile(jct, 90) if jct else math.nan,
        ttft_mean_s=_mean(ttft),
        ttft_p90_s=percentile(ttft, 90) if ttft else math.nan,
        queue_mean_s=_mean([t.queueing_s for t in turns]),
        load_wait_mean_s=_mean([t.load_wait_s for t in turns]),
        first_wait_max_s=max(
            (t.first_scheduled_s - records.job_arrival_s[t.job_id] for t in turns
             if t.turn == 0 and t.first_scheduled_s is not None and t.job_id in records.job_arrival_s),
            default=math.nan,
        ),
        hit_share=sum(t.cached_tokens for t in turns) / prompt if prompt else math.nan,
        reusable_share=sum(t.reusable_tokens for t in turns) / prompt if prompt else math.nan,
        recomputed_tokens=sum(t.recomputed_tokens for t in turns),
        prefill_tokens=sum(t.prefill_tokens for t in turns),
        busy_fraction=records.busy_s / records.makespan_s if records.makespan_s else math.nan,
        preemptions=records.preemptions,
        pins_created=int(c.get("pins_created", 0)),
        pins_handed_over=int(released.get("handoff", 0)),
        pins_expired=int(released.get("ttl", 0)),
        pins_released_under_pressure=int(released.get("pressure", 0)) + int(released.get("cap", 0)),
        makespan_s=records.makespan_s,
        steps=records.steps,
        loaded_tokens=records.loaded_tokens,
        stored_tokens=records.stored_tokens,
        slow_turns=slow_turn_causes(turns),
    )


def slow_turn_causes(turns: Sequence[Any], bound_s: float = SLOW_TTFT_S) -> dict[str, int]:
    """The turns slower than ``bound_s`` to their first token, by what made
    them slow, first that applies: ``recomputed`` (it rebuilt at least
    4,096 tokens its job had had in KV: lost retention), ``queued`` (at
    least half its TTFT before its first step: waiting for room in the pool,
    a place in the batch or an asynchronous load), ``new_prompt`` (the
    prefill of tokens no pool could have kept: a first turn, a long tool
    result). Every slow turn is counted once; ``slow`` is their number."""
    out = {"slow": 0, "recomputed": 0, "queued": 0, "new_prompt": 0}
    for t in turns:
        if t.first_token_s is None or t.ttft_s <= bound_s:
            continue
        out["slow"] += 1
        if t.recomputed_tokens >= _RECOMPUTE_CAUSE_TOKENS:
            out["recomputed"] += 1
        elif t.queueing_s >= t.ttft_s / 2:
            out["queued"] += 1
        else:
            out["new_prompt"] += 1
    return out


def job_figures(records: RunRecords) -> tuple[dict[str, Any], ...]:
    """Each finished job's JCT, TTFTs and tokens, in arrival order."""
    by_job: dict[str, list[Any]] = {}
    for t in records.turns:
        by_job.setdefault(t.job_id, []).append(t)
    out = []
    for job, arrival in sorted(records.job_arrival_s.items(), key=lambda kv: kv[1]):
        turns = by_job.get(job, [])
        if job not in records.job_finish_s or not turns:
            continue
        ttft = sorted(t.ttft_s for t in turns)
        out.append({"job": job, "arrival_s": arrival, "jct_s": records.job_finish_s[job] - arrival,
                    "turns": len(turns), "ttft_p90_s": percentile(ttft, 90), "ttft_max_s": ttft[-1],
                    "tokens": sum(t.prompt_tokens + t.output_tokens for t in turns)})
    return tuple(out)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def add_gap_closed(summaries: list[ArmSummary], baseline: str = "fcfs", oracle: str = "oracle") -> list[ArmSummary]:
    """Each arm's share of the ``baseline``→``oracle`` mean-JCT gap (when both
    ran and differ)."""
    by = {s.arm: s for s in summaries}
    if baseline not in by or oracle not in by or by[baseline].jct_mean_s == by[oracle].jct_mean_s:
        return summaries
    b, o = by[baseline].jct_mean_s, by[oracle].jct_mean_s
    out = []
    for s in summaries:
        out.append(ArmSummary(**{**s.__dict__, "gap_closed": gap_closed(s.jct_mean_s, b, o)}))
    return out


_COLUMNS = [
    ("arm", "policy", ""),
    ("jct_mean_s", "JCT mean s", ".2f"),
    ("jct_p90_s", "JCT p90 s", ".2f"),
    ("ttft_mean_s", "TTFT mean s", ".3f"),
    ("queue_mean_s", "queue mean s", ".3f"),
    ("load_wait_mean_s", "load wait s", ".3f"),
    ("first_wait_max_s", "first wait max s", ".2f"),
    ("hit_share", "hit share", ".3f"),
    ("recomputed_tokens", "recomputed tok", "d"),
    ("busy_fraction", "GPU busy", ".3f"),
    ("preemptions", "preempt", "d"),
    ("pins_created", "pins", "d"),
    ("pins_handed_over", "handoff", "d"),
    ("pins_expired", "expired", "d"),
    ("pins_released_under_pressure", "pressure", "d"),
    ("gap_closed", "gap closed", ".3f"),
]


def summary_table(summaries: Sequence[ArmSummary]) -> str:
    return format_table([s.to_json() for s in summaries], _COLUMNS)


def speed_line(arm: str, records: RunRecords) -> str:
    """The simulator's own speed (wall clock: for stderr, never stdout)."""
    per_step = records.wall_s / records.steps * 1e6 if records.steps else math.nan
    return (f"[simulate] {arm}: {records.steps} steps, {len(records.turns)} turns in {records.wall_s:.2f}s wall "
            f"({per_step:.0f} us/step)")


def plot_sweep(points: list[dict[str, Any]], x_key: str, x_label: str, path: str, title: str) -> None:
    """JCT, hit share and gap closed against ``x_key`` per policy (matplotlib, PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = sorted({p["arm"] for p in points}, key=lambda a: [p["arm"] for p in points].index(a))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for arm in arms:
        pts = sorted((p for p in points if p["arm"] == arm), key=lambda p: p[x_key])
        xs = [p[x_key] for p in pts]
        axes[0].plot(xs, [p["jct_mean_s"] for p in pts], marker="o", label=arm)
        axes[1].plot(xs, [p["hit_share"] for p in pts], marker="o", label=arm)
        if any(p.get("gap_closed") is not None for p in pts) and arm not in ("fcfs", "oracle"):
            axes[2].plot(xs, [p.get("gap_closed") for p in pts], marker="o", label=arm)
    axes[0].set_ylabel("mean JCT (s)")
    axes[1].set_ylabel("prefix-hit share of prompt tokens")
    axes[2].set_ylabel("share of the FCFS→oracle JCT gap closed")
    axes[2].axhline(0, color="grey", lw=0.5)
    for ax in axes:
        ax.set_xlabel(x_label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def dumps(obj: Any) -> str:
    """JSON with sorted keys and fixed float formatting (byte-stable)."""
    return json.dumps(obj, sort_keys=True, indent=1, default=lambda o: o.__dict__)
