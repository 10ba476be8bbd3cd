"""ContextServe's second opinion: a per-tool Bayesian model of log duration.

Model. For a tool key, log durations ``x = log(max(seconds, 1 ms))`` are
Normal(mu, sigma^2) with the conjugate Normal-Inverse-Gamma prior

    sigma^2 ~ InvGamma(alpha0, beta0),   mu | sigma^2 ~ Normal(mu0, sigma^2 / kappa0).

After n observations with mean xbar (closed form, ``NormalInverseGamma``):

    kappa_n = kappa0 + n
    mu_n    = (kappa0 * mu0 + n * xbar) / kappa_n
    alpha_n = alpha0 + n / 2
    beta_n  = beta0 + 0.5 * sum((x - xbar)^2) + kappa0 * n * (xbar - mu0)^2 / (2 * kappa_n)

and the posterior predictive of the next log duration is Student-t with
``2 * alpha_n`` degrees of freedom, location ``mu_n`` and scale
``sqrt(beta_n * (kappa_n + 1) / (alpha_n * kappa_n))``.

Prior (shared by all tools, ``NIGPrior``): ``mu0 = log(1 s)``, ``kappa0 = 1``,
``alpha0 = 2``, ``beta0 = 1``: a tool is a priori "about a second, give or
take a factor e" (prior E[sigma^2] = beta0 / (alpha0 - 1) = 1), and the
prior weighs as one observation for the location, so a handful of samples
dominate it. The statistics are kept as (n, mean, M2) with Welford's update:
O(1) per observation, exact and numerically stable.

Decision (``BayesianLayer``): abstain below ``min_observations`` samples of
the tool; otherwise Thompson sampling -- draw ``(mu, sigma^2)`` from the
posterior, then under LogNormal(mu, sigma)

* FAST if P(duration <= fast_threshold_s) >= confidence; TTL = the posterior
  predictive quantile ``q`` at ``confidence`` (exp of the Student-t
  quantile) as ``q * 1.2 + 0.05``, capped at ``max_ttl_s``. The durations
  are measured gaps (next arrival minus finish), so the client's round trip
  is in them already (``Prediction.learned_from_gaps``);
* SLOW if P(duration >= slow_threshold_s) >= confidence;
* UNCERTAIN otherwise.

Sampling instead of using the posterior mean explores: a tool with few or
spread-out samples is sometimes tried as FAST, so its TTL keeps being tested.
The RNG is seeded (``ContextServeConfig.seed``) so runs are reproducible.

Student-t quantiles come from ``scipy.special.stdtrit`` when scipy is
importable and otherwise from ``student_t_ppf`` (Newton + bisection on the
regularized incomplete beta function, accurate to ~1e-10). Per-tool TTLs and
medians are cached until the tool's next observation.

Scopes (``estimators.scopes``): posteriors are kept per client scope and a
measured duration updates only its own scope's. A scope decides from its own
posterior once it has ``min_observations`` of the tool; before that, from a
shared prior when at least ``PRIOR_QUORUM`` other scopes have that many: a
posterior with the low medians, over those scopes (one vote each), of the
observation count (capped at ``PRIOR_MAX_OBSERVATIONS``), mean and spread of
their log durations; otherwise the layer abstains, as it always did. With one
scope the layer decides exactly as an unscoped one (same posteriors, same
random draws).

Memory: at most ``max_tools`` tool keys per scope (LRU; least recently used
dropped), at most ``max_tools`` posteriors over all scopes (least recently
active scopes dropped past that), at most ``max_scopes`` scopes.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from .context_config import ContextServeConfig
from .parser import ToolCall
from .prediction import Prediction, ToolSpeed
from .scopes import DEFAULT_SCOPE, ScopeTable, shared_prior
from .ttl import hint_ttl

__all__ = [
    "BayesianLayer",
    "NIGPrior",
    "NormalInverseGamma",
    "student_t_cdf",
    "student_t_ppf",
    "t_ppf",
]

MIN_SECONDS = 1e-3  # log(0) guard: durations are floored at 1 ms
# Most observations the shared prior counts as: a prior stays a prior, so
# Thompson sampling keeps exploring a cold scope's own tool times.
PRIOR_MAX_OBSERVATIONS = 20


# ----------------------------------------------------------------------
# Student-t quantile
# ----------------------------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for a, b > 0, 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def student_t_cdf(t: float, nu: float) -> float:
    """CDF of the standard Student-t with ``nu`` > 0 degrees of freedom."""
    if nu <= 0 or math.isnan(nu):
        raise ValueError(f"student_t_cdf: degrees of freedom must be > 0, got {nu!r}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * _betainc(0.5 * nu, 0.5, nu / (nu + t * t))
    return 1.0 - tail if t > 0 else tail


def student_t_ppf(q: float, nu: float) -> float:
    """Quantile of the standard Student-t (pure Python; see module docstring).

    Newton steps on the CDF from a normal-based start, guarded by a bracket
    that bisection falls back to, until the step is below 1e-12 relative.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"student_t_ppf: q must be in (0, 1), got {q!r}")
    if nu <= 0 or math.isnan(nu):
        raise ValueError(f"student_t_ppf: degrees of freedom must be > 0, got {nu!r}")
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -student_t_ppf(1.0 - q, nu)
    # Upper half: bracket [0, hi].
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, nu) < q:
        lo, hi = hi, hi * 2.0
        if hi > 1e12:
            return hi
    t = min(max(_normal_ppf(q), lo), hi)
    log_norm = math.lgamma(0.5 * (nu + 1)) - math.lgamma(0.5 * nu) - 0.5 * math.log(nu * math.pi)
    for _ in range(200):
        f = student_t_cdf(t, nu) - q
        if f > 0:
            hi = t
        else:
            lo = t
        density = math.exp(log_norm - 0.5 * (nu + 1) * math.log1p(t * t / nu))
        step = f / density if density > 0 else math.inf
        candidate = t - step
        if not lo < candidate < hi:
            candidate = 0.5 * (lo + hi)
        if abs(candidate - t) <= 1e-12 * max(1.0, abs(t)):
            return candidate
        t = candidate
    return t


