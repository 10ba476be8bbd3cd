"""Declared retention, parsed and planned (``vllm_continuum_plugin.retention``).

Both spellings the field sends (vLLM PR #38514's ``retention_directives`` /
``retention_scope``, TensorRT-LLM's ``kv_cache_retention_config``) parse to
one ``Retention``; a malformed one is refused naming its field (the API
server's HTTP 400); the plan keeps a prefix, stage by stage, never past
``retention_max_s``, and sends low-priority blocks first out.
"""

from __future__ import annotations

import json

import pytest

from vllm_continuum_plugin.metadata import MetadataError, parse_metadata
from vllm_continuum_plugin.retention import (
    DEFAULT_PRIORITY,
    MAX_RETENTION_RANGES,
    Retention,
    RetentionRange,
    parse_retention,
)

BS = 16


def parse(args):
    """(retention, retention_scope) as the metadata parser reads them."""
    meta = parse_metadata(args)
    return meta.retention, meta.job_id


def test_pr_spelling_parses_ranges_and_scope():
    retention, scope = parse({
        "retention_directives": [
            {"start": 0, "end": 512, "priority": 90, "duration": 600},
            {"start": 512, "end": 4096, "priority": 70, "duration": 12.5},
            {"start": 4096, "end": 4200, "priority": 50},
        ],
        "retention_scope": " session-7 ",
    })
    assert scope == "session-7"
    assert retention == Retention((
        RetentionRange(0, 512, 90, 600.0), RetentionRange(512, 4096, 70, 12.5), RetentionRange(4096, 4200, 50, None),
    ))


def test_trt_spelling_parses_ms_null_end_and_decode():
    retention, scope = parse({"kv_cache_retention_config": {
        "token_range_retention_configs": [
            {"token_start": 0, "token_end": 100, "priority": 80, "duration_ms": 30000},
            {"token_start": 100, "token_end": None, "priority": 10, "duration_ms": None},
        ],
        "decode_retention_priority": 90, "decode_duration_ms": 5000,
    }})
    assert scope is None
    assert retention.ranges == (RetentionRange(0, 100, 80, 30.0), RetentionRange(100, None, 10, None))
    assert (retention.decode_priority, retention.decode_duration_s) == (90, 5.0)


def test_vllm_xargs_carry_the_structures_as_json_text():
    directives = [{"start": 0, "end": 64, "priority": 90, "duration": 60}]
    assert parse({"retention_directives": json.dumps(directives)})[0] == parse({"retention_directives": directives})[0]
    assert parse_retention({}, MetadataError) is None


@pytest.mark.parametrize("args, field", [
    ({"retention_directives": {"start": 0}}, "retention_directives"),
    ({"retention_directives": [{"start": 0, "end": 10, "priority": 101}]}, "retention_directives[0].priority"),
    ({"retention_directives": [{"start": 0, "end": 10, "priority": True}]}, "retention_directives[0].priority"),
    ({"retention_directives": [{"start": 0, "end": 10, "priority": "90"}]}, "retention_directives[0].priority"),
    ({"retention_directives": [{"start": 10, "end": 10, "priority": 90}]}, "retention_directives[0].end"),
    ({"retention_directives": [{"start": -1, "end": 10, "priority": 90}]}, "retention_directives[0].start"),
    ({"retention_directives": [{"start": 0, "priority": 90}]}, "retention_directives[0].end"),
    ({"retention_directives": [{"start": 0, "end": 9, "priority": 90, "duration": -1}]},
     "retention_directives[0].duration"),
    ({"retention_directives": [{"start": 0, "end": 9, "priority": 90, "duration": float("inf")}]},
     "retention_directives[0].duration"),
    ({"retention_directives": [{"start": 0, "end": 9, "priority": 90, "ttl": 3}]}, "retention_directives[0].ttl"),
    ({"retention_directives": "not json"}, "retention_directives"),
    ({"retention_directives": "x" * 70000}, "retention_directives"),
    ({"retention_scope": ""}, "retention_scope"),
    ({"retention_scope": [7]}, "retention_scope"),
    ({"retention_scope": "a\nb"}, "retention_scope"),
    ({"kv_cache_retention_config": {"token_range_retention_configs": [
        {"token_start": 0, "token_end": 5, "priority": 50, "duration_ms": 10**13}]}},
     "kv_cache_retention_config.token_range_retention_configs[0].duration_ms"),
    ({"kv_cache_retention_config": {"decode_retention_priority": -3}},
     "kv_cache_retention_config.decode_retention_priority"),
    ({"retention_directives": [], "kv_cache_retention_config": {}}, "kv_cache_retention_config"),
])
def test_malformed_directives_are_refused_naming_the_field(args, field):
    with pytest.raises(MetadataError) as e:
        parse(args)
    assert e.value.field == field
    assert len(str(e.value)) < 400  # a huge value is never quoted whole


