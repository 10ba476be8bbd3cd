"""Small statistics and table helpers for the benchmarks.

Pure Python (no numpy needed): percentiles with numpy's default ("linear")
interpolation, a fixed set of summary statistics, relative changes, the share
of a baseline-to-oracle gap a policy closes, and plain-text tables.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

__all__ = [
    "SUMMARY_KEYS",
    "format_table",
    "gap_closed",
    "percentile",
    "relative_change",
    "summarize",
]

# Keys of ``summarize``'s result, in display order.
SUMMARY_KEYS: tuple[str, ...] = ("count", "mean", "p50", "p90", "p95", "p99", "min", "max")


def _sorted_values(values: Sequence[float], caller: str) -> list[float]:
    """``values`` as sorted floats; raises on empty input or NaN."""
    if len(values) == 0:
        raise ValueError(f"{caller}() needs at least one value, got an empty sequence")
    data = [float(v) for v in values]
    for i, v in enumerate(data):
        if math.isnan(v):
            raise ValueError(f"{caller}(): values[{i}] is NaN")
    data.sort()
    return data


def _percentile_of_sorted(data: list[float], q: float) -> float:
    """Linear-interpolation percentile of already sorted, non-empty ``data``.

    Same arithmetic as ``numpy.percentile(..., method="linear")``: virtual
    index ``q/100 * (n-1)``, and the interpolation is computed from the upper
    neighbour when the fraction is >= 0.5 (numpy's ``_lerp``), so results
    agree to the last bit in the usual cases and are monotone in ``q``.
    """
    position = (q / 100.0) * (len(data) - 1)
    lower = math.floor(position)
    upper = min(lower + 1, len(data) - 1)
    fraction = position - lower
    a, b = data[lower], data[upper]
    if a == b:  # also avoids inf - inf
        return a
    diff = b - a
    if fraction >= 0.5:
        return b - diff * (1.0 - fraction)
    return a + diff * fraction


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (0 <= q <= 100).

    Linear interpolation between the two nearest order statistics, like
    ``numpy.percentile``'s default. ``percentile(v, 0) == min(v)`` and
    ``percentile(v, 100) == max(v)``.

    Raises:
        ValueError: ``values`` is empty or contains NaN, or ``q`` is not a
            number in [0, 100].
    """
    if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0.0 <= float(q) <= 100.0:
        raise ValueError(f"percentile q must be a number in [0, 100], got {q!r}")
    return _percentile_of_sorted(_sorted_values(values, "percentile"), float(q))


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Count, mean, p50/p90/p95/p99, min and max of ``values``.

    Keys are ``SUMMARY_KEYS`` in that order; ``count`` is an ``int``, the
    rest are floats. The mean uses ``math.fsum`` (exact summation).

    Raises:
        ValueError: ``values`` is empty or contains NaN.
    """
    data = _sorted_values(values, "summarize")
    return {
        "count": len(data),
        "mean": math.fsum(data) / len(data),
        "p50": _percentile_of_sorted(data, 50.0),
        "p90": _percentile_of_sorted(data, 90.0),
        "p95": _percentile_of_sorted(data, 95.0),
        "p99": _percentile_of_sorted(data, 99.0),
        "min": data[0],
        "max": data[-1],
    }


def relative_change(value: float, baseline: float) -> float:
    """``(value - baseline) / baseline``: -0.25 means 25 % below the baseline.

    Raises:
        ValueError: ``baseline`` is zero (the change is undefined).
    """
    if baseline == 0:
        raise ValueError(f"relative_change is undefined for baseline 0 (value={value!r}, baseline={baseline!r})")
    return (value - baseline) / baseline


def gap_closed(policy: float, baseline: float, oracle: float) -> float:
    """Share of the baseline-to-oracle gap that ``policy`` closes.

    ``(baseline - policy) / (baseline - oracle)`` for a lower-is-better
    metric (JCT, latency): 0.0 means no better than the baseline, 1.0 means
    as good as the oracle, negative means worse than the baseline and above
    1.0 means better than the oracle. The formula is symmetric, so it also
    works for higher-is-better metrics (hit rate) as long as the oracle is
    the better end.

    Raises:
        ValueError: ``baseline == oracle`` (there is no gap to close).
    """
    if baseline == oracle:
        raise ValueError(
            f"gap_closed is undefined when baseline == oracle (baseline={baseline!r}, "
            f"oracle={oracle!r}, policy={policy!r})"
        )
    return (baseline - policy) / (baseline - oracle)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def format_table(rows: list[dict[str, object]], columns: list[tuple[str, str, str]]) -> str:
    """A plain-text table of ``rows`` with one column per ``(key, header, spec)``.

    * Numbers (``int``/``float``/numpy scalars, not ``bool``) are rendered
      with ``format(value, spec)`` and right-aligned; NaN renders as
      ``nan`` whatever the spec (``"nan%"`` would read as a value).
    * Any other value is rendered with ``str`` (``spec`` is not applied, so a
      text cell such as ``"n/a"`` in a numeric column is fine) and
      left-aligned.
    * A missing key or ``None`` renders as ``-``, right-aligned in a column
      that holds numbers, left-aligned otherwise.
    * A header is right-aligned when its column holds only numbers (and
      placeholders), left-aligned otherwise.

    Columns are separated by two spaces, the header is underlined with
    dashes, and lines carry no trailing spaces. The result has
    ``len(rows) + 2`` lines and no final newline.

    Raises:
        ValueError: a column is malformed, or ``spec`` cannot format a
            number in it (the message names the column, value and spec).
    """
    for column in columns:
        if not (isinstance(column, tuple) and len(column) == 3 and all(isinstance(c, str) for c in column)):
            raise ValueError(f"format_table column must be a (key, header, spec) tuple of str, got {column!r}")
    if not columns:
        return ""

    cells: list[list[tuple[str, str]]] = []  # per row, per column: (text, kind) with kind in num/text/missing
    for row in rows:
        rendered: list[tuple[str, str]] = []
        for key, _header, spec in columns:
            value = row.get(key)
            if value is None:
                rendered.append(("-", "missing"))
            elif _is_number(value) and math.isnan(value):  # type: ignore[arg-type]
                rendered.append(("nan", "num"))  # not "nan%" for a percent spec
            elif _is_number(value):
                try:
                    rendered.append((format(value, spec), "num"))
                except (ValueError, TypeError) as e:
                    raise ValueError(
                        f"format_table column {key!r}: cannot format {value!r} with spec {spec!r}: {e}"
                    ) from e
            else:
                rendered.append((str(value), "text"))
        cells.append(rendered)

    lines_by_row: list[list[str]] = [[] for _ in range(len(rows) + 2)]
    for c, (_key, header, _spec) in enumerate(columns):
        kinds = {row_cells[c][1] for row_cells in cells}
        has_numbers = "num" in kinds
        numeric_column = has_numbers and "text" not in kinds
        width = max([len(header)] + [len(row_cells[c][0]) for row_cells in cells])
        lines_by_row[0].append(header.rjust(width) if numeric_column else header.ljust(width))
        lines_by_row[1].append("-" * width)
        for r, row_cells in enumerate(cells):
            text, kind = row_cells[c]
            right = kind == "num" or (kind == "missing" and has_numbers)
            lines_by_row[r + 2].append(text.rjust(width) if right else text.ljust(width))
    return "\n".join("  ".join(parts).rstrip() for parts in lines_by_row)
