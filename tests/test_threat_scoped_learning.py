"""One client retunes everybody's TTLs ("No client can hurt another", finding 1).

Each test is an attack, named after it, and asserts the victim's outcome.
The attacker is a client (its own scope: an API key, or a scope name) that
sends 1,000 two-turn jobs whose second turn arrives ~6 ms after the first,
under the tool commands ``grep -rn x .`` and ``ls -la`` -- what the
black-box round measured moving another client's TTL for ``grep -rn TODO
src`` from 2.000 s to 0.010 s. Before scoped learning the tool-time
history, the round-trip margin and the Bayesian posteriors were global.

Most tests run the real estimators and deciders wired as the scheduler
wires them (``Server``: pure logic on a manual clock, no engine), and
compare with the same traffic in one shared scope: exactly what the plugin
did before scopes (``test_single_tenant_keeps_todays_ttls`` shows a single
scope decides as the unscoped estimators). One test drives the real vLLM
scheduler to show the scope flows from the request's metadata to the TTL.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import numpy as np
import pytest

from vllm_continuum_plugin.clock import ManualClock
from vllm_continuum_plugin.config import ContinuumConfig, load_config
from vllm_continuum_plugin.decisions import PinDecision, make_decider
from vllm_continuum_plugin.estimators.bayesian import BayesianLayer
from vllm_continuum_plugin.estimators.context_predictor import (
    ContextAwarePredictor,
    ContextServeConfig,
    ToolSpeed,
)
from vllm_continuum_plugin.estimators.history import JobTracker, ToolDurationHistory, TurnCountCorrelation
from vllm_continuum_plugin.estimators.parser import NO_TOOL_KEY, ToolCall, shell_call
from vllm_continuum_plugin.estimators.prefill import PrefillCostModel
from vllm_continuum_plugin.estimators.round_trip import RoundTripOverhead
from vllm_continuum_plugin.estimators.rules import RulesLayer
from vllm_continuum_plugin.estimators.scopes import (
    DEFAULT_SCOPE,
    FairShareBuffer,
    ScopeTable,
    key_scope,
    shared_prior,
)
from vllm_continuum_plugin.estimators.ttl import (
    ScopedToolHistory,
    ScopedTTLPolicy,
    TTLContext,
    make_ttl_policy,
)
from vllm_continuum_plugin.metadata import JobMetadata, MetadataError, parse_metadata, parse_scope

ATTACKER = key_scope("sk-attacker")
VICTIM = key_scope("sk-victim")
ATTACK_COMMANDS = ("grep -rn x .", "ls -la")
VICTIM_COMMANDS = ("grep -rn TODO src", "ls -la")


class Server:
    """The scheduler's learning path, without an engine: the same estimator
    and decider objects ``ContinuumSchedulerMixin.__init__`` builds, fed in
    the order ``_on_job_arrival`` and ``_free_request_blocks`` feed them."""

    def __init__(self, policy: str = "continuum", predictor: ContextAwarePredictor | None = None,
                 **settings: Any) -> None:
        cfg = self.cfg = load_config({"continuum": settings}, environ={})
        self.clock = ManualClock()
        self.jobs = JobTracker(cfg.max_jobs, cfg.job_idle_reset_s)
        self.round_trip = RoundTripOverhead(cfg.round_trip_default_s, max_scopes=cfg.max_scopes)
        self.tool_history = ScopedToolHistory(cfg.history_max_samples, cfg.history_max_tools, cfg.max_scopes)
        self.prefill = PrefillCostModel(cfg.prefill_seconds_per_token)
        self.turns = TurnCountCorrelation()
        self.ttl_policy = make_ttl_policy(
            cfg.ttl_policy, self.tool_history, self.prefill, default_ttl_s=cfg.default_ttl_s,
            max_ttl_s=cfg.max_ttl_s, fixed_ttl_s=cfg.fixed_ttl_s, cold_start_samples=cfg.cold_start_samples,
        )
        self.decider = make_decider(policy, cfg, self.ttl_policy, self.prefill)
        if predictor is not None:  # ContextServe without the classifier's background refits
            predictor.fallback = self.ttl_policy.decide
            self.decider.predictor = predictor  # type: ignore[attr-defined]

    def arrive(self, job_id: str, scope: str) -> None:
        job, measured, tool_key = self.jobs.on_arrival(job_id, self.clock.time(), scope)
        if measured is not None and scope == job.scope:
            if job.last_tool_s is not None:
                self.round_trip.observe(job, measured, job.last_tool_s)
            self.tool_history.record(tool_key or NO_TOOL_KEY, measured, job.scope)
            self.decider.observe(job.last_call, measured, job.scope)

    def finish(self, job_id: str, scope: str, call: ToolCall | None, hint: float | None = None,
               last: bool = False, context_tokens: int = 2000) -> PinDecision | None:
        if last:
            job = self.jobs.on_finish(job_id, self.clock.time(), None, counted=True)
            if job is not None:
                self.turns.add_job(job.turns_finished)
            self.jobs.forget(job_id)
            return None
        tool_key = call.tool_key if call is not None else NO_TOOL_KEY
        job = self.jobs.on_finish(job_id, self.clock.time(), tool_key, counted=True)
        assert job is not None
        job.last_predicted_s = job.last_tool_s = None
        meta = JobMetadata(job_id=job_id, expected_tool_seconds=hint, scope=scope)
        decision = self.decider.decide(meta, call, TTLContext(
            tool_key=tool_key, context_tokens=context_tokens, queueing_delay_s=0.0, eta=self.turns.eta(),
            round_trip_s=self.round_trip.margin(job), round_trip_measured=self.round_trip.is_measured(job),
            hold_price=0.01, scope=scope,
        ))
        job.last_call = call
        job.last_predicted_s = decision.predicted_seconds
        job.last_tool_s = decision.tool_seconds
        return decision

    def probe(self, scope: str, command: str, hint: float | None = None) -> PinDecision:
        """A fresh job's first turn of ``scope`` calling ``command``: its
        decision (the job is then ended, learning nothing)."""
        job_id = f"probe-{next(_probe_ids)}"
        self.arrive(job_id, scope)
        decision = self.finish(job_id, scope, shell_call(command), hint)
        assert decision is not None
        self.finish(job_id, scope, None, last=True)
        return decision

    def job(self, job_id: str, scope: str, gaps: list[float], command: str, hint: float | None = None) -> None:
        """A job of ``len(gaps) + 1`` turns whose tool takes ``gaps[i]``
        seconds after turn i (the last turn ends it)."""
        for gap in gaps:
            self.arrive(job_id, scope)
            self.clock.advance(0.02)  # the turn's own generation
            self.finish(job_id, scope, shell_call(command), hint)
            self.clock.advance(gap)
        self.arrive(job_id, scope)
        self.clock.advance(0.02)
        self.finish(job_id, scope, None, last=True)


_probe_ids = iter(range(10**9))


def fast_ci_bot(server: Server, scope: str, jobs: int = 1000, hint: float | None = None, seed: int = 0) -> None:
    """The attack: ``jobs`` two-turn jobs, second turn 4-8 ms after the first."""
    rng = random.Random(seed)
    for i in range(jobs):
        server.job(f"bot-{scope!r}-{i}", scope, [rng.uniform(0.004, 0.008)], ATTACK_COMMANDS[i % 2], hint)


def ttls(server: Server, scope: str, hint: float | None = None) -> list[float]:
    return [server.probe(scope, command, hint).ttl_s for command in VICTIM_COMMANDS]


def ratio(before: list[float], after: list[float]) -> float:
    """The largest factor any TTL moved by, either way."""
    return max(max(b, a) / min(b, a) for b, a in zip(before, after))


# ----------------------------------------------------------------------
# (a) 1,000 fast jobs of one client
# ----------------------------------------------------------------------
def test_a_fast_ci_bot_does_not_shorten_another_clients_ttls():
    scoped, shared = Server(), Server()
    before = ttls(scoped, VICTIM)
    assert before == ttls(shared, VICTIM) == [2.0, 2.0]  # cold start: default_ttl_s
    fast_ci_bot(scoped, ATTACKER)
    fast_ci_bot(shared, VICTIM)  # the same traffic in one scope: the plugin before scopes
    after, unscoped = ttls(scoped, VICTIM), ttls(shared, VICTIM)
    assert ratio(before, after) < 2.0, (before, after)
    assert after == before
    # Without scopes the victim's TTLs fell to the attacker's ~8 ms (the
    # black-box round measured 2.000 s -> 0.010 s).
    assert ratio(before, unscoped) > 100, unscoped
    # The attacker learned its own tool times all the same.
    assert all(t < 0.01 for t in ttls(scoped, ATTACKER))


def test_a_fast_ci_bot_under_many_scope_names_does_not_shorten_another_clients_ttls():
    # Names cost nothing: the bot spreads its jobs over 20 names. Named
    # scopes learn for themselves but never vote in the shared prior.
    server = Server()
    before = ttls(server, VICTIM)
    for name in range(20):
        fast_ci_bot(server, f"bot-{name}", jobs=150, seed=name)
    assert ttls(server, VICTIM) == before
    assert ttls(server, DEFAULT_SCOPE) == before  # untagged clients alike


def test_a_fast_ci_bot_does_not_drag_the_shared_prior_of_three_honest_clients():
    # Three honest clients (API keys) whose greps take ~1.5 s form the
    # shared prior a new client starts from; the bot is a fourth voter.
    server = Server()
    rng = random.Random(1)
    for k in range(3):
        for i in range(120):
            server.job(f"honest-{k}-{i}", key_scope(f"sk-honest-{k}"), [rng.uniform(1.2, 1.8)],
                       VICTIM_COMMANDS[i % 2])
    before = ttls(server, VICTIM)
    assert all(1.2 <= t <= 1.8 for t in before), before  # the prior, not the 2 s default
    fast_ci_bot(server, ATTACKER)
    after = ttls(server, VICTIM)
    assert ratio(before, after) < 2.0, (before, after)


def test_a_warm_client_decides_from_its_own_tool_times_whatever_others_send():
    server = Server()
    rng = random.Random(2)
    for i in range(150):
        server.job(f"v-{i}", VICTIM, [rng.uniform(0.8, 1.2)], VICTIM_COMMANDS[i % 2])
    before = ttls(server, VICTIM)
    assert all(0.8 <= t <= 1.2 for t in before)
    fast_ci_bot(server, ATTACKER)
    assert ttls(server, VICTIM) == before


# ----------------------------------------------------------------------
# (b) the victim's own hint
# ----------------------------------------------------------------------
def test_a_fast_ci_bot_does_not_shorten_a_hinted_ttl():
    scoped, shared = Server(), Server()
    before = ttls(scoped, VICTIM, hint=0.1)
    # (0.1 s + the default 2.5 s round trip) * 1.2 + 0.05
    assert before == pytest.approx([3.17, 3.17])
    fast_ci_bot(scoped, ATTACKER, hint=0.1)
    fast_ci_bot(shared, VICTIM, hint=0.1)
    after, unscoped = ttls(scoped, VICTIM, hint=0.1), ttls(shared, VICTIM, hint=0.1)
    assert ratio(before, after) < 2.0 and after == before
    # Before scopes the bot's zero overheads became everybody's round trip:
    # 3.17 s -> 0.17 s (18.6x), as measured black-box.
    assert unscoped == pytest.approx([0.17, 0.17])


# ----------------------------------------------------------------------
# (c) the round-trip margin
# ----------------------------------------------------------------------
@pytest.mark.parametrize("overhead", [0.0, 9.0])
def test_another_scopes_round_trips_do_not_move_a_clients_margin(overhead):
    rt = RoundTripOverhead(default_s=2.5, min_global_samples=20)
    jobs = JobTracker()
    victim_job, _, _ = jobs.on_arrival("v", 0.0, VICTIM)
    for i in range(1000):  # the bot's overhead: none at all, or 9 s
        bot, _, _ = jobs.on_arrival(f"bot-{i}", 0.0, ATTACKER)
        rt.observe(bot, gap_s=0.1 + overhead, tool_s=0.1)
    assert rt.margin(jobs.on_arrival("bot-x", 0.0, ATTACKER)[0]) == pytest.approx(overhead)
    assert rt.margin(victim_job) == 2.5 and not rt.is_measured(victim_job)  # still the default
    for i in range(30):  # the victim's own clients: ~1 s per round trip
        own, _, _ = jobs.on_arrival(f"v-{i}", 0.0, VICTIM)
        rt.observe(own, gap_s=1.1 + 0.01 * (i % 10), tool_s=0.1)
    fresh, _, _ = jobs.on_arrival("v-new", 0.0, VICTIM)
    assert rt.margin(fresh) == pytest.approx(1.08) and rt.is_measured(fresh)  # its 90th percentile
    assert rt.global_margin(DEFAULT_SCOPE) == 2.5  # untagged traffic learned nothing either


def test_one_scopes_round_trips_are_outvoted_in_the_shared_prior():
    rt = RoundTripOverhead(default_s=2.5, min_global_samples=20)
    jobs = JobTracker()
    for k, overhead in enumerate((0.9, 1.0, 1.1)):
        for i in range(20):
            job, _, _ = jobs.on_arrival(f"h{k}-{i}", 0.0, key_scope(f"sk-{k}"))
            rt.observe(job, gap_s=overhead + 0.1, tool_s=0.1)
    newcomer, _, _ = jobs.on_arrival("new", 0.0, VICTIM)
    before = rt.margin(newcomer)
    assert before == pytest.approx(1.0) and rt.is_measured(newcomer)  # the honest median
    for i in range(1000):
        bot, _, _ = jobs.on_arrival(f"bot-{i}", 0.0, ATTACKER)
        rt.observe(bot, gap_s=0.1, tool_s=0.1)
    assert 0.5 < rt.margin(newcomer) / before <= 1.0


# ----------------------------------------------------------------------
# (d) ContextServe: posteriors and classification
# ----------------------------------------------------------------------
def _bayesian_only() -> ContextAwarePredictor:
    cfg = ContextServeConfig(seed=0)
    return ContextAwarePredictor(cfg, fallback=lambda ctx: None,  # set by Server
                                 layers=[RulesLayer(cfg), BayesianLayer(cfg)])


def test_a_fast_ci_bot_does_not_flip_another_clients_slow_grep_to_fast():
    # The victim greps a monorepo: a minute, SLOW, its KV freed at once.
    scoped, shared = Server("context_serve", _bayesian_only()), Server("context_serve", _bayesian_only())
    for server in (scoped, shared):
        for i in range(40):
            server.job(f"v-{i}", VICTIM, [60.0], "grep -rn TODO src")
    assert {scoped.probe(VICTIM, "grep -rn TODO src").speed for _ in range(20)} == {"slow"}
    fast_ci_bot(scoped, ATTACKER)
    fast_ci_bot(shared, VICTIM)
    assert {scoped.probe(VICTIM, "grep -rn TODO src").speed for _ in range(50)} == {"slow"}
    layer = scoped.decider.predictor.layers[1]  # type: ignore[attr-defined]
    assert layer.posterior("grep", VICTIM).n == 40 and layer.posterior("grep", ATTACKER).n == 500
    # Before scopes: the bot's 500 greps outweighed the victim's 40; its
    # minute-long grep was pinned as FAST for a fraction of a second.
    flipped = shared.probe(VICTIM, "grep -rn TODO src")
    assert flipped.speed == "fast" and flipped.ttl_s < 1.0


def test_a_fast_ci_bot_does_not_classify_a_new_clients_tools():
    # A new client has no posterior of its own; the bot alone is no quorum,
    # so the Bayesian layer abstains for it as it did before any traffic.
    server = Server("context_serve", _bayesian_only())
    before = server.probe(VICTIM, "grep -rn TODO src")
    fast_ci_bot(server, ATTACKER)
    after = server.probe(VICTIM, "grep -rn TODO src")
    assert before == after and after.layer == "fallback" and after.ttl_s == 2.0


def test_a_fast_ci_bot_is_outvoted_in_the_bayesian_prior():
    layer = BayesianLayer(ContextServeConfig(seed=0))
    grep = shell_call("grep -rn TODO src")
    rng = random.Random(3)
    for k in range(3):  # three clients whose greps take about a minute
        for _ in range(20):
            layer.observe(grep, rng.uniform(40.0, 80.0), key_scope(f"sk-{k}"))
    before = [layer.predict(grep, VICTIM).speed for _ in range(200)]
    for _ in range(500):
        layer.observe(grep, rng.uniform(0.004, 0.008), ATTACKER)
    after = [layer.predict(grep, VICTIM).speed for _ in range(200)]
    # A new client starts from the honest clients' prior (Thompson draws
    # explore a little), never from the bot's.
    for speeds in (before, after):
        assert ToolSpeed.FAST not in speeds and speeds.count(ToolSpeed.SLOW) >= 180, speeds
    assert {layer.predict(grep, ATTACKER).speed for _ in range(50)} == {ToolSpeed.FAST}


def test_a_flood_of_one_scope_does_not_push_another_scopes_samples_out_of_the_classifier_buffer():
    from vllm_continuum_plugin.estimators.xgb_classifier import XGBoostLayer

    snapshots: list[list[Any]] = []
    layer = XGBoostLayer(ContextServeConfig(max_training_samples=100, refit_every=1_000_000),
                         trainer=lambda samples: snapshots.append(list(samples)))
    for i in range(40):
        layer.observe(shell_call(f"make -C pkg{i}"), 30.0, VICTIM)
    for i in range(1000):
        layer.observe(shell_call(ATTACK_COMMANDS[i % 2]), 0.006, ATTACKER)
    assert layer._buffer.count(VICTIM) == 40 and layer._buffer.count(ATTACKER) == 60
    assert len(layer._buffer) == 100


# ----------------------------------------------------------------------
# (e) single tenant: today's TTLs
# ----------------------------------------------------------------------
@pytest.mark.parametrize("policy_name", ["priced", "cdf", "fixed"])
@pytest.mark.parametrize("scope", [DEFAULT_SCOPE, VICTIM, "team-a"])
def test_single_tenant_keeps_todays_ttls(policy_name, scope):
    """One scope decides exactly as the unscoped policy on one history,
    sample by sample: cold start, the global pool, then each tool's own."""
    rng = np.random.default_rng(4)
    unscoped_history = ToolDurationHistory(512, 8)
    scoped_history = ScopedToolHistory(512, 8, max_scopes=4)
    kwargs = dict(default_ttl_s=2.0, max_ttl_s=60.0, fixed_ttl_s=2.0, cold_start_samples=50)
    unscoped = make_ttl_policy(policy_name, unscoped_history, PrefillCostModel(1e-3), **kwargs)
    scoped = make_ttl_policy(policy_name, scoped_history, PrefillCostModel(1e-3), **kwargs)
    assert isinstance(scoped, ScopedTTLPolicy)
    tools = [f"tool{i}" for i in range(10)]  # more than the 8 kept: LRU drops happen too
    compared = 0
    for i in range(1500):
        tool = tools[int(rng.integers(len(tools)))]
        seconds = float(rng.lognormal(0.0, 1.0))
        unscoped_history.record(tool, seconds)
        scoped_history.record(tool, seconds, scope)
        if i % 7 == 0:
            for probe in (tool, "never-seen"):
                ctx = TTLContext(tool_key=probe, context_tokens=int(rng.integers(10, 20000)),
                                 queueing_delay_s=float(rng.uniform(0, 3)), eta=float(rng.uniform(0, 1)),
                                 round_trip_s=float(rng.uniform(0, 3)), round_trip_measured=bool(i % 2),
                                 hold_price=float(rng.uniform(0, 1)), scope=scope)
                assert scoped.decide(ctx) == unscoped.decide(dataclasses.replace(ctx, scope=DEFAULT_SCOPE))
                compared += 1
    assert compared > 400
    assert scoped_history.stored_samples() == unscoped_history.stored_samples()


