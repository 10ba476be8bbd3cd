"""Benchmark statistics: percentiles, summaries, relative changes, tables."""

import numpy as np
import pytest

from vllm_continuum_plugin.benchmarks.stats import (
    SUMMARY_KEYS,
    format_table,
    gap_closed,
    percentile,
    relative_change,
    summarize,
)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
def test_percentile_matches_numpy_linear(n):
    rng = np.random.default_rng(n)
    values = rng.lognormal(0.0, 1.5, size=n).tolist()
    for q in [0, 0.1, 1, 5, 25, 33.3, 50, 66.7, 90, 95, 99, 99.9, 100]:
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12, abs=0.0), q


def test_percentile_interpolates_between_order_statistics_regardless_of_input_order():
    values = [40.0, 10.0, 30.0, 20.0]  # unsorted on purpose
    assert percentile(values, 0) == 10.0
    assert percentile(values, 100) == 40.0
    assert percentile(values, 50) == 25.0  # halfway between 20 and 30
    assert percentile(values, 90) == pytest.approx(37.0)  # index 2.7 -> 30 + 0.7 * 10
    assert values == [40.0, 10.0, 30.0, 20.0]  # input not mutated


def test_percentile_accepts_ints_and_numpy_arrays():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(np.array([1.0, 2.0, 3.0]), np.float64(50.0)) == 2.0


@pytest.mark.parametrize("q", [-0.1, 100.5, float("nan"), "50", None, True])
def test_percentile_rejects_bad_q_and_names_it(q):
    with pytest.raises(ValueError, match="q must be a number in \\[0, 100\\]"):
        percentile([1.0, 2.0], q)


def test_percentile_rejects_empty_and_nan_input():
    with pytest.raises(ValueError, match="at least one value"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"values\[1\] is NaN"):
        percentile([1.0, float("nan")], 50)


def test_summarize_keys_and_values_match_numpy():
    rng = np.random.default_rng(7)
    values = rng.exponential(2.0, size=537)
    s = summarize(values.tolist())
    assert tuple(s) == SUMMARY_KEYS == ("count", "mean", "p50", "p90", "p95", "p99", "min", "max")
    assert s["count"] == 537
    assert s["mean"] == pytest.approx(float(values.mean()), rel=1e-12)
    for key, q in [("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99)]:
        assert s[key] == pytest.approx(float(np.percentile(values, q)), rel=1e-12)
    assert s["min"] == float(values.min()) and s["max"] == float(values.max())
    assert s["min"] <= s["p50"] <= s["p90"] <= s["p95"] <= s["p99"] <= s["max"]


def test_summarize_single_value_and_empty():
    assert summarize([3.5]) == {
        "count": 1, "mean": 3.5, "p50": 3.5, "p90": 3.5, "p95": 3.5, "p99": 3.5, "min": 3.5, "max": 3.5,
    }
    with pytest.raises(ValueError, match="summarize"):
        summarize([])


def test_relative_change():
    assert relative_change(75.0, 100.0) == pytest.approx(-0.25)
    assert relative_change(130.0, 100.0) == pytest.approx(0.30)
    assert relative_change(-2.0, -4.0) == pytest.approx(-0.5)
    with pytest.raises(ValueError, match=r"value=5\.0, baseline=0"):
        relative_change(5.0, 0)


def test_gap_closed():
    # JCT: baseline 10 s, oracle 6 s.
    assert gap_closed(10.0, 10.0, 6.0) == 0.0
    assert gap_closed(6.0, 10.0, 6.0) == 1.0
    assert gap_closed(8.0, 10.0, 6.0) == pytest.approx(0.5)
    assert gap_closed(11.0, 10.0, 6.0) == pytest.approx(-0.25)  # worse than baseline
    assert gap_closed(5.0, 10.0, 6.0) == pytest.approx(1.25)  # better than the oracle
    # Higher-is-better metric (hit rate): baseline 0.2, oracle 0.9.
    assert gap_closed(0.55, 0.2, 0.9) == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"baseline=4\.0, oracle=4\.0, policy=3\.0"):
        gap_closed(3.0, 4.0, 4.0)


def test_format_table_aligns_numbers_right_and_text_left():
    rows = [
        {"arm": "fcfs", "jobs": 24, "jct": 12.3456, "gap": float("nan")},
        {"arm": "continuum-fixed", "jobs": 3, "jct": 1234.5, "gap": 0.5},
        {"arm": "x", "jobs": 100, "jct": np.float64(7.0)},  # no "gap": rendered as "-"
    ]
    table = format_table(rows, [("arm", "arm", ""), ("jobs", "jobs", "d"), ("jct", "JCT mean", ".2f"),
                                ("gap", "gap closed", ".0%")])
    lines = table.split("\n")
    assert lines == [
        "arm              jobs  JCT mean  gap closed",
        "---------------  ----  --------  ----------",
        "fcfs               24     12.35         nan",
        "continuum-fixed     3   1234.50         50%",
        "x                 100      7.00           -",
    ]


def test_format_table_mixed_column_keeps_per_cell_alignment_and_skips_spec_for_text():
    rows = [{"k": "a", "v": 1.5}, {"k": "b", "v": "n/a"}, {"k": "c", "v": True}]
    lines = format_table(rows, [("k", "key", ""), ("v", "value", ".1f")]).split("\n")
    assert lines == [
        "key  value",
        "---  -----",
        "a      1.5",
        "b    n/a",
        "c    True",  # bool is text, not a number
    ]
    assert all(line == line.rstrip() for line in lines)


def test_format_table_errors_name_the_column():
    with pytest.raises(ValueError, match=r"column 'jobs': cannot format 2\.5 with spec 'd'"):
        format_table([{"jobs": 2.5}], [("jobs", "jobs", "d")])
    with pytest.raises(ValueError, match="column must be a"):
        format_table([{"a": 1}], [("a", "A")])  # type: ignore[list-item]


def test_format_table_with_no_rows_has_header_only():
    assert format_table([], [("a", "alpha", ".1f"), ("b", "b", "")]) == "alpha  b\n-----  -"
