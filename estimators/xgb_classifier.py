"""ContextServe's third opinion: a gradient-boosted FAST/UNCERTAIN/SLOW
classifier over the command's shell features, learned online.

Model (``DurationClassifier``). Labels come from measured seconds:
FAST (0) if ``seconds <= fast_threshold_s``, SLOW (2) if
``seconds >= slow_threshold_s``, UNCERTAIN (1) otherwise. Inputs are
``features.FEATURE_NAMES``. xgboost ``multi:softprob``, ``n_estimators=50``
rounds, ``max_depth=4``, ``nthread=1``, balanced class weights (each present
class carries the same total weight, so the many cheap ``ls``-like samples
do not drown the rare slow ones), fixed seed: a fit is deterministic.

Decision (``XGBoostLayer.predict``): the class with the largest probability
decides if that probability is at least ``confidence``, else the layer
abstains. ``predicted_seconds`` is the median training duration of the
predicted class; the FAST TTL is ``q * 1.2 + 0.05`` with ``q`` the
``confidence``-quantile of the FAST class's training durations, at least
``MIN_FAST_TTL_S`` (0.5 s) and at most ``max_ttl_s``. The bootstrap
durations are the commands' own run times, while the tool time the server
sees also holds the agent's round trip (decode, HTTP, framework), so the
predictor adds the job's measured client overhead to this TTL
(``round_trip.RoundTripOverhead``); a TTL of the bare ``ls`` time would
lapse before the next turn arrives.

Inference. The booster's trees are compiled into flat numpy arrays
(``xgb_forest.CompiledForest``) and evaluated level by level for all trees at once,
which is several times cheaper than ``Booster.inplace_predict`` on one row;
the compiled forest is checked against the booster on probe rows when built
and is not used if they disagree (then the booster predicts). Probabilities
are cached per command text (bounded), so an agent re-running a command pays
a dict lookup. The cache belongs to the model and is swapped with it.

Online learning (``XGBoostLayer.observe``): each (command, seconds) goes into
a buffer of ``max_training_samples`` that client scopes share fairly
(``scopes.FairShareBuffer``: when it is full, the scope holding the most
samples loses its oldest, so a client that floods it pushes out only its own
samples once it holds its share; with one scope it is a plain FIFO). The
model itself is shared: a scope's pull on it is bounded by its share of the
buffer next to the bootstrap dataset, not by a median (docs/scoped-learning.md
states this limit; a scope's own Bayesian posterior decides before the
classifier once it has ``min_observations``). Every ``refit_every`` new samples a
daemon thread (``BackgroundRefitter``) featurises the bootstrap dataset plus
the buffer, fits a new model and swaps it in with one attribute assignment.
``predict`` never takes a lock and never waits for a fit; a fit that fails is
logged and the old model stays.

Files. ``save(path)`` writes xgboost's JSON model format; the ContextServe
metadata (thresholds, feature names, class medians, FAST quantiles) is stored
as the booster attribute ``contextserve``. ``load`` refuses a model whose
feature list differs from ``FEATURE_NAMES``. A model fitted with other
thresholds than the config's is not used; a refit from the bootstrap dataset
with the config's thresholds is started instead.

xgboost is optional and imported lazily: ``XGBoostLayer.create`` returns
None (and logs why) when it is not installed.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .context_config import ContextServeConfig, data_path
from .features import FEATURE_NAMES, FEATURES_VERSION, extract_features_from_command
from .parser import ToolCall, split_commands
from .prediction import Prediction, ToolSpeed
from .scopes import DEFAULT_SCOPE, FairShareBuffer
from .ttl import hint_ttl
from .xgb_forest import compile_booster

__all__ = [
    "BOOTSTRAP_DATASET_FILE",
    "BOOTSTRAP_MODEL_FILE",
    "BackgroundRefitter",
    "DurationClassifier",
    "XGBoostLayer",
    "dataset_from_history",
    "label_for",
    "load_dataset_jsonl",
    "xgboost_available",
]

logger = logging.getLogger(__name__)

BOOTSTRAP_MODEL_FILE = "bootstrap_xgb.json"
BOOTSTRAP_DATASET_FILE = "bootstrap_commands.jsonl"
FAST, UNCERTAIN, SLOW = 0, 1, 2
CLASS_SPEEDS = (ToolSpeed.FAST, ToolSpeed.UNCERTAIN, ToolSpeed.SLOW)
NUM_CLASSES = 3
MIN_FAST_TTL_S = 0.5  # see module docstring
_METADATA_ATTR = "contextserve"
_QUANTILE_LEVELS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99)
_CACHE_SIZE = 4096
_PROBE_COMMANDS = (
    "ls -la", "cat setup.py | head -n 20", "python -m pytest -q", "pip install -r requirements.txt",
    "sleep 30", "sleep 0.2", "timeout 5 python slow.py", "git status && git diff",
    "for f in *.py; do python -m py_compile $f; done", "sudo apt-get install -y curl",
    "find . -name '*.py' | xargs grep -n TODO", "make -j8 && ctest", "python train.py --epochs 3",
)


def xgboost_available() -> bool:
    try:
        import xgboost  # noqa: F401
    except Exception:
        return False
    return True


def label_for(seconds: float, fast_threshold_s: float, slow_threshold_s: float) -> int:
    """FAST (0) if seconds <= fast, SLOW (2) if seconds >= slow, else 1."""
    if seconds <= fast_threshold_s:
        return FAST
    if seconds >= slow_threshold_s:
        return SLOW
    return UNCERTAIN


# ----------------------------------------------------------------------
# Datasets
# ----------------------------------------------------------------------
def _valid_pair(command: Any, seconds: Any) -> bool:
    return (
        isinstance(command, str) and command.strip() != ""
        and isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
        and math.isfinite(seconds) and seconds >= 0
    )


def dataset_from_history(pairs: Iterable[tuple[str, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Feature matrix ``X`` (n x len(FEATURE_NAMES), float32) and seconds
    ``y`` (n, float64) from (command text, measured seconds) pairs, e.g. a
    server's tool history. Invalid pairs (empty command, negative / NaN
    seconds) are skipped."""
    rows: list[np.ndarray] = []
    seconds: list[float] = []
    for command, value in pairs:
        if _valid_pair(command, value):
            rows.append(extract_features_from_command(command))
            seconds.append(float(value))
    if not rows:
        return np.empty((0, len(FEATURE_NAMES)), dtype=np.float32), np.empty(0)
    return np.vstack(rows).astype(np.float32), np.asarray(seconds, dtype=np.float64)