def test_single_tenant_keeps_todays_round_trip_margin():
    """One scope: the job's own samples, then the server-wide quantile of
    the last ``window`` samples, then the default -- the unscoped rule."""
    rng = random.Random(5)
    for scope in (DEFAULT_SCOPE, VICTIM):
        rt = RoundTripOverhead(default_s=2.5, window=64, min_global_samples=20, quantile=0.9)
        jobs = JobTracker()
        window: list[float] = []
        for i in range(300):
            job, _, _ = jobs.on_arrival(f"j{i % 37}", 0.0, scope)
            gap = rng.uniform(0.0, 4.0)
            rt.observe(job, gap_s=gap + 0.1, tool_s=0.1)
            window = (window + [max(0.0, (gap + 0.1) - 0.1)])[-64:]
            fresh, _, _ = jobs.on_arrival(f"fresh{i}", 0.0, scope)
            jobs.forget(f"fresh{i}")
            expected = 2.5 if len(window) < 20 else sorted(window)[math.ceil(0.9 * len(window)) - 1]
            assert rt.margin(fresh) == pytest.approx(expected, abs=1e-12)
            assert rt.is_measured(fresh) == (len(window) >= 20)


def test_single_tenant_keeps_todays_bayesian_decisions():
    cfg = ContextServeConfig(seed=11)
    unscoped, scoped = BayesianLayer(cfg), BayesianLayer(cfg)
    rng = random.Random(6)
    calls = [shell_call(c) for c in ("python a.py", "cargo build", "grep -rn x .")]
    for i in range(300):
        call = calls[i % 3]
        seconds = rng.lognormvariate(0.0, 1.5)
        unscoped.observe(call, seconds)
        scoped.observe(call, seconds, VICTIM)
        assert scoped.predict(call, VICTIM) == unscoped.predict(call)


