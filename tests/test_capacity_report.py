"""scripts/capacity_report.py's scoring: SLO attainment per session against
its JCT served alone, and capacity as the largest rate sustained with every
lower rate sustained (pure logic over simulator results)."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import capacity_report as cr  # noqa: E402

sys.path.pop(0)

SLO = cr.Slo(ttft_p90_s=2.0, jct_factor=1.3, attainment=0.9)


def _session(job, jct, ttft=0.5, tokens=1000):
    return {"job": job, "jct_s": jct, "ttft_p90_s": ttft, "tokens": tokens}


def test_a_session_keeps_the_slo_only_within_both_bounds_and_only_same_jobs_are_judged():
    solo = {"a": (100.0, 1000), "b": (100.0, 1000), "c": (100.0, 1000), "d": (100.0, 999)}
    point = {"sessions": [
        _session("a", 129.0),  # kept: 1.29x alone, TTFT fine
        _session("b", 131.0),  # JCT over 1.3x alone
        _session("c", 110.0, ttft=2.5),  # p90 TTFT over 2 s
        _session("d", 100.0),  # another job's content under the same id: not judged
        _session("e", 100.0),  # never ran alone: not judged
    ]}
    assert cr.attainment(point, solo, SLO) == 1 / 3
    assert cr.attainment({"sessions": []}, solo, SLO) is None


def test_capacity_is_the_largest_rate_sustained_with_every_lower_rate_sustained():
    assert cr.capacity({0.5: 1.0, 1.0: 0.95, 1.5: 0.85, 2.0: 0.92}, SLO) == 1.0  # 2.0 after a miss does not count
    assert cr.capacity({0.5: 0.8, 1.0: 0.95}, SLO) is None  # not even the lowest rate
    assert cr.capacity({0.5: 0.9}, SLO) == 0.5  # the bar is inclusive


def test_offload_arms_compare_with_stock_native_offloading_at_their_tier():
    assert cr.reference_arm("continuum-native-offload (64 GiB)") == "native-offload (64 GiB)"
    assert cr.reference_arm("continuum-offload (256 GiB)") == "native-offload (256 GiB)"
    assert cr.reference_arm("continuum") == "fcfs"
    assert cr.reference_arm("fcfs-cap (best)") == "fcfs"