def _normal_ppf(q: float) -> float:
    """Standard normal quantile (Acklam's rational approximation, relative
    error < 1.2e-9); only the starting point of ``student_t_ppf``'s Newton."""
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
         1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
         6.680131188771972e01, -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
         -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    if q < 0.02425:
        r = math.sqrt(-2 * math.log(q))
        return (((((c[0] * r + c[1]) * r + c[2]) * r + c[3]) * r + c[4]) * r + c[5]) / (
            (((d[0] * r + d[1]) * r + d[2]) * r + d[3]) * r + 1)
    if q > 1 - 0.02425:
        return -_normal_ppf(1 - q)
    r = q - 0.5
    s = r * r
    return (((((a[0] * s + a[1]) * s + a[2]) * s + a[3]) * s + a[4]) * s + a[5]) * r / (
        ((((b[0] * s + b[1]) * s + b[2]) * s + b[3]) * s + b[4]) * s + 1)


_T_PPF: Callable[[float, float], float] | None = None


def _resolve_t_ppf() -> Callable[[float, float], float]:
    try:
        from scipy.special import stdtrit
    except Exception:  # scipy missing or broken: the pure-Python quantile
        return student_t_ppf
    return lambda q, nu: float(stdtrit(nu, q))


def t_ppf(q: float, nu: float) -> float:
    """Student-t quantile: scipy's when importable (looked up on first use,
    so importing this module stays cheap), else ``student_t_ppf``."""
    global _T_PPF
    if _T_PPF is None:
        _T_PPF = _resolve_t_ppf()
    return _T_PPF(q, nu)