# ----------------------------------------------------------------------
# Where the scope comes from, and what it may cost
# ----------------------------------------------------------------------
def test_a_client_cannot_name_another_clients_key_scope():
    assert parse_metadata({"continuum_scope": " team-a "}).scope == "team-a"
    assert parse_metadata({}).scope == parse_metadata({"continuum_scope": "  "}).scope == DEFAULT_SCOPE
    assert parse_scope(VICTIM) == VICTIM  # what the API server writes for a verified key
    for bad in ("a\x00b", "x" * 129, 7, ["a"]):
        with pytest.raises(MetadataError, match="continuum_scope"):
            parse_metadata({"continuum_scope": bad})
    assert "sk-victim" not in VICTIM  # only a hash of the key is kept


class _Headers(dict):
    def get(self, name, default=None):  # Starlette's headers ignore case
        return next((v for k, v in self.items() if k.lower() == name.lower()), default)


def _raw_request(headers: dict[str, str], api_keys: list[str] | None) -> Any:
    from types import SimpleNamespace

    state = SimpleNamespace(args=SimpleNamespace(api_key=api_keys), vllm_config=None)
    return SimpleNamespace(headers=_Headers(headers), app=SimpleNamespace(state=state))


def test_a_client_with_an_api_key_cannot_claim_another_scope(monkeypatch):
    from vllm_continuum_plugin.api_metadata import client_scope

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    keyed = _raw_request({"Authorization": "Bearer sk-attacker", "X-Continuum-Scope": "team-a"}, ["sk-attacker"])
    assert client_scope(keyed, "team-b") == ATTACKER  # the key decides; names are ignored
    keyless = _raw_request({"X-Continuum-Scope": "team-a", "Authorization": "Bearer whatever"}, None)
    assert client_scope(keyless, None) == "team-a"
    assert client_scope(keyless, "team-b") == "team-b"  # the body field first, as vLLM's session_id
    assert client_scope(_raw_request({}, None), None) == DEFAULT_SCOPE
    with pytest.raises(MetadataError, match="continuum_scope"):
        client_scope(keyless, VICTIM)  # a key's scope is the server's to set
    with pytest.raises(MetadataError, match="X-Continuum-Scope header"):
        client_scope(_raw_request({"X-Continuum-Scope": "x" * 200}, None), None)


