"""Argument checks shared by the workload modules (``workload_*``): each
raises ``ValueError`` naming the field and the value."""

from __future__ import annotations

import math
import numbers

import numpy as np


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_int(name: str, value: object, minimum: int) -> None:
    if not _is_int(value) or value < minimum:  # type: ignore[operator]
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_seconds(name: str, value: object) -> None:
    if not _is_real(value) or not math.isfinite(value) or value < 0:  # type: ignore[arg-type,operator]
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def _check_positive(name: str, value: object) -> None:
    if not _is_real(value) or not math.isfinite(value) or value <= 0:  # type: ignore[arg-type,operator]
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _check_range(name: str, value: object, minimum: int) -> None:
    """``value`` is a ``(low, high)`` pair of ints with ``minimum <= low <= high``."""
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or not all(_is_int(v) for v in value)
        or not minimum <= value[0] <= value[1]
    ):
        raise ValueError(f"{name} must be a (min, max) pair of integers with {minimum} <= min <= max, got {value!r}")


def _draw_int(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    """Uniform integer in ``[bounds[0], bounds[1]]``, both ends included."""
    return int(rng.integers(bounds[0], bounds[1] + 1))


def _check_seed(seed: object) -> None:
    if not _is_int(seed) or seed < 0:  # type: ignore[operator]
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
