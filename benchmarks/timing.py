"""Nanosecond timings of the in-process benchmarks, summarized in
microseconds (numpy: the samples run to the hundreds of thousands)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["spread", "summarize_ns"]


def summarize_ns(values_ns: Sequence[int]) -> dict[str, float]:
    """mean / p50 / p90 / p99 / max in microseconds."""
    if not values_ns:
        return {"n": 0, "mean_us": float("nan"), "p50_us": float("nan"),
                "p90_us": float("nan"), "p99_us": float("nan"), "max_us": float("nan")}
    us = np.asarray(values_ns, dtype=np.float64) / 1e3
    p50, p90, p99 = np.percentile(us, [50, 90, 99])
    return {
        "n": int(us.size),
        "mean_us": float(us.mean()),
        "p50_us": float(p50),
        "p90_us": float(p90),
        "p99_us": float(p99),
        "max_us": float(us.max()),
    }


def spread(values: Sequence[int]) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    return {"min": float(arr.min()), "mean": float(arr.mean()), "max": float(arr.max())}