# ----------------------------------------------------------------------
# Posterior
# ----------------------------------------------------------------------
@dataclass(frozen=True)
class NIGPrior:
    """Normal-Inverse-Gamma prior over (mu, sigma^2) of log seconds."""

    mu0: float = 0.0  # log(1 s)
    kappa0: float = 1.0
    alpha0: float = 2.0
    beta0: float = 1.0

    def __post_init__(self) -> None:
        for name in ("kappa0", "alpha0", "beta0"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"NIGPrior.{name} must be a finite number > 0, got {value!r}")
        if not math.isfinite(self.mu0):
            raise ValueError(f"NIGPrior.mu0 must be finite, got {self.mu0!r}")


class NormalInverseGamma:
    """Conjugate posterior of Normal data with unknown mean and variance.

    Invariant: ``(n, xbar, m2)`` are the count, mean and sum of squared
    deviations of every value passed to ``update`` (Welford), so the
    posterior parameters below are exactly the closed form of the module
    docstring.
    """

    __slots__ = ("prior", "n", "xbar", "m2")

    def __init__(self, prior: NIGPrior | None = None) -> None:
        self.prior = prior or NIGPrior()
        self.n = 0
        self.xbar = 0.0
        self.m2 = 0.0

    def update(self, x: float) -> None:
        if not math.isfinite(x):
            raise ValueError(f"NormalInverseGamma.update: x must be finite, got {x!r}")
        self.n += 1
        delta = x - self.xbar
        self.xbar += delta / self.n
        self.m2 += delta * (x - self.xbar)

    @property
    def kappa_n(self) -> float:
        return self.prior.kappa0 + self.n

    @property
    def mu_n(self) -> float:
        p = self.prior
        return (p.kappa0 * p.mu0 + self.n * self.xbar) / self.kappa_n

    @property
    def alpha_n(self) -> float:
        return self.prior.alpha0 + 0.5 * self.n

    @property
    def beta_n(self) -> float:
        p = self.prior
        shrink = p.kappa0 * self.n * (self.xbar - p.mu0) ** 2 / (2.0 * self.kappa_n)
        return p.beta0 + 0.5 * self.m2 + shrink

    @property
    def mean(self) -> float:
        """Posterior mean of mu (= mu_n)."""
        return self.mu_n

    @property
    def variance_mean(self) -> float:
        """Posterior mean of sigma^2 (defined for alpha_n > 1)."""
        return self.beta_n / (self.alpha_n - 1.0)

    @property
    def predictive_dof(self) -> float:
        return 2.0 * self.alpha_n

    @property
    def predictive_scale(self) -> float:
        kappa_n, alpha_n = self.kappa_n, self.alpha_n
        return math.sqrt(self.beta_n * (kappa_n + 1.0) / (alpha_n * kappa_n))

    def predictive_quantile(self, q: float) -> float:
        """q-quantile of the posterior predictive of the next value (log
        scale): mu_n + scale * t_{2 alpha_n}^{-1}(q)."""
        if not 0.0 < q < 1.0:
            raise ValueError(f"predictive_quantile: q must be in (0, 1), got {q!r}")
        return self.mu_n + self.predictive_scale * t_ppf(q, self.predictive_dof)

    def sample(self, rng: random.Random) -> tuple[float, float]:
        """One draw (mu, sigma^2) from the posterior."""
        sigma2 = 1.0 / rng.gammavariate(self.alpha_n, 1.0 / self.beta_n)
        mu = rng.gauss(self.mu_n, math.sqrt(sigma2 / self.kappa_n))
        return mu, sigma2


def _normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


class _ToolPosterior:
    """Posterior of one tool plus values cached until its next update."""

    __slots__ = ("nig", "ttl_s", "median_s")

    def __init__(self, prior: NIGPrior) -> None:
        self.nig = NormalInverseGamma(prior)
        self.ttl_s: float | None = None
        self.median_s: float | None = None


