"""ContextServe's layered FAST/SLOW/UNCERTAIN predictor (pure logic).

Config, the Bayesian layer, features, the XGBoost classifier and the
dispatch over layers; the rules layer and the seeded priors for agent
clients' tools: tests/test_rules_layer.py.
"""

from __future__ import annotations

import json
import math
import threading

import numpy as np
import pytest

from vllm_continuum_plugin.estimators.bayesian import (
    BayesianLayer,
    NIGPrior,
    NormalInverseGamma,
    student_t_cdf,
    student_t_ppf,
)
from vllm_continuum_plugin.estimators.context_predictor import (
    ContextAwarePredictor,
    ContextServeConfig,
    Layer,
    Prediction,
    ToolSpeed,
    data_path,
    measure_decision_cost,
)
from vllm_continuum_plugin.estimators.features import (
    FEATURE_DOCS,
    FEATURE_NAMES,
    extract_features,
    feature_dict,
)
from vllm_continuum_plugin.estimators.parser import (
    ToolCall,
    extract_tool_call,
    split_commands,
    tool_key_for_command,
)
from vllm_continuum_plugin.estimators.rules import RulesLayer
from vllm_continuum_plugin.estimators.ttl import TTLContext, TTLDecision

FAST, SLOW, UNCERTAIN = ToolSpeed.FAST, ToolSpeed.SLOW, ToolSpeed.UNCERTAIN
CTX = TTLContext(tool_key="x", context_tokens=1000, queueing_delay_s=1.0, eta=1.0)
FALLBACK_TTL = 3.25


def call(command: str) -> ToolCall:
    parsed = extract_tool_call(f"```bash\n{command}\n```")
    assert parsed is not None
    return parsed


def make_call(command: str) -> ToolCall:
    return ToolCall(command=command, tool_key=tool_key_for_command(command), commands=tuple(split_commands(command)))


def fallback(ctx: TTLContext) -> TTLDecision:
    return TTLDecision(FALLBACK_TTL, "tool")


# ----------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"fast_threshold_s": 0.0}, "fast_threshold_s"),
        ({"fast_threshold_s": float("nan")}, "fast_threshold_s"),
        ({"fast_threshold_s": 5.0, "slow_threshold_s": 4.0}, "slow_threshold_s"),
        ({"confidence": 0.4}, "confidence"),
        ({"confidence": 1.0}, "confidence"),
        ({"min_observations": 0}, "min_observations"),
        ({"max_ttl_s": -1.0}, "max_ttl_s"),
        ({"rules_path": ""}, "rules_path"),
        ({"refit_every": 0}, "refit_every"),
        ({"max_training_samples": 0}, "max_training_samples"),
        ({"max_tools": 0}, "max_tools"),
    ],
)
def test_config_errors_name_field_and_value(kwargs, field):
    with pytest.raises(ValueError) as err:
        ContextServeConfig(**kwargs)
    assert field in str(err.value) and repr(list(kwargs.values())[-1]) in str(err.value)


# ----------------------------------------------------------------------
# Bayesian
# ----------------------------------------------------------------------
def test_nig_update_matches_closed_form():
    prior = NIGPrior(mu0=0.5, kappa0=2.0, alpha0=3.0, beta0=1.5)
    xs = [0.1, -0.4, 1.3, 0.7, 2.2]
    nig = NormalInverseGamma(prior)
    for x in xs:
        nig.update(x)
    n, xbar = len(xs), sum(xs) / len(xs)
    ss = sum((x - xbar) ** 2 for x in xs)
    kappa_n = 2.0 + n
    assert nig.kappa_n == pytest.approx(kappa_n)
    assert nig.mu_n == pytest.approx((2.0 * 0.5 + n * xbar) / kappa_n)
    assert nig.mean == pytest.approx(nig.mu_n)
    assert nig.alpha_n == pytest.approx(3.0 + n / 2)
    assert nig.beta_n == pytest.approx(1.5 + 0.5 * ss + 2.0 * n * (xbar - 0.5) ** 2 / (2 * kappa_n))
    # by hand: xbar = 0.78, ss = 4.148, kappa_n = 7, alpha_n = 5.5
    # mu_n = (1 + 3.9) / 7 = 0.7; beta_n = 1.5 + 2.074 + 10 * 0.28^2 / 14 = 3.63
    assert nig.mu_n == pytest.approx(0.7, rel=1e-12)
    assert nig.beta_n == pytest.approx(3.63, rel=1e-12)
    assert nig.predictive_scale == pytest.approx(math.sqrt(3.63 * 8 / (5.5 * 7)), rel=1e-12)
    scale = math.sqrt(nig.beta_n * (kappa_n + 1) / (nig.alpha_n * kappa_n))
    assert nig.predictive_scale == pytest.approx(scale)
    assert nig.predictive_dof == pytest.approx(2 * nig.alpha_n)