def test_an_api_key_decides_the_scope_the_engine_sees(monkeypatch):
    """The API-server path with vLLM's own classes: the patched
    ``to_sampling_params`` and ``_get_session_id`` write the verified key's
    scope into the request's ``extra_args``; the engine parses it back."""
    from types import SimpleNamespace

    from vllm_continuum_plugin.registration import register

    register()
    from starlette.datastructures import Headers
    from vllm.entrypoints.generate.base.serving import GenerateBaseServing
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.exceptions import VLLMValidationError

    monkeypatch.delenv("VLLM_API_KEY", raising=False)

    def served(headers: dict[str, str], api_keys: list[str] | None, **body: Any) -> JobMetadata:
        vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(policy="continuum", scheduler_cls=None),
                                      additional_config={})
        state = SimpleNamespace(vllm_config=vllm_config, args=SimpleNamespace(api_key=api_keys))
        raw = SimpleNamespace(headers=Headers(headers), app=SimpleNamespace(state=state))
        request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **body)
        params = request.to_sampling_params(8, {})
        session = GenerateBaseServing._get_session_id(request, raw)
        return parse_metadata(params.extra_args, session)

    keyed = served({"Authorization": "Bearer sk-victim"}, ["sk-victim", "sk-attacker"],
                   job_id="j", continuum_scope="team-b")
    assert keyed.scope == VICTIM and keyed.job_id == "j"
    assert served({"X-Continuum-Scope": "team-a"}, None).scope == "team-a"
    assert served({}, None, vllm_xargs={"continuum_scope": "team-c"}).scope == "team-c"
    assert served({}, None).scope == DEFAULT_SCOPE
    with pytest.raises(VLLMValidationError, match="continuum_scope"):
        served({}, None, continuum_scope=VICTIM)  # a key's scope is the server's to set