class BayesianLayer:
    """Layer "bayesian" (see module docstring). O(1) per predict/observe
    (a dict lookup, two random draws, two erfc; TTL cached per tool); a
    cold scope's prediction adds at most ``MAX_PRIOR_VOTERS`` lookups."""

    name = "bayesian"
    # ContextAwarePredictor passes the request's scope to predict/observe.
    scoped = True

    def __init__(self, config: ContextServeConfig, prior: NIGPrior | None = None,
                 rng: random.Random | None = None) -> None:
        self.config = config
        self.prior = prior or NIGPrior()
        self.rng = rng if rng is not None else random.Random(config.seed)
        self._scopes: ScopeTable[OrderedDict[str, _ToolPosterior]] = ScopeTable(
            OrderedDict, config.max_scopes, max_units=config.max_tools, units=len,
        )
        self._log_fast = math.log(config.fast_threshold_s)
        self._log_slow = math.log(config.slow_threshold_s)

    def posterior(self, tool_key: str, scope: str = DEFAULT_SCOPE) -> NormalInverseGamma | None:
        tools = self._scopes.get(scope)
        state = tools.get(tool_key) if tools is not None else None
        return state.nig if state is not None else None

    def __len__(self) -> int:
        """Posteriors held over all scopes."""
        return self._scopes.total_units

    def observe(self, call: ToolCall, seconds: float, scope: str = DEFAULT_SCOPE) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return
        tools = self._scopes.touch(scope)
        state = tools.get(call.tool_key)
        if state is None:
            if len(tools) >= self.config.max_tools:
                tools.popitem(last=False)
            state = tools[call.tool_key] = _ToolPosterior(self.prior)
            self._scopes.update_units(scope)
        else:
            tools.move_to_end(call.tool_key)
        state.nig.update(math.log(max(seconds, MIN_SECONDS)))
        state.ttl_s = state.median_s = None

    def predict(self, call: ToolCall, scope: str = DEFAULT_SCOPE) -> Prediction | None:
        cfg = self.config
        tools = self._scopes.get(scope)
        state = tools.get(call.tool_key) if tools is not None else None
        if state is None or state.nig.n < cfg.min_observations:
            state = self._shared_prior(call.tool_key, scope)
            if state is None:
                return None
        nig = state.nig
        if state.median_s is None:
            state.median_s = math.exp(nig.mu_n)
        mu, sigma2 = nig.sample(self.rng)
        sigma = math.sqrt(sigma2)
        p_fast = _normal_cdf((self._log_fast - mu) / sigma)
        if p_fast >= cfg.confidence:
            if state.ttl_s is None:
                quantile = nig.predictive_quantile(cfg.confidence)
                # Learned from measured gaps: the client's round trip is in
                # the quantile already; the usual 20% margin covers jitter.
                state.ttl_s = hint_ttl(math.exp(min(quantile, 700.0)), cfg.max_ttl_s)
            return Prediction(ToolSpeed.FAST, state.ttl_s, self.name, state.median_s, learned_from_gaps=True)
        p_slow = 1.0 - _normal_cdf((self._log_slow - mu) / sigma)
        if p_slow >= cfg.confidence:
            return Prediction(ToolSpeed.SLOW, 0.0, self.name, state.median_s)
        return Prediction(ToolSpeed.UNCERTAIN, 0.0, self.name, state.median_s)

    def _shared_prior(self, tool_key: str, scope: str) -> _ToolPosterior | None:
        """A posterior for a scope without ``min_observations`` of its own:
        the low medians of (count, mean, spread) over other scopes that
        have them, or None below ``PRIOR_QUORUM`` such scopes. Built per
        call (at most ``MAX_PRIOR_VOTERS`` posteriors read), never stored."""
        needed = self.config.min_observations

        def knows_tool(tools: OrderedDict[str, _ToolPosterior]) -> bool:
            state = tools.get(tool_key)
            return state is not None and state.nig.n >= needed

        voters = [tools[tool_key].nig for _, tools in self._scopes.voters(scope, knows_tool)]
        n = shared_prior([float(nig.n) for nig in voters])
        if n is None:
            return None
        mean = shared_prior([nig.xbar for nig in voters])
        spread = shared_prior([nig.m2 / nig.n for nig in voters])
        assert mean is not None and spread is not None
        state = _ToolPosterior(self.prior)
        state.nig.n = min(int(n), PRIOR_MAX_OBSERVATIONS)
        state.nig.xbar = mean
        state.nig.m2 = spread * state.nig.n
        return state