def load_dataset_jsonl(path: str | Path) -> list[tuple[str, float]]:
    """(command, seconds) pairs of a JSONL file with one
    ``{"command": str, "seconds": float, ...}`` object per line (other keys,
    e.g. ``source``, are ignored; blank lines skipped). Raises ValueError
    naming the file and line of a malformed record."""
    pairs: list[tuple[str, float]] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: invalid JSON: {exc}") from exc
            if not isinstance(record, dict) or not _valid_pair(record.get("command"), record.get("seconds")):
                raise ValueError(
                    f"{path}:{number}: expected {{\"command\": non-empty string, \"seconds\": number >= 0}}, "
                    f"got {line.strip()[:200]}"
                )
            pairs.append((record["command"], float(record["seconds"])))
    return pairs


def _probe_rows() -> np.ndarray:
    rng = np.random.default_rng(0)
    base = np.vstack([extract_features_from_command(c) for c in _PROBE_COMMANDS])
    noise = rng.integers(0, 25, size=(64, len(FEATURE_NAMES))).astype(np.float32)
    noise[:, rng.random(len(FEATURE_NAMES)) < 0.5] = 0.0
    return np.vstack([base, noise, noise * 0.37]).astype(np.float32)


# ----------------------------------------------------------------------
# Classifier
# ----------------------------------------------------------------------
@dataclass(frozen=True)
class ClassifierMetadata:
    """What a saved model needs besides its trees (stored as an attribute)."""

    fast_threshold_s: float
    slow_threshold_s: float
    class_medians: tuple[float, float, float]
    fast_quantiles: tuple[float, ...]  # at _QUANTILE_LEVELS
    class_counts: tuple[int, int, int]
    feature_names: tuple[str, ...] = FEATURE_NAMES
    features_version: int = FEATURES_VERSION

    def to_json(self) -> str:
        return json.dumps({
            "fast_threshold_s": self.fast_threshold_s,
            "slow_threshold_s": self.slow_threshold_s,
            "class_medians": list(self.class_medians),
            "fast_quantile_levels": list(_QUANTILE_LEVELS),
            "fast_quantiles": list(self.fast_quantiles),
            "class_counts": list(self.class_counts),
            "feature_names": list(self.feature_names),
            "features_version": self.features_version,
        })

    @classmethod
    def from_json(cls, text: str, source: str) -> ClassifierMetadata:
        try:
            raw = json.loads(text)
            meta = cls(
                fast_threshold_s=float(raw["fast_threshold_s"]),
                slow_threshold_s=float(raw["slow_threshold_s"]),
                class_medians=tuple(float(v) for v in raw["class_medians"]),  # type: ignore[arg-type]
                fast_quantiles=tuple(float(v) for v in raw["fast_quantiles"]),
                class_counts=tuple(int(v) for v in raw["class_counts"]),  # type: ignore[arg-type]
                feature_names=tuple(raw["feature_names"]),
                features_version=int(raw["features_version"]),
            )
            levels = tuple(float(v) for v in raw["fast_quantile_levels"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}: malformed ContextServe metadata attribute: {exc!r}") from exc
        if levels != _QUANTILE_LEVELS or len(meta.fast_quantiles) != len(levels):
            raise ValueError(f"{source}: FAST quantile levels {levels} differ from {_QUANTILE_LEVELS}")
        return meta


class DurationClassifier:
    """A fitted 3-class model plus its metadata and a per-command cache.

    Not thread-safe for concurrent ``predict_proba`` (the cache is a plain
    dict): only the scheduler thread predicts. Immutable otherwise, so a
    refit builds a new instance and swaps it in.
    """

    def __init__(self, booster: Any, metadata: ClassifierMetadata, probe: np.ndarray | None = None) -> None:
        if metadata.feature_names != FEATURE_NAMES:
            raise ValueError(
                f"model features {list(metadata.feature_names)} differ from this version's "
                f"FEATURE_NAMES {list(FEATURE_NAMES)}; retrain with scripts/build_bootstrap_model.py"
            )
        booster.set_param({"nthread": 1})
        self.booster = booster
        self.metadata = metadata
        self.forest = compile_booster(booster, probe if probe is not None else _probe_rows(), NUM_CLASSES)
        self._cache: dict[str, np.ndarray] = {}

    # -- inference -------------------------------------------------------
    def predict_proba_features(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities (FAST, UNCERTAIN, SLOW) of one feature row."""
        x = np.asarray(x, dtype=np.float32)
        if self.forest is not None:
            return self.forest.predict_proba(x)
        return np.asarray(self.booster.inplace_predict(x.reshape(1, -1)), dtype=np.float64)[0]

    def predict_proba(self, call: ToolCall) -> np.ndarray:
        """Class probabilities of a call, cached by command text."""
        cached = self._cache.get(call.command)
        if cached is not None:
            return cached
        proba = self.predict_proba_features(extract_features_from_command(call.command, call.commands))
        if len(self._cache) >= _CACHE_SIZE:
            self._cache.pop(next(iter(self._cache)))  # oldest insertion
        self._cache[call.command] = proba
        return proba

    def fast_quantile(self, q: float) -> float:
        """Interpolated q-quantile of the FAST class's training durations."""
        return float(np.interp(q, _QUANTILE_LEVELS, self.metadata.fast_quantiles))

    # -- training ----------------------------------------------------------
    @classmethod
    def fit(
        cls,
        X: np.ndarray,
        seconds: np.ndarray,
        fast_threshold_s: float,
        slow_threshold_s: float,
        *,
        n_estimators: int = 50,
        max_depth: int = 4,
        seed: int = 0,
    ) -> DurationClassifier:
        """Fit on a feature matrix and measured seconds (see module docstring)."""
        import xgboost as xgb

        X = np.asarray(X, dtype=np.float32)
        seconds = np.asarray(seconds, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != len(FEATURE_NAMES) or X.shape[0] != seconds.shape[0]:
            raise ValueError(
                f"fit: X must be (n, {len(FEATURE_NAMES)}) with n == len(seconds); "
                f"got X {X.shape}, seconds {seconds.shape}"
            )
        if X.shape[0] == 0:
            raise ValueError("fit: empty training set")
        labels = np.where(seconds <= fast_threshold_s, FAST, np.where(seconds >= slow_threshold_s, SLOW, UNCERTAIN))
        counts = np.bincount(labels, minlength=NUM_CLASSES)
        present = counts > 0
        class_weight = np.where(present, X.shape[0] / (present.sum() * np.maximum(counts, 1)), 0.0)
        dtrain = xgb.DMatrix(X, label=labels, weight=class_weight[labels], feature_names=list(FEATURE_NAMES))
        params = {
            "objective": "multi:softprob",
            "num_class": NUM_CLASSES,
            "max_depth": max_depth,
            "eta": 0.3,
            "min_child_weight": 1.0,
            "nthread": 1,
            "seed": seed,
            "tree_method": "hist",
            "eval_metric": "mlogloss",
        }
        booster = xgb.train(params, dtrain, num_boost_round=n_estimators)
        defaults = (fast_threshold_s / 2.0, math.sqrt(fast_threshold_s * slow_threshold_s), slow_threshold_s * 2.0)
        medians = tuple(
            float(np.median(seconds[labels == c])) if counts[c] else defaults[c] for c in range(NUM_CLASSES)
        )
        fast_seconds = seconds[labels == FAST]
        quantiles = (
            tuple(float(v) for v in np.quantile(fast_seconds, _QUANTILE_LEVELS))
            if fast_seconds.size else tuple(fast_threshold_s for _ in _QUANTILE_LEVELS)
        )
        metadata = ClassifierMetadata(
            fast_threshold_s=float(fast_threshold_s),
            slow_threshold_s=float(slow_threshold_s),
            class_medians=medians,  # type: ignore[arg-type]
            fast_quantiles=quantiles,
            class_counts=tuple(int(c) for c in counts),  # type: ignore[arg-type]
        )
        booster.set_attr(**{_METADATA_ATTR: metadata.to_json()})
        return cls(booster, metadata, probe=np.vstack([X[:64], _probe_rows()]))

    # -- files ---------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write xgboost's JSON model (metadata included as an attribute)."""
        path = Path(path)
        if path.suffix != ".json":
            raise ValueError(f"DurationClassifier.save: path must end in .json (xgboost JSON format), got {path}")
        self.booster.set_attr(**{_METADATA_ATTR: self.metadata.to_json()})
        self.booster.save_model(str(path))

    @classmethod
    def load(cls, path: str | Path) -> DurationClassifier:
        """Load a model written by ``save``; ValueError names the file when it
        is not a ContextServe model or its features differ."""
        import xgboost as xgb

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"ContextServe classifier model {path} does not exist")
        booster = xgb.Booster()
        try:
            booster.load_model(str(path))
        except Exception as exc:
            raise ValueError(f"{path}: not a loadable xgboost model: {exc}") from exc
        raw = booster.attr(_METADATA_ATTR)
        if raw is None:
            raise ValueError(f"{path}: xgboost model without the {_METADATA_ATTR!r} attribute (not a ContextServe model)")
        metadata = ClassifierMetadata.from_json(raw, str(path))
        try:
            return cls(booster, metadata)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc


# ----------------------------------------------------------------------
# Background refits
# ----------------------------------------------------------------------
class BackgroundRefitter:
    """Runs at most one fit at a time in a daemon thread.

    ``start(job, on_done)`` returns False (and does nothing) while a fit is
    running. ``on_done`` receives the job's result in the worker thread and
    must only do an atomic swap. A job that raises is logged; nothing else
    happens.
    """

    def __init__(self, name: str = "contextserve-refit") -> None:
        self.name = name
        self._thread: threading.Thread | None = None
        self._closed = False
        self.completed = 0
        self.failed = 0

    @property
    def busy(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def start(self, job: Callable[[], Any], on_done: Callable[[Any], None]) -> bool:
        if self._closed or self.busy:
            return False

        def run() -> None:
            try:
                result = job()
            except Exception:
                self.failed += 1
                logger.exception("ContextServe classifier refit failed; keeping the current model")
                return
            if not self._closed:
                on_done(result)
            self.completed += 1

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the running fit; True if none is running afterwards."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.busy

    def close(self, timeout: float = 5.0) -> None:
        """No further fits; wait up to ``timeout`` s for a running one
        (its result is dropped)."""
        self._closed = True
        self.wait(timeout)


# ----------------------------------------------------------------------
# Layer
# ----------------------------------------------------------------------
Sample = tuple[str, tuple[str, ...], float]  # (command, simple commands, seconds)
Trainer = Callable[[Sequence[Sample]], DurationClassifier]


class XGBoostLayer:
    """Layer "xgboost" (see module docstring).

    Invariants: ``model`` is None or fitted with the config's thresholds;
    ``predict`` reads ``self.model`` once per call (a swap in between is
    harmless); ``observe`` is O(1).
    """

    name = "xgboost"
    # Takes the client scope in observe (its share of the buffer) and predict.
    scoped = True

    def __init__(
        self,
        config: ContextServeConfig,
        model: DurationClassifier | None = None,
        bootstrap: Sequence[tuple[str, float]] = (),
        trainer: Trainer | None = None,
    ) -> None:
        self.config = config
        self.bootstrap = list(bootstrap)
        self._trainer: Trainer = trainer or self.train
        self._buffer: FairShareBuffer[Sample] = FairShareBuffer(config.max_training_samples, config.max_scopes)
        self._new_samples = 0
        self._bootstrap_matrix: tuple[np.ndarray, np.ndarray] | None = None
        self.refitter = BackgroundRefitter()
        self.model: DurationClassifier | None = None
        self.model_version = 0
        if model is not None:
            if self._thresholds_match(model):
                self.model = model
            else:
                logger.info(
                    "ContextServe classifier: model thresholds (%.3g s, %.3g s) differ from the config's "
                    "(%.3g s, %.3g s); refitting from the bootstrap dataset in the background",
                    model.metadata.fast_threshold_s, model.metadata.slow_threshold_s,
                    config.fast_threshold_s, config.slow_threshold_s,
                )
                if self.bootstrap:
                    self._start_refit([])

    @classmethod
    def create(cls, config: ContextServeConfig) -> XGBoostLayer | None:
        """The default layer: the configured (or shipped) model and the
        shipped bootstrap dataset. None when xgboost is not installed.

        An explicit ``xgb_model_path`` that does not exist is an error; a
        missing shipped model only disables the bootstrap (the layer still
        learns from observed tool times).
        """
        if not xgboost_available():
            logger.info(
                "ContextServe: xgboost is not installed; the classifier layer is off "
                "(rules and the Bayesian layer still run; `pip install xgboost` enables it)"
            )
            return None
        if config.xgb_model_path is not None and not Path(config.xgb_model_path).is_file():
            raise ValueError(f"ContextServeConfig.xgb_model_path={config.xgb_model_path!r}: no such file")
        model_path = Path(config.xgb_model_path) if config.xgb_model_path else data_path(BOOTSTRAP_MODEL_FILE)
        model: DurationClassifier | None = None
        if model_path.is_file():
            model = DurationClassifier.load(model_path)
        else:
            logger.warning("ContextServe: shipped classifier model %s is missing; learning online only", model_path)
        dataset_path = data_path(BOOTSTRAP_DATASET_FILE)
        bootstrap = load_dataset_jsonl(dataset_path) if dataset_path.is_file() else []
        return cls(config, model=model, bootstrap=bootstrap)

    def _thresholds_match(self, model: DurationClassifier) -> bool:
        meta = model.metadata
        return (math.isclose(meta.fast_threshold_s, self.config.fast_threshold_s, rel_tol=1e-9)
                and math.isclose(meta.slow_threshold_s, self.config.slow_threshold_s, rel_tol=1e-9))

    # -- Layer -------------------------------------------------------------
    def predict(self, call: ToolCall, scope: str = DEFAULT_SCOPE) -> Prediction | None:
        """The shared model's class for ``call`` (``scope`` does not change it)."""
        model = self.model
        if model is None:
            return None
        proba = model.predict_proba(call)
        best = int(np.argmax(proba))
        if proba[best] < self.config.confidence:
            return None
        speed = CLASS_SPEEDS[best]
        median = model.metadata.class_medians[best]
        if speed is ToolSpeed.FAST:
            ttl = min(max(hint_ttl(model.fast_quantile(self.config.confidence), math.inf), MIN_FAST_TTL_S),
                      self.config.max_ttl_s)
            return Prediction(speed, ttl, self.name, median)
        return Prediction(speed, 0.0, self.name, median)

    def observe(self, call: ToolCall, seconds: float, scope: str = DEFAULT_SCOPE) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return
        self._buffer.append(scope, (call.command, call.commands, float(seconds)))
        self._new_samples += 1
        if self._new_samples >= self.config.refit_every and not self.refitter.busy:
            self._start_refit(self._buffer.snapshot())

    def close(self) -> None:
        self.refitter.close()

    # -- training ------------------------------------------------------------
    def _start_refit(self, snapshot: list[Sample]) -> bool:
        started = self.refitter.start(lambda: self._trainer(snapshot), self._swap)
        if started:
            self._new_samples = 0
        return started

    def _swap(self, model: DurationClassifier) -> None:
        self.model = model  # one attribute store: atomic for the predicting thread
        self.model_version += 1

    def wait_for_refit(self, timeout: float | None = None) -> bool:
        """Block until a running refit is done (tests, benchmarks)."""
        return self.refitter.wait(timeout)

    def train(self, samples: Sequence[Sample]) -> DurationClassifier:
        """Fit on the bootstrap dataset plus ``samples`` (runs in the refit
        thread)."""
        if self._bootstrap_matrix is None:
            self._bootstrap_matrix = dataset_from_history(self.bootstrap)
        boot_x, boot_y = self._bootstrap_matrix
        rows = []
        for command, commands, _ in samples:
            rows.append(extract_features_from_command(command, commands))
            # Featurising is pure Python: it holds the GIL the engine thread
            # needs. Give it back after every row, so the engine thread (which
            # keeps it for a switch interval once it has it) waits at most one
            # row's work, not a whole interval per slice.
            time.sleep(0)
        x = np.vstack([boot_x, *rows]) if rows else boot_x
        y = np.concatenate([boot_y, np.asarray([s for _, _, s in samples], dtype=np.float64)])
        return DurationClassifier.fit(x, y, self.config.fast_threshold_s, self.config.slow_threshold_s)

    def save(self, path: str | Path) -> None:
        model = self.model
        if model is None:
            raise ValueError("XGBoostLayer.save: no fitted model yet")
        model.save(path)

    @staticmethod
    def load(path: str | Path) -> DurationClassifier:
        return DurationClassifier.load(path)


def samples_from_pairs(pairs: Iterable[tuple[str, float]]) -> list[Sample]:
    """(command, seconds) pairs as training samples for ``XGBoostLayer.train``."""
    return [(c, tuple(split_commands(c)), float(s)) for c, s in pairs if _valid_pair(c, s)]