def test_a_flood_of_scope_names_keeps_memory_bounded():
    server = Server(max_scopes=8, history_max_samples=64, history_max_tools=4)
    for name in range(50):
        server.job(f"j{name}", f"name-{name}", [0.01] * 3, ATTACK_COMMANDS[name % 2])
    assert len(server.tool_history.scopes) <= 8 and server.tool_history.scopes.evictions >= 42
    # Samples over all scopes stay within the unscoped bound, (tools + 1) x samples.
    history = ScopedToolHistory(64, 4, max_scopes=8)
    for i in range(20000):
        history.record(f"t{i % 7}", 0.1, f"s{i % 11}")
        assert history.stored_samples() <= 5 * 64
    assert len(history.scopes) <= 8
    with pytest.raises(ValueError, match="max_scopes"):
        ContinuumConfig(max_scopes=0)
    with pytest.raises(ValueError, match="max_scopes"):
        load_config({"continuum": {"max_scopes": 10**9}}, environ={})


def test_scope_table_and_fair_share_buffer_invariants():
    table: ScopeTable[list[int]] = ScopeTable(list, max_scopes=3, max_units=10, units=len)
    for scope in "abcd":
        table.touch(scope).append(1)
        table.update_units(scope)
    assert list(table) == ["b", "c", "d"] and table.total_units == 3
    table.touch("b").extend([1] * 9)
    table.update_units("b")  # 12 > 10: the least recently active others go
    assert list(table) == ["b"] and table.total_units == 10
    assert shared_prior([1.0, 9.0]) is None and shared_prior([3.0, 1.0, 100.0]) == 3.0
    assert shared_prior([1.0, 2.0, 3.0, 1000.0]) == 2.0
    with pytest.raises(ValueError, match="max_scopes"):
        ScopeTable(list, max_scopes=0)
    one: FairShareBuffer[int] = FairShareBuffer(capacity=5, max_scopes=4)
    for i in range(12):
        one.append("only", i)
    assert one.snapshot() == list(range(7, 12))  # one scope: a plain FIFO