def test_nig_prior_only_and_predictive_quantiles():
    nig = NormalInverseGamma()
    assert nig.mu_n == 0.0 and nig.beta_n == 1.0 and nig.alpha_n == 2.0
    for x in np.log([0.2, 0.3, 0.25, 0.4]):
        nig.update(float(x))
    assert math.exp(nig.predictive_quantile(0.5)) == pytest.approx(math.exp(nig.mu_n))
    lo, hi = nig.predictive_quantile(0.1), nig.predictive_quantile(0.9)
    assert lo < nig.mu_n < hi and hi - nig.mu_n == pytest.approx(nig.mu_n - lo)
    assert student_t_cdf((hi - nig.mu_n) / nig.predictive_scale, nig.predictive_dof) == pytest.approx(0.9, abs=1e-9)
    with pytest.raises(ValueError, match="q must be in"):
        nig.predictive_quantile(1.0)


@pytest.mark.parametrize("nu", [1.0, 2.5, 4.0, 9.0, 30.0, 250.0])
@pytest.mark.parametrize("q", [0.01, 0.2, 0.5, 0.8, 0.95, 0.999])
def test_pure_python_t_quantile_is_accurate(nu, q):
    t = student_t_ppf(q, nu)
    assert student_t_cdf(t, nu) == pytest.approx(q, abs=1e-10)
    scipy_special = pytest.importorskip("scipy.special")
    assert t == pytest.approx(float(scipy_special.stdtrit(nu, q)), rel=1e-8, abs=1e-10)


def test_t_quantile_known_values():
    # tables: t_{0.975, 1} = 12.7062, t_{0.95, 5} = 2.01505, t_{0.9, 10} = 1.37218
    assert student_t_ppf(0.975, 1) == pytest.approx(12.7062047, rel=1e-6)
    assert student_t_ppf(0.95, 5) == pytest.approx(2.0150484, rel=1e-6)
    assert student_t_ppf(0.9, 10) == pytest.approx(1.3721836, rel=1e-6)


def test_thompson_fast_and_slow_tools():
    layer = BayesianLayer(ContextServeConfig(seed=7))
    fast_call, slow_call = call("python quick.py"), call("python -m pytest tests/test_x.py::test_y")
    assert layer.predict(fast_call) is None  # no observations yet
    for _ in range(30):
        layer.observe(fast_call, 0.1)
        layer.observe(slow_call, 30.0)
    fast = [layer.predict(fast_call) for _ in range(50)]
    slow = [layer.predict(slow_call) for _ in range(50)]
    assert all(p.speed is FAST for p in fast)
    assert all(p.speed is SLOW and p.ttl_s == 0.0 for p in slow)
    nig = layer.posterior(fast_call.tool_key)
    # Learned from measured gaps: the quantile already holds the client's
    # round trip; the TTL adds the usual 20% margin and nothing more.
    assert fast[0].ttl_s == pytest.approx(math.exp(nig.predictive_quantile(0.8)) * 1.2 + 0.05)
    assert fast[0].learned_from_gaps and fast[0].ttl_s < 2.0 and fast[0].predicted_seconds == pytest.approx(math.exp(nig.mu_n))