def test_ten_thousand_ranges_are_refused_not_parsed():
    ranges = [{"start": i, "end": i + 1, "priority": 100, "duration": 86400} for i in range(10_000)]
    with pytest.raises(MetadataError, match=f"at most {MAX_RETENTION_RANGES} ranges"):
        parse({"retention_directives": ranges})


def test_retention_scope_names_the_job_only_when_nothing_else_does():
    directives = [{"start": 0, "end": 32, "priority": 90}]
    assert parse_metadata({"retention_directives": directives, "retention_scope": "s"}).job_id == "s"
    assert parse_metadata({"retention_scope": "s", "job_id": "j"}).job_id == "j"
    assert parse_metadata({"retention_scope": "s"}, session_id="h").job_id == "h"
    assert parse_metadata({"retention_directives": directives}).retention.ranges[0].priority == 90


# -- the plan ---------------------------------------------------------------
def pr(*ranges):
    return Retention(tuple(RetentionRange(*r) for r in ranges))


def test_plan_keeps_the_prefix_stage_by_stage():
    # The PR's ContinuumPolicy: system prompt 90 for 600 s, history 70 for
    # 30 s, tail 50 for 30 s, on a 200-token prompt (12 full blocks of 16).
    retention = pr((0, 64, 90, 600.0), (64, 180, 70, 30.0), (180, 200, 50, 30.0))
    plan = retention.plan(200, 204, BS, max_hold_s=900.0)
    # Blocks 0-3 (the system prompt) for 600 s; up to block 12 (204 // 16)
    # for 30 s: the tail range covers the partial block, the decode tokens'
    # full block (192-207 is not full) is not there.
    assert plan.stages == ((30.0, 12), (600.0, 4))
    assert plan.keep_blocks == 12 and plan.evict_from is None and plan.declared_after_s == 0.0


def test_plan_clamps_every_hold_to_the_setting():
    plan = pr((0, 64, 100, 7 * 86400.0), (64, 128, 90, None)).plan(128, 130, BS, max_hold_s=600.0)
    assert plan.stages == ((600.0, 8),)


def test_a_block_is_worth_its_least_valued_predecessor():
    # History kept, but the system prompt before it at the default: the
    # policy's to decide -- here it holds nothing, so nothing is kept.
    retention = pr((64, 160, 90, 60.0))
    assert retention.plan(160, 160, BS, 600.0).keep_blocks == 0
    # With the policy holding the turn for 20 s, the uncovered prefix holds
    # 20 s and the history no longer than its prefix.
    assert retention.plan(160, 160, BS, 600.0, policy_ttl_s=20.0).stages == ((20.0, 10),)


def test_low_priority_goes_first_and_ends_the_kept_prefix():
    retention = pr((0, 64, 90, 60.0), (64, 96, 10, None), (96, 160, 90, 60.0))
    plan = retention.plan(160, 160, BS, 600.0)
    assert plan.stages == ((60.0, 4),) and plan.evict_from == 4
    assert pr((0, 160, 0, None)).plan(160, 160, BS, 600.0).evict_from == 0


def test_uncovered_blocks_follow_the_policy_and_the_declared_part_is_marked():
    # Only the system prompt is declared (90, 300 s); the policy holds the
    # whole turn 30 s: everything 30 s, the system prompt to 300 s, on the
    # client's word alone after the policy's 30.
    plan = pr((0, 64, 90, 300.0)).plan(160, 165, BS, 600.0, policy_ttl_s=30.0)
    assert plan.stages == ((30.0, 10), (300.0, 4))
    assert plan.declared_after_s == 30.0


def test_default_priority_is_the_policys_and_decode_priority_covers_the_reply():
    assert pr((0, 160, DEFAULT_PRIORITY, 60.0)).plan(160, 160, BS, 600.0).keep_blocks == 0
    retention = Retention((RetentionRange(0, None, 90, 60.0),), decode_priority=90, decode_duration_s=10.0)
    # Prompt 100 tokens (to block 7's end), reply to 130: 8 full blocks.
    assert retention.plan(100, 130, BS, 600.0).stages == ((10.0, 8), (60.0, 7))


def test_plan_of_an_empty_or_sub_block_request_keeps_nothing():
    assert pr((0, 10, 90, 60.0)).plan(10, 12, BS, 600.0).stages == ()