# ----------------------------------------------------------------------
# The real scheduler: the scope flows from the request to the TTL
# ----------------------------------------------------------------------
def test_a_fast_ci_bot_on_the_real_scheduler_does_not_shorten_another_clients_ttl():
    from harness import make_request, make_scheduler, prompt_of, run_until_finished

    def turn(s, job: str, prompt: list[int], scope: str | None, command: str | None, last: bool):
        extra: dict[str, Any] = {}
        if scope is not None:
            extra["continuum_scope"] = scope
        if command is not None:
            extra["tool_command"] = command
        r = make_request(prompt, max_tokens=2, job_id=job, is_last_step=last, extra=extra)
        s.add_request(r)
        run_until_finished(s, [r])
        return r

    def victim_ttl(s, name: str, scope: str | None) -> float:
        prompt = prompt_of(900, 40)
        r = turn(s, name, prompt, scope, "grep -rn TODO src", last=False)
        ttl = s.pins.get(name).ttl_s
        turn(s, name, prompt + list(r.output_token_ids) + [5, 6], scope, None, last=True)
        return ttl

    def bot(s, scope: str | None, jobs: int) -> None:
        for i in range(jobs):
            prompt = prompt_of(i % 800, 40)
            r = turn(s, f"bot-{i}", prompt, scope, ATTACK_COMMANDS[i % 2], last=False)
            s.clock.advance(0.006)
            turn(s, f"bot-{i}", prompt + list(r.output_token_ids) + [5, 6], scope, None, last=True)

    s = make_scheduler(num_blocks=64)
    before = victim_ttl(s, "victim-0", "victim")
    bot(s, "attacker", 1000)
    after = victim_ttl(s, "victim-1", "victim")
    assert before == after == 2.0
    assert s.tool_history.num_samples(scope="attacker") == 1000  # one tool time per bot job
    assert s.tool_history.num_samples(scope="victim") == 2  # its own two jobs' gaps, none of the bot's
    # Control: the same bot in the victim's scope is the plugin before scopes.
    shared = make_scheduler(num_blocks=64)
    bot(shared, "victim", 150)
    assert victim_ttl(shared, "victim-2", "victim") < 0.05