def test_bayesian_abstains_below_min_observations_and_is_deterministic():
    cfg = ContextServeConfig(min_observations=5, seed=3)
    a, b = BayesianLayer(cfg), BayesianLayer(cfg)
    c = call("python tool.py")
    for s in (1.0, 3.0, 0.5, 6.0):
        a.observe(c, s)
        b.observe(c, s)
    assert a.predict(c) is None
    a.observe(c, 2.0)
    b.observe(c, 2.0)
    assert [a.predict(c) for _ in range(20)] == [b.predict(c) for _ in range(20)]
    assert {a.predict(c).speed for _ in range(200)} <= {FAST, UNCERTAIN, SLOW}


def test_bayesian_lru_over_tools():
    layer = BayesianLayer(ContextServeConfig(max_tools=2))
    for key in ("a", "b", "c"):
        layer.observe(ToolCall(command=key, tool_key=key, commands=(key,)), 1.0)
    assert len(layer) == 2 and layer.posterior("a") is None and layer.posterior("c") is not None


# ----------------------------------------------------------------------
# Features
# ----------------------------------------------------------------------
def test_feature_names_documented_and_vector_shape():
    assert len(FEATURE_NAMES) == len(FEATURE_DOCS) >= 25
    x = extract_features(call("ls"))
    assert x.shape == (len(FEATURE_NAMES),) and x.dtype == np.float32 and np.all(np.isfinite(x))


def test_features_of_specific_commands():
    f = feature_dict(call("sudo apt-get install -y curl && cat a.txt | grep x | head -5 > out.txt"))
    assert f["has_sudo"] == 1 and f["n_package_install"] == 1 and f["n_pipes"] == 2
    assert f["n_redirects"] == 1 and f["n_sequence_ops"] == 1 and f["pipe_into_head_tail"] == 1
    assert f["n_known_slow"] == 1 and f["n_known_fast"] == 3 and f["n_commands"] == 4

    f = feature_dict(call("for f in src/*.py; do python $f; done; while true; do sleep 1; done"))
    assert f["n_loops"] == 2 and f["n_globs"] == 1 and f["sleep_seconds"] == 1 and f["max_path_depth"] == 2

    f = feature_dict(call("curl -sSL https://x.io/a.sh | bash && git clone https://github.com/a/b && wget http://x"))
    assert f["n_network"] == 3 and f["n_git_write"] == 1

    f = feature_dict(call("python -m pytest tests/test_a.py::test_b -x && tox && go test ./... && cargo test"))
    assert f["n_test_runners"] == 4 and f["has_test_selection"] == 1

    f = feature_dict(call("make -j8 && cmake --build build && docker build -t a . && gcc -O2 a.c && javac A.java"))
    assert f["n_build_tools"] == 3 and f["n_compilers"] == 2

    f = feature_dict(call("timeout 30 python train.py --epochs 3 && python -c 'print(1)' && sleep 2m"))
    assert f["timeout_seconds"] == 30 and f["n_python_scripts"] == 1 and f["n_python_inline"] == 1
    assert f["sleep_seconds"] == 120

    f = feature_dict(call("grep -rn TODO . && find / -name x && sed -i 's/a/b/' f && git status && echo $(date)"))
    assert f["n_recursive_flags"] == 1 and f["find_without_maxdepth"] == 1 and f["has_editor"] == 1
    assert f["n_git_read"] == 1 and f["n_subshells"] == 1


# ----------------------------------------------------------------------
# Classifier
# ----------------------------------------------------------------------
xgb_classifier = pytest.importorskip("vllm_continuum_plugin.estimators.xgb_classifier")
needs_xgboost = pytest.mark.skipif(not xgb_classifier.xgboost_available(), reason="xgboost not installed")

