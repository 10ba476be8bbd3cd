"""Settings that accept infinity ("No client can hurt another", finding 5).

Every numeric setting of ``ContinuumConfig`` and ``ContextServeConfig`` has a
finite, declared range (``vllm_continuum_plugin.ranges``). These tests walk
the declarations, not a hand-kept list, so a new numeric setting without a
range fails ``test_every_numeric_setting_declares_a_range`` and every
declared range is exercised through each way a value gets in: the
constructors, ``--additional-config`` (``load_config(additional_config)``,
what the scheduler calls) and the ``CONTINUUM_<NAME>`` environment.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from vllm_continuum_plugin.config import ENV_PREFIX, ContinuumConfig, load_config
from vllm_continuum_plugin.estimators.context_predictor import ContextServeConfig
from vllm_continuum_plugin.estimators.history import ToolDurationHistory
from vllm_continuum_plugin.estimators.prefill import PrefillCostModel
from vllm_continuum_plugin.estimators.ttl import TTLContext, make_ttl_policy
from vllm_continuum_plugin.ranges import DAY_S, Range, field_ranges

SETTINGS_DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
CONFIGS: tuple[type, ...] = (ContinuumConfig, ContextServeConfig)


def _numeric_fields(cls: type) -> list[str]:
    """Fields annotated int / float (optionally ``| None``), bools excluded."""
    hints = typing.get_type_hints(cls)
    names = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = set(typing.get_args(hint)) - {type(None)} if isinstance(hint, types.UnionType) else {hint}
        if args and args <= {int, float}:
            names.append(f.name)
    return names


def _cases(cls: type) -> list[tuple[type, str, Range]]:
    return [(cls, name, r) for name, r in field_ranges(cls).items()]


ALL_FIELDS = [case for cls in CONFIGS for case in _cases(cls)]
CONTINUUM_FIELDS = _cases(ContinuumConfig)


def _id(case: tuple[type, str, Range]) -> str:
    return f"{case[0].__name__}.{case[1]}"


def _bad_values(r: Range) -> list[Any]:
    """inf, -inf, nan, a negative number (every range here starts at >= 0,
    so a negative is never meaningful) and an absurd value: 1e308 for a
    float setting, 10**12 for a count (10**30 where 10**12 is in range:
    the seed)."""
    assert r.lo >= 0, "a negative is refused only where the range starts at >= 0"
    absurd = 1e308 if not r.integer else (10**12 if r.hi < 10**12 else 10**30)
    return [math.inf, -math.inf, math.nan, -1, absurd]


BAD_CASES = [(*case, bad) for case in ALL_FIELDS for bad in _bad_values(case[2])]
CONTINUUM_BAD_CASES = [(*case, bad) for case in CONTINUUM_FIELDS for bad in _bad_values(case[2])]


def _bad_id(case: tuple[type, str, Range, Any]) -> str:
    return f"{_id(case[:3])}={case[3]!r}"


def _build(cls: type, name: str, value: Any) -> Any:
    """``cls`` with ``name=value`` and the defaults elsewhere; a fast
    threshold above the default slow one raises the slow one too, so only
    the range of ``name`` is under test."""
    kwargs: dict[str, Any] = {name: value}
    if name == "fast_threshold_s" and isinstance(value, (int, float)) and value > 10.0:
        kwargs["slow_threshold_s"] = value
    return cls(**kwargs)


def _assert_names_field_value_and_range(err: pytest.ExceptionInfo[ValueError], name: str, value: Any,
                                        r: Range) -> None:
    message = str(err.value)
    assert f"{name}=" in message, message
    assert str(value).lstrip("-") in message, message  # the bad value as given
    assert r.describe() in message, message  # the allowed range


# ----------------------------------------------------------------------
# The declarations
# ----------------------------------------------------------------------
@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_numeric_setting_declares_a_range(cls: type) -> None:
    assert _numeric_fields(cls), cls
    assert sorted(field_ranges(cls)) == sorted(_numeric_fields(cls))


@pytest.mark.parametrize("case", ALL_FIELDS, ids=_id)
def test_every_range_is_finite_and_durations_stay_within_a_day(case: tuple[type, str, Range]) -> None:
    _, name, r = case
    assert math.isfinite(r.lo) and math.isfinite(r.hi) and r.lo <= r.hi
    if name.endswith("_s"):
        assert r.hi <= DAY_S


def test_defaults_load_and_lie_in_their_ranges() -> None:
    assert load_config(None, environ={}) == ContinuumConfig()
    assert load_config({}, environ={}) == ContinuumConfig()
    for cls in CONFIGS:
        default = cls()
        for name, r in field_ranges(cls).items():
            assert r.contains(getattr(default, name)), (cls.__name__, name, getattr(default, name), r.describe())


# ----------------------------------------------------------------------
# Refused through every path
# ----------------------------------------------------------------------
@pytest.mark.parametrize("case", BAD_CASES, ids=_bad_id)
def test_constructor_refuses_out_of_range(case: tuple[type, str, Range, Any]) -> None:
    cls, name, r, bad = case
    with pytest.raises(ValueError) as err:
        _build(cls, name, bad)
    _assert_names_field_value_and_range(err, name, bad, r)


@pytest.mark.parametrize("case", CONTINUUM_BAD_CASES, ids=_bad_id)
def test_additional_config_refuses_out_of_range(case: tuple[type, str, Range, Any]) -> None:
    _, name, r, bad = case
    with pytest.raises(ValueError) as err:
        load_config({"continuum": {name: bad}}, environ={})
    _assert_names_field_value_and_range(err, name, bad, r)
    assert "--additional-config" in str(err.value)


@pytest.mark.parametrize("case", CONTINUUM_BAD_CASES, ids=_bad_id)
def test_environment_refuses_out_of_range(case: tuple[type, str, Range, Any]) -> None:
    _, name, r, bad = case
    env_name = ENV_PREFIX + name.upper()
    with pytest.raises(ValueError) as err:
        load_config(None, environ={env_name: str(bad)})
    _assert_names_field_value_and_range(err, name, bad, r)
    assert env_name in str(err.value)


def test_an_overridden_bad_environment_value_still_stops_startup() -> None:
    with pytest.raises(ValueError, match="CONTINUUM_FIXED_TTL_S"):
        load_config({"continuum": {"fixed_ttl_s": 2.0}}, environ={"CONTINUUM_FIXED_TTL_S": "inf"})


@pytest.mark.parametrize("text, name", [
    ('{"continuum": {"ttl_policy": "fixed", "fixed_ttl_s": 1e308}}', "fixed_ttl_s"),
    ('{"continuum": {"default_ttl_s": Infinity}}', "default_ttl_s"),
    ('{"continuum": {"prefill_seconds_per_token": NaN}}', "prefill_seconds_per_token"),
    ('{"continuum": {"max_ttl_s": 1e400}}', "max_ttl_s"),  # the parser makes it inf
    ('{"continuum": {"slow_threshold_s": 1' + "0" * 400 + "}}", "slow_threshold_s"),  # beyond float
    ('{"continuum": {"max_jobs": 1000000000000}}', "max_jobs"),
])
def test_json_literals_of_the_additional_config_flag(text: str, name: str) -> None:
    """What vLLM's ``--additional-config`` parser hands over: Python's JSON
    accepts Infinity, NaN and integers beyond any float."""
    with pytest.raises(ValueError, match=rf"continuum setting {name}=.* from --additional-config .*expected"):
        load_config(json.loads(text), environ={})


# ----------------------------------------------------------------------
# Accepted at the edges, refused just past them
# ----------------------------------------------------------------------
def _just_past(r: Range) -> list[Any]:
    above = r.hi if r.hi_open else (r.hi + 1 if r.integer else r.hi * 1.5 + 1)
    below = [r.lo] if r.lo_open else ([r.lo - 1] if r.integer else [math.nextafter(r.lo, -math.inf)])
    return [above, *below]


@pytest.mark.parametrize("case", ALL_FIELDS, ids=_id)
def test_closed_bounds_are_accepted_and_the_values_past_them_refused(case: tuple[type, str, Range]) -> None:
    cls, name, r = case
    for edge in ([] if r.lo_open else [r.lo]) + ([] if r.hi_open else [r.hi]):
        value = int(edge) if r.integer else float(edge)
        assert getattr(_build(cls, name, value), name) == value
    for outside in _just_past(r):
        value = int(outside) if r.integer else float(outside)
        with pytest.raises(ValueError, match=rf"{name}="):
            _build(cls, name, value)


@pytest.mark.parametrize("case", [c for c in ALL_FIELDS if c[2].integer], ids=_id)
def test_counts_refuse_fractions_and_bools(case: tuple[type, str, Range]) -> None:
    cls, name, r = case
    for bad in (1.5, True):
        with pytest.raises(ValueError, match=rf"{name}="):
            _build(cls, name, bad)


# ----------------------------------------------------------------------
# Booleans keep their spellings
# ----------------------------------------------------------------------
@pytest.mark.parametrize("raw, expected", [
    (True, True), (False, False), (1, True), (0, False), ("on", True), ("off", False),
    ("yes", True), ("no", False), (" TRUE ", True), ("false", False), ("1", True), ("0", False),
])
def test_booleans_from_both_sources_keep_their_spellings(raw: Any, expected: bool) -> None:
    assert load_config({"continuum": {"admission": raw}}, environ={}).admission is expected
    assert load_config(None, environ={"CONTINUUM_IMPLICIT_JOBS": str(raw)}).implicit_jobs is expected


@pytest.mark.parametrize("raw", [2, -1, "maybe", 0.5, "inf"])
def test_booleans_refuse_anything_else(raw: Any) -> None:
    with pytest.raises(ValueError, match="pin_on_stop_string="):
        load_config({"continuum": {"pin_on_stop_string": raw}}, environ={})


# ----------------------------------------------------------------------
# The fixed policy is bounded by max_ttl_s
# ----------------------------------------------------------------------
def _fixed_policy(history: ToolDurationHistory, **section: Any) -> Any:
    """The TTL policy exactly as the scheduler builds it from the config."""
    cfg = load_config({"continuum": {"ttl_policy": "fixed", **section}}, environ={})
    return make_ttl_policy(
        cfg.ttl_policy, history, PrefillCostModel(cfg.prefill_seconds_per_token),
        default_ttl_s=cfg.default_ttl_s, max_ttl_s=cfg.max_ttl_s,
        fixed_ttl_s=cfg.fixed_ttl_s, cold_start_samples=cfg.cold_start_samples,
    )


def test_fixed_policy_ttl_is_clamped_by_max_ttl() -> None:
    history = ToolDurationHistory()
    policy = _fixed_policy(history, fixed_ttl_s=3600, max_ttl_s=60)

    def ttl(tool: str) -> float:
        return policy.decide(TTLContext(tool, 1000, 0.0, 1.0)).ttl_s

    assert 0 < ttl("unknown") <= 60.0  # an unknown tool counts as fast: pinned, for 60 s at most
    history.record("quick", 30.0)
    assert ttl("quick") == 60.0
    # A tool known to outlast the 60 s actually held is not pinned: the rule
    # stays "pin for T iff the tool returns within T".
    history.record("build", 100.0)
    assert ttl("build") == 0.0


def test_fixed_policy_below_the_cap_is_unchanged() -> None:
    history = ToolDurationHistory()
    policy = _fixed_policy(history, fixed_ttl_s=2.0, max_ttl_s=60)
    assert policy.decide(TTLContext("unknown", 1000, 0.0, 1.0)).ttl_s == 2.0


# ----------------------------------------------------------------------
# docs/configuration.md states the enforced ranges
# ----------------------------------------------------------------------
def _interval(r: Range) -> str:
    return r.describe().split(" in ", 1)[1].removesuffix(" or None")


@pytest.mark.parametrize("case", CONTINUUM_FIELDS, ids=_id)
def test_settings_table_states_each_range(case: tuple[type, str, Range]) -> None:
    _, name, r = case
    rows = [line for line in SETTINGS_DOC.read_text().splitlines() if line.startswith(f"| `{name}` |")]
    assert len(rows) == 1, f"docs/configuration.md has {len(rows)} rows for {name}"
    assert re.search(re.escape(_interval(r)), rows[0]), (rows[0], _interval(r))
