"""ContextServe's settings (``ContextServeConfig``) and the data files shipped
with the estimators (``data_path``: the default rules and the bootstrap
classifier that a ``None`` path in the settings stands for).

A leaf module (it imports only ``vllm_continuum_plugin.ranges``): the
predictor (``context_predictor``) and its layers (``rules``, ``bayesian``,
``xgb_classifier``) all take the settings from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vllm_continuum_plugin.ranges import DAY_S, Range, check_ranges, ranged

__all__ = ["DATA_DIR", "ContextServeConfig", "data_path"]

DATA_DIR = Path(__file__).resolve().parent / "data"


def data_path(name: str) -> Path:
    """Path of a file shipped in ``estimators/data/`` (package data)."""
    return DATA_DIR / name


@dataclass(frozen=True)
class ContextServeConfig:
    """Settings of the ContextServe predictor.

    Invariants after construction (``__post_init__`` raises ``ValueError``
    naming the field, the value and the allowed range otherwise): every
    numeric field lies in its declared ``Range`` (finite; an ``int`` field
    holds an ``int``, never a ``bool``); ``slow_threshold_s >=
    fast_threshold_s``; a path is None or a non-empty string. The ranges of
    the settings shared with ``ContinuumConfig`` are the same as there.
    """

    # A tool is FAST if it likely returns within this many seconds.
    fast_threshold_s: float = ranged(2.0, Range(0.0, DAY_S, lo_open=True))
    # SLOW if it likely takes at least this long (between the two: UNCERTAIN).
    slow_threshold_s: float = ranged(10.0, Range(0.0, DAY_S, lo_open=True))
    # Probability mass needed to call FAST/SLOW (Bayesian) and the
    # classifier's probability threshold.
    confidence: float = ranged(0.8, Range(0.5, 1.0, hi_open=True))
    # The Bayesian layer abstains for a tool with fewer samples (a million
    # samples of one tool never come: a larger value only disables the layer).
    min_observations: int = ranged(3, Range(1, 1_000_000, integer=True))
    # Upper bound on any TTL (at most a day: a longer pin is a leak).
    max_ttl_s: float = ranged(60.0, Range(0.0, DAY_S, lo_open=True))
    # JSON file overriding / adding rules (format: rules.py); None = shipped defaults only.
    rules_path: str | None = None
    # Classifier model (xgboost JSON); None = the shipped bootstrap model.
    xgb_model_path: str | None = None
    # New labelled samples between background refits of the classifier.
    refit_every: int = ranged(200, Range(1, 1_000_000, integer=True))
    # Bounded FIFO training buffer of the classifier (each sample holds at
    # most 2048 characters of command: a million stay near 2 GiB).
    max_training_samples: int = ranged(5000, Range(1, 1_000_000, integer=True))
    # Seed of the Bayesian layer's Thompson sampling (None: from the OS).
    # Non-negative: random.Random(-s) is random.Random(s).
    seed: int | None = ranged(0, Range(0, 2**64 - 1, integer=True, allow_none=True))
    # Tool keys the Bayesian layer keeps posteriors for (LRU; per scope, and
    # over all scopes together).
    max_tools: int = ranged(4096, Range(1, 2**16, integer=True))
    # Client scopes whose learned state is kept (LRU; ``estimators.scopes``).
    # Same range as ContinuumConfig.max_scopes.
    max_scopes: int = ranged(256, Range(1, 4096, integer=True))

    def __post_init__(self) -> None:
        # Every numeric field against its declared range, then the one
        # constraint that relates two fields.
        check_ranges(self, _fail)
        _require(self.slow_threshold_s >= self.fast_threshold_s,
                 "slow_threshold_s", self.slow_threshold_s,
                 f">= fast_threshold_s ({self.fast_threshold_s!r})")
        for name in ("rules_path", "xgb_model_path"):
            value = getattr(self, name)
            _require(value is None or (isinstance(value, str) and value != ""),
                     name, value, "None or a non-empty path string")


def _require(ok: bool, name: str, value: object, expected: str) -> None:
    if not ok:
        _fail(name, value, expected)


def _fail(name: str, value: object, expected: str) -> None:
    raise ValueError(f"ContextServeConfig.{name}={value!r} is invalid; expected {expected}")