SEPARABLE = (
    [(c, 0.05 + 0.01 * i) for i, c in enumerate(
        ["ls", "ls -la", "cat a.py", "git status", "git diff", "head -5 f", "wc -l f", "pwd", "echo x",
         "grep -n x f", "git log -3", "cat b | head"])]
    + [(c, 4.0 + 0.3 * i) for i, c in enumerate(
        ["sleep 4", "sleep 5", "sleep 6", "timeout 5 python x.py", "python fetch.py --seconds 5",
         "sleep 3 && ls", "sleep 7", "timeout 6 sleep 60"])]
    + [(c, 20.0 + i) for i, c in enumerate(
        ["pip install numpy", "pip install -r req.txt", "npm install", "make -j4", "cargo build",
         "python -m pytest", "sleep 30", "sleep 45", "docker build .", "apt-get install -y x"])]
)


def _fit(pairs, **kw):
    x, y = xgb_classifier.dataset_from_history(pairs * 4)
    return xgb_classifier.DurationClassifier.fit(x, y, 2.0, 10.0, **kw)


@needs_xgboost
def test_classifier_learns_separable_data_deterministically(tmp_path):
    model = _fit(SEPARABLE)
    x, y = xgb_classifier.dataset_from_history(SEPARABLE)
    truth = [xgb_classifier.label_for(s, 2.0, 10.0) for s in y]
    pred = [int(np.argmax(model.predict_proba_features(row))) for row in x]
    assert np.mean(np.asarray(pred) == np.asarray(truth)) >= 0.95
    again = _fit(SEPARABLE)
    assert np.allclose(model.predict_proba_features(x[0]), again.predict_proba_features(x[0]))
    # compiled forest == booster
    booster_p = model.booster.inplace_predict(x)
    assert np.allclose(booster_p, np.vstack([model.predict_proba_features(r) for r in x]), atol=1e-5)
    # save / load round trip keeps metadata and predictions
    path = tmp_path / "m.json"
    model.save(path)
    loaded = xgb_classifier.DurationClassifier.load(path)
    assert loaded.metadata == model.metadata
    assert np.allclose(loaded.predict_proba_features(x[3]), model.predict_proba_features(x[3]), atol=1e-6)
    layer = xgb_classifier.XGBoostLayer(ContextServeConfig(), model=loaded)
    p = layer.predict(call("ls -l"))
    assert p is not None and p.speed is FAST and p.layer == "xgboost" and 0 < p.ttl_s < 2
    assert p.predicted_seconds == pytest.approx(model.metadata.class_medians[0])
    assert layer.predict(call("pip install torch")).speed is SLOW


@needs_xgboost
def test_classifier_load_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="bad.json"):
        xgb_classifier.DurationClassifier.load(bad)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        xgb_classifier.DurationClassifier.load(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="xgb_model_path"):
        xgb_classifier.XGBoostLayer.create(ContextServeConfig(xgb_model_path=str(tmp_path / "nope.json")))


@needs_xgboost
def test_background_refit_swaps_model_without_blocking_predict():
    cfg = ContextServeConfig(refit_every=20, max_training_samples=100)
    release, entered = threading.Event(), threading.Event()
    layer: xgb_classifier.XGBoostLayer

    def slow_trainer(samples):
        entered.set()
        assert release.wait(10)
        return layer.train(samples)

    layer = xgb_classifier.XGBoostLayer(cfg, model=None, bootstrap=SEPARABLE, trainer=slow_trainer)
    assert layer.predict(call("ls")) is None  # no model yet: abstain
    for i in range(19):
        layer.observe(call(f"ls dir{i}"), 0.02)
    assert not layer.refitter.busy
    layer.observe(call("sleep 30"), 30.0)  # the 20th sample starts a refit
    assert entered.wait(5) and layer.refitter.busy
    for _ in range(200):
        assert layer.predict(call("ls")) is None  # old model (none) answers at once
    # Still fitting: the trainer is blocked until `release`, so predictions
    # that waited for the fit could not have returned before it ended.
    assert layer.refitter.busy and not release.is_set()
    layer.observe(call("ls"), 0.01)  # observing while training does not start a second fit
    release.set()
    assert layer.wait_for_refit(30)
    assert layer.model_version == 1 and layer.model is not None
    assert layer.predict(call("ls")).speed is FAST
    layer.close()


