"""Tool-time distributions of a synthetic workload: how long a tool "runs"
(``Fixed``, ``Uniform``, ``LogNormal``, ``Mixture``; any ``Distribution``
with ``sample(rng)`` and ``mean()``)."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from .workload_checks import _check_positive, _check_seconds

__all__ = ["Distribution", "Fixed", "LogNormal", "Mixture", "Uniform"]


@runtime_checkable
class Distribution(Protocol):
    """A distribution of non-negative durations in seconds."""

    def sample(self, rng: np.random.Generator) -> float:
        """One draw (>= 0) using ``rng``."""
        ...

    def mean(self) -> float:
        """The exact mean of ``sample``."""
        ...


@dataclass(frozen=True)
class Fixed:
    """Always ``seconds``. Consumes no randomness."""

    seconds: float

    def __post_init__(self) -> None:
        _check_seconds("Fixed.seconds", self.seconds)

    def sample(self, rng: np.random.Generator) -> float:
        return float(self.seconds)

    def mean(self) -> float:
        return float(self.seconds)


@dataclass(frozen=True)
class Uniform:
    """Uniform on ``[low, high)``, ``0 <= low <= high``."""

    low: float
    high: float

    def __post_init__(self) -> None:
        _check_seconds("Uniform.low", self.low)
        _check_seconds("Uniform.high", self.high)
        if self.low > self.high:
            raise ValueError(f"Uniform needs low <= high, got low={self.low!r}, high={self.high!r}")

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low, self.high))

    def mean(self) -> float:
        return (self.low + self.high) / 2.0


@dataclass(frozen=True)
class LogNormal:
    """Log-normal with the given ``median`` (> 0) and log-space ``sigma`` (>= 0).

    ``log(X) ~ Normal(log(median), sigma)``; mean is ``median * exp(sigma**2 / 2)``.
    """

    median: float
    sigma: float

    def __post_init__(self) -> None:
        _check_positive("LogNormal.median", self.median)
        _check_seconds("LogNormal.sigma", self.sigma)

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.lognormal(math.log(self.median), self.sigma))

    def mean(self) -> float:
        return self.median * math.exp(self.sigma**2 / 2.0)


@dataclass(frozen=True)
class Mixture:
    """Draws from component ``i`` with probability ``weight_i / sum(weights)``.

    ``components`` is a non-empty sequence of ``(weight, Distribution)`` with
    finite weights > 0 (stored as a tuple, so a ``Mixture`` is hashable). Used
    for heavy tails: ``Mixture([(0.97, body), (0.03, LogNormal(30, 0.5))])``.
    """

    components: tuple[tuple[float, Distribution], ...]
    _cumulative: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        components = tuple(tuple(c) for c in self.components)
        if not components:
            raise ValueError("Mixture needs at least one component, got none")
        for i, component in enumerate(components):
            if len(component) != 2:
                raise ValueError(f"Mixture.components[{i}] must be a (weight, Distribution) pair, got {component!r}")
            weight, distribution = component
            _check_positive(f"Mixture.components[{i}] weight", weight)
            if not isinstance(distribution, Distribution):
                raise ValueError(f"Mixture.components[{i}] must hold a Distribution, got {distribution!r}")
        object.__setattr__(self, "components", components)
        object.__setattr__(self, "_cumulative", tuple(np.cumsum([float(w) for w, _ in components]).tolist()))

    def sample(self, rng: np.random.Generator) -> float:
        u = rng.random() * self._cumulative[-1]
        index = min(bisect.bisect_right(self._cumulative, u), len(self.components) - 1)
        return self.components[index][1].sample(rng)

    def mean(self) -> float:
        return math.fsum(w * d.mean() for w, d in self.components) / self._cumulative[-1]