@needs_xgboost
def test_threshold_mismatch_triggers_refit_from_bootstrap():
    model = _fit(SEPARABLE)  # fitted with 2 s / 10 s
    layer = xgb_classifier.XGBoostLayer(ContextServeConfig(fast_threshold_s=1.0, slow_threshold_s=8.0),
                                        model=model, bootstrap=SEPARABLE)
    assert layer.wait_for_refit(30)
    assert layer.model is not None and layer.model.metadata.fast_threshold_s == 1.0


@needs_xgboost
def test_bootstrap_model_ships_and_classifies():
    assert data_path(xgb_classifier.BOOTSTRAP_MODEL_FILE).stat().st_size < 1_000_000
    assert data_path(xgb_classifier.BOOTSTRAP_DATASET_FILE).stat().st_size < 1_000_000
    layer = xgb_classifier.XGBoostLayer.create(ContextServeConfig())
    assert layer is not None and layer.model is not None and len(layer.bootstrap) >= 150
    ls = layer.predict(call("ls"))
    assert ls is not None and ls.speed is FAST
    for command in ("pip install -r requirements.txt", "sleep 30"):
        p = layer.predict(call(command))
        assert p is None or p.speed is not FAST, command
    assert layer.predict(call("sleep 30")).speed is SLOW
    layer.close()


# ----------------------------------------------------------------------
# Dispatch
# ----------------------------------------------------------------------
class StubLayer:
    def __init__(self, name: str, answer: Prediction | None) -> None:
        self.name = name
        self.answer = answer
        self.calls = 0
        self.observed: list[float] = []

    def predict(self, call: ToolCall) -> Prediction | None:
        self.calls += 1
        return self.answer

    def observe(self, call: ToolCall, seconds: float) -> None:
        self.observed.append(seconds)


def _p(speed: ToolSpeed, layer: str, ttl: float = 0.0) -> Prediction:
    return Prediction(speed, ttl, layer, 1.0)


def test_stub_layers_satisfy_protocol():
    assert isinstance(StubLayer("x", None), Layer)
    assert isinstance(RulesLayer(ContextServeConfig()), Layer)


def test_dispatch_order_and_abstention():
    rules = StubLayer("rules", _p(FAST, "rules", 0.9))
    bayes = StubLayer("bayesian", _p(SLOW, "bayesian"))
    xgb = StubLayer("xgboost", _p(FAST, "xgboost", 0.4))
    predictor = ContextAwarePredictor(ContextServeConfig(), fallback, layers=[rules, bayes, xgb])
    c = call("anything")
    # hint beats every layer
    hinted = predictor.predict(c, CTX, hint_seconds=0.5)
    assert hinted.layer == "hint" and hinted.speed is FAST and hinted.ttl_s == pytest.approx(0.65)
    assert rules.calls == 0
    assert predictor.predict(c, CTX, hint_seconds=12.0) == Prediction(SLOW, 0.0, "hint", 12.0)
    mid = predictor.predict(c, CTX, hint_seconds=5.0)
    assert mid.speed is UNCERTAIN and mid.ttl_s == FALLBACK_TTL and mid.layer == "hint"
    assert predictor.predict(c, CTX, hint_seconds=1.9).ttl_s == pytest.approx(1.9 * 1.2 + 0.05)
    # rules beat bayesian beat xgboost beat fallback
    assert predictor.predict(c, CTX).layer == "rules"
    rules.answer = None
    assert predictor.predict(c, CTX) == Prediction(SLOW, 0.0, "bayesian", 1.0)
    bayes.answer = None
    assert predictor.predict(c, CTX) == Prediction(FAST, 0.4, "xgboost", 1.0)
    xgb.answer = None
    assert predictor.predict(c, CTX) == Prediction(UNCERTAIN, FALLBACK_TTL, "fallback", None)
    assert (rules.calls, bayes.calls, xgb.calls) == (4, 3, 2)  # each asked until one decides
    # no parsable call: straight to the fallback, no layer asked
    assert predictor.predict(None, CTX).layer == "fallback" and rules.calls == 4
    assert predictor.decisions["hint"] == 4 and predictor.decisions["fallback"] == 2


def test_dispatch_fills_ttls():
    cfg = ContextServeConfig(max_ttl_s=5.0)
    layer = StubLayer("rules", _p(UNCERTAIN, "rules", 99.0))
    predictor = ContextAwarePredictor(cfg, fallback, layers=[layer])
    c = call("x")
    assert predictor.predict(c, CTX).ttl_s == FALLBACK_TTL  # UNCERTAIN: the fallback's TTL
    layer.answer = _p(FAST, "rules", 0.0)
    assert predictor.predict(c, CTX).ttl_s == cfg.fast_threshold_s  # FAST without a TTL
    layer.answer = _p(FAST, "rules", 50.0)
    assert predictor.predict(c, CTX).ttl_s == 5.0  # capped
    layer.answer = _p(SLOW, "rules", 7.0)
    assert predictor.predict(c, CTX).ttl_s == 0.0
    huge = ContextAwarePredictor(cfg, lambda ctx: TTLDecision(math.inf, "tool"), layers=[])
    assert huge.predict(c, CTX).ttl_s == 5.0
    assert huge.predict(c, CTX, hint_seconds=1.9).ttl_s == pytest.approx(2.33)


def test_failing_layer_is_skipped_and_observe_feeds_all():
    class Broken(StubLayer):
        def predict(self, call):
            raise RuntimeError("boom")

        def observe(self, call, seconds):
            raise RuntimeError("boom")

    ok = StubLayer("bayesian", _p(SLOW, "bayesian"))
    predictor = ContextAwarePredictor(ContextServeConfig(), fallback, layers=[Broken("rules", None), ok])
    assert predictor.predict(call("x"), CTX).layer == "bayesian"
    predictor.observe(call("x"), 1.5)
    predictor.observe(call("x"), float("nan"))
    predictor.observe(call("x"), -1.0)
    assert ok.observed == [1.5]
    with pytest.raises(ValueError, match="unique"):
        ContextAwarePredictor(ContextServeConfig(), fallback, layers=[ok, ok])


def test_default_predictor_end_to_end():
    predictor = ContextAwarePredictor(ContextServeConfig(refit_every=10_000), fallback)
    try:
        names = [layer.name for layer in predictor.layers]
        assert names[:2] == ["rules", "bayesian"]
        assert predictor.predict(call("ls -la"), CTX).layer == "rules"
        assert predictor.predict(call("pip install -r requirements.txt"), CTX).speed is SLOW
        custom = make_call("./run_experiment.sh --quick")
        for _ in range(5):
            predictor.observe(custom, 0.2)
        p = predictor.predict(custom, CTX)
        assert p.layer == "bayesian" and p.speed is FAST
        cost = measure_decision_cost(predictor, [call("ls"), custom, call("python foo.py")], repeats=20)
        assert cost["n"] == 60 and cost["p50_us"] > 0 and set(cost["layers"]) == set(names)
        assert sum(cost["decided_by"].values()) == 3
    finally:
        predictor.close()


def test_missing_xgboost_skips_the_layer(monkeypatch, caplog):
    import sys

    monkeypatch.setitem(sys.modules, "xgboost", None)  # `import xgboost` now raises ImportError
    with caplog.at_level("INFO"):
        predictor = ContextAwarePredictor(ContextServeConfig(), fallback)
    assert [layer.name for layer in predictor.layers] == ["rules", "bayesian"]
    assert "xgboost is not installed" in caplog.text
    assert predictor.predict(call("python foo.py"), CTX).layer == "fallback"
