"""benchmarks.aiperf_traces (trace scaling), benchmarks.aiperf_results (AIPerf
records -> JCT) and benchmarks.aiperf_replay (commands, and one small live arm:
AIPerf against a real ``vllm serve``)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from vllm_continuum_plugin.benchmarks import aiperf_command as ac
from vllm_continuum_plugin.benchmarks import aiperf_replay as ar
from vllm_continuum_plugin.benchmarks import aiperf_results, aiperf_traces

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Fields AIPerf 0.13.0's weka-trace schema accepts (its pydantic models
# forbid any other: aiperf/dataset/loader/weka_trace_models.py).
WEKA_TRACE_FIELDS = {"id", "models", "block_size", "hash_id_scope", "tool_tokens", "system_tokens",
                     "requests", "totals"}
WEKA_REQUEST_FIELDS = {"t", "type", "model", "in", "out", "hash_ids", "input_types", "output_types",
                       "stop", "api_time", "think_time"}
WEKA_REQUIRED_REQUEST = {"t", "type", "model", "in", "out"}


def req(t, n_blocks, extra_tokens, out, think, first=1, model="claude-opus", api=2.0, **kw):
    return {"t": t, "type": "n", "model": model, "in": n_blocks * 64 + extra_tokens, "out": out,
            "hash_ids": list(range(first, first + n_blocks)), "input_types": ["text"],
            "output_types": ["text", "tool_use"], "stop": "tool_use", "api_time": api, "think_time": think, **kw}


def trace(requests, tool=1000, system=200, tid="trace_9001"):
    return {"id": tid, "models": ["claude-opus"], "block_size": 64, "hash_id_scope": "local",
            "tool_tokens": tool, "system_tokens": system, "requests": requests}


# ----------------------------------------------------------------------
# Scaling
# ----------------------------------------------------------------------
def test_merge_divides_prompt_tokens_and_keeps_shared_prefix():
    tr = trace([req(0.0, 20, 10, 100, 0.0), req(10.0, 24, 30, 50, 7.0)])
    s = aiperf_traces.scale_session(tr, turns=10, merge=4, max_out=1000, max_think=100)
    r0, r1 = s["requests"]
    # 20 blocks -> 5 merged blocks; tail 10 tokens -> 10 // 4 = 2.
    assert r0["hash_ids"] == [1, 2, 3, 4, 5] and r0["in"] == 5 * 64 + 2
    # The first 5 runs of 4 ids are the same: same merged ids, one new.
    assert r1["hash_ids"] == [1, 2, 3, 4, 5, 6] and r1["in"] == 6 * 64 + 7
    assert r0["out"] == 25 and r1["out"] == 13  # ceil(out / 4)
    assert s["block_size"] == 64 and s["hash_id_scope"] == "local"


def test_changed_block_inside_a_run_gets_a_new_merged_id():
    tr = trace([req(0.0, 20, 0, 10, 0.0), req(5.0, 20, 0, 10, 1.0)])
    tr["requests"][1]["hash_ids"][17] = 999  # run 4 (ids 17..20) differs
    s = aiperf_traces.scale_session(tr, turns=2, merge=4, max_out=8, max_think=5)
    assert s["requests"][0]["hash_ids"] == [1, 2, 3, 4, 5]
    assert s["requests"][1]["hash_ids"] == [1, 2, 3, 4, 6]
    # Every turn keeps at least one fresh tail token (a user message).
    assert s["requests"][0]["in"] == 5 * 64 + 1


def test_leftover_blocks_fold_into_the_tail():
    # 22 blocks with merge 8: 2 merged blocks, 6 leftover blocks + 5 tokens.
    s = aiperf_traces.scale_session(trace([req(0.0, 22, 5, 10, 0.0)], tool=0, system=0), turns=1, merge=8,
                         max_out=8, max_think=5)
    r = s["requests"][0]
    assert len(r["hash_ids"]) == 2
    assert r["in"] == 2 * 64 + (6 * 64 + 5) // 8


def test_turns_main_only_out_and_think_caps():
    sub = {"t": 3.0, "type": "subagent", "agent_id": "a1", "subagent_type": "Explore", "status": "completed",
           "requests": [req(3.0, 5, 0, 10, 0.0)], "models": ["claude-haiku"]}
    tr = trace([
        req(0.0, 16, 3, 0, None),
        sub,
        req(1.0, 4, 0, 10, 0.0, first=500, model="claude-haiku"),  # side call, another model
        req(20.0, 17, 3, 500, 40.0),
        req(70.0, 18, 3, 7, 3.0),
        req(90.0, 19, 3, 7, 2.0),
    ], tool=0, system=0)
    s = aiperf_traces.scale_session(tr, turns=3, merge=2, max_out=32, max_think=10, think_scale=0.5)
    reqs = s["requests"]
    assert len(reqs) == 3 and all(r["type"] == "n" and r["model"] == "claude-opus" for r in reqs)
    assert [r["out"] for r in reqs] == [1, 32, 4]  # 0 -> 1; 500 / 2 capped at 32; ceil(7 / 2)
    assert [r["think_time"] for r in reqs] == [0.0, 10.0, 1.5]  # min(10, 40 * 0.5); 3 * 0.5
    # t rebuilt from think times: previous t + previous api_time (2 s) + think.
    assert [r["t"] for r in reqs] == [0.0, 12.0, 15.5]


def test_missing_think_time_uses_idle_gap():
    tr = trace([req(0.0, 4, 0, 10, 0.0, api=3.0), req(10.0, 5, 0, 10, None)], tool=0, system=0)
    s = aiperf_traces.scale_session(tr, turns=2, merge=1, max_out=10, max_think=100)
    assert s["requests"][1]["think_time"] == 7.0  # 10 - 0 - 3


def test_scaled_session_fits_aiperf_schema_and_is_pure():
    tr = trace([req(0.0, 240, 40, 300, 0.0), req(9.0, 250, 3, 99, 3.0)], tool=12448, system=2882)
    before = copy.deepcopy(tr)
    s = aiperf_traces.scale_session(tr, turns=6, merge=16, max_out=32, max_think=5)
    assert tr == before
    assert s == aiperf_traces.scale_session(tr, turns=6, merge=16, max_out=32, max_think=5)
    assert set(s) <= WEKA_TRACE_FIELDS
    for r in s["requests"]:
        assert WEKA_REQUIRED_REQUEST <= set(r) <= WEKA_REQUEST_FIELDS
        # AIPerf's reconstructor: hash ids tile floor(in / 64) blocks.
        assert len(r["hash_ids"]) == r["in"] // 64
    # Tool + system prefix divided by M and within the first prompt's blocks
    # (AIPerf refuses a trace whose system prefix needs more hash blocks).
    assert s["tool_tokens"] == 12448 // 16 and s["system_tokens"] == 2882 // 16
    assert -(-(s["tool_tokens"] + s["system_tokens"]) // 64) <= len(s["requests"][0]["hash_ids"])
    json.dumps(s)


def test_system_prefix_clamped_to_first_prompt():
    s = aiperf_traces.scale_session(trace([req(0.0, 3, 0, 10, 0.0)], tool=5000, system=5000), turns=1, merge=1,
                         max_out=8, max_think=1)
    assert s["tool_tokens"] + s["system_tokens"] <= 3 * 64


def test_merge_one_keeps_the_recording():
    tr = trace([req(0.0, 10, 17, 40, 0.0), req(5.0, 12, 1, 30, 2.0)])
    s = aiperf_traces.scale_session(tr, turns=2, merge=1, max_out=1000, max_think=100)
    for orig, new in zip(tr["requests"], s["requests"]):
        assert (new["in"], new["out"], new["hash_ids"]) == (orig["in"], orig["out"], orig["hash_ids"])


def test_scale_rejects_empty_and_bad_arguments():
    with pytest.raises(ValueError):
        aiperf_traces.scale_session(trace([]), turns=2, merge=2, max_out=8, max_think=1)
    with pytest.raises(ValueError):
        aiperf_traces.scale_session(trace([req(0.0, 4, 0, 10, 0.0)]), turns=2, merge=0, max_out=8, max_think=1)


def test_select_sessions_skips_bad_short_and_large(tmp_path):
    (tmp_path / "trace_0001.json").write_text("{not json")
    (tmp_path / "trace_0002.json").write_text(json.dumps(trace([req(0.0, 4, 0, 10, 0.0)], tid="trace_0002")))
    (tmp_path / "trace_0003.json").write_text(json.dumps(
        trace([req(0.0, 900, 0, 10, 0.0), req(1.0, 901, 0, 10, 1.0)], tid="trace_0003")))
    for i in (4, 5, 6):
        (tmp_path / f"trace_000{i}.json").write_text(json.dumps(
            trace([req(0.0, 40, 0, 10, 0.0), req(1.0, 41, 0, 10, 1.0)], tid=f"trace_000{i}")))
    got = aiperf_traces.select_sessions(str(tmp_path), sessions=2, turns=4, min_turns=2, max_input=30000)
    assert [t["id"] for _, t in got] == ["trace_0004", "trace_0005"]
    named = aiperf_traces.select_sessions(str(tmp_path), sessions=2, turns=4, ids=["trace_0003", "trace_0006"])
    assert [t["id"] for _, t in named] == ["trace_0003", "trace_0006"]


# ----------------------------------------------------------------------
# AIPerf records -> per-request figures and per-session JCT
# ----------------------------------------------------------------------
T0 = 1_795_676_341_525_311_805


def record(conv, corr, turn, start_s, end_s, ttft_ms, prompt, cached, error=None):
    """One line of AIPerf 0.13.0's profile_export.jsonl (the shape of a real
    run's records, trimmed to a subset of its metrics)."""
    start, end = T0 + int(start_s * 1e9), T0 + int(end_s * 1e9)
    metrics = {
        "usage_prompt_tokens": {"value": prompt, "unit": "tokens"},
        "usage_completion_tokens": {"value": 8, "unit": "tokens"},
        "usage_prompt_cache_read_tokens": {"value": cached, "unit": "tokens"},
        "input_sequence_length": {"value": prompt, "unit": "tokens"},
        "output_sequence_length": {"value": 8, "unit": "tokens"},
        "request_latency": {"value": (end - start) / 1e6, "unit": "ms"},
        "time_to_first_token": {"value": ttft_ms, "unit": "ms"},
        "time_to_second_token": {"value": 120.5, "unit": "ms"},
        "inter_token_latency": {"value": 130.1, "unit": "ms"},
        "inter_chunk_latency": {"value": [ttft_ms, 120.5, 130.0], "unit": "ms"},
        "http_req_duration": {"value": (end - start) / 1e6, "unit": "ms"},
    }
    if error:
        metrics = {"request_latency": {"value": (end - start) / 1e6, "unit": "ms"}}
    return {
        "metadata": {
            "session_num": 0, "x_request_id": f"req-{conv}-{turn}", "x_correlation_id": corr,
            "conversation_id": conv, "turn_index": turn, "source_trace_id": conv.split("::")[0],
            "source_outer_idx": turn, "source_kind": "weka_main", "credit_issued_ns": start - 1000,
            "request_start_ns": start, "request_ack_ns": start + 100_000, "request_end_ns": end,
            "worker_id": "worker_1", "record_processor_id": "record_processor_1",
            "benchmark_phase": "profiling", "phase_index": 0, "profiling_index": turn,
            "phase_name": "profiling", "phase_kind": "profiling", "was_cancelled": False,
            "context_overflow_skip": False, "agent_depth": 0, "root_correlation_id": corr,
        },
        "metrics": metrics,
        "error": error,
    }


RECORDS = [
    record("trace_0002", "c-a", 0, 0.0, 13.4, 7578.8, 1001, 0),
    record("trace_0003", "c-b", 0, 0.01, 13.5, 12906.0, 1049, 0),
    record("trace_0002", "c-a", 1, 14.4, 19.4, 528.5, 1013, 960),
    record("trace_0003", "c-b", 1, 14.5, 19.6, 4296.1, 1302, 1024),
    record("trace_0003::sa:agent_1", "c-c", 0, 15.0, 25.0, 100.0, 200, 0),
    record("trace_0002", "c-a", 2, 20.4, 22.0, None, 0, 0,
           error={"code": 500, "type": "InternalServerError", "message": "boom"}),
]


def test_records_roundtrip_through_jsonl(tmp_path):
    path = tmp_path / "profile_export.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS) + "\n")
    assert aiperf_results.read_records(str(path)) == RECORDS


def test_summarize_existing_run(tmp_path, capsys):
    arm = tmp_path / "continuum"
    arm.mkdir()
    (arm / "profile_export.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    assert ar.main(["--summarize", str(arm)]) == 0
    line = capsys.readouterr().out.strip()
    assert "sessions=2 requests=6 failed=1" in line
    assert "prefix-cache hits=43.5%" in line  # 1984 cached of 4565 prompt tokens


def test_request_rows():
    rows = aiperf_results.request_rows(RECORDS)
    assert rows[0]["session"] == "trace_0002" and rows[0]["turn_index"] == 0
    assert rows[0]["ttft_s"] == pytest.approx(7.5788)
    assert rows[0]["latency_s"] == pytest.approx(13.4, abs=1e-6)
    assert (rows[2]["prompt_tokens"], rows[2]["cached_tokens"]) == (1013, 960)
    assert rows[4]["session"] == "trace_0003"  # sub-agent child -> its root session
    assert rows[5]["ok"] is False and rows[5]["ttft_s"] is None


def test_jct_by_session():
    stats = aiperf_results.jct_by_session(RECORDS)
    assert set(stats) == {"trace_0002", "trace_0003"}
    a, b = stats["trace_0002"], stats["trace_0003"]
    assert a.jct_s == pytest.approx(22.0, abs=1e-6)  # first start 0.0 -> last end 22.0 (the failed turn)
    assert (a.requests, a.failed) == (3, 1)
    assert b.jct_s == pytest.approx(25.0 - 0.01, abs=1e-6)  # the child ends last
    assert b.requests == 3 and b.failed == 0
    assert a.ttft_s == pytest.approx([7.5788, 0.5285])


def test_session_key_falls_back_to_correlation_id():
    rec = record("x", "corr-1", 0, 0, 1, 10.0, 10, 0)
    rec["metadata"]["conversation_id"] = None
    assert aiperf_results.session_key(rec) == "corr-1"


def test_summarize_arm_and_summary_line():
    s = aiperf_results.summarize_arm("continuum", RECORDS, hit_share=0.455)
    assert (s["sessions"], s["requests"], s["failed"]) == (2, 6, 1)
    assert s["jct_s"]["count"] == 2
    assert s["jct_s"]["mean"] == pytest.approx((22.0 + 24.99) / 2, abs=1e-6)
    assert s["ttft_s"]["count"] == 5
    assert s["cached_token_share"] == pytest.approx(1984 / (1001 + 1049 + 1013 + 1302 + 200))
    line = aiperf_results.format_summary(s)
    assert line.startswith("continuum") and "sessions=2" in line and "failed=1" in line
    assert "JCT mean=23.49s" in line and "prefix-cache hits=45.5%" in line


def test_cache_hit_share_from_metric_deltas():
    before = {'vllm:prefix_cache_hits_total{engine="0",model_name="m"}': 100.0,
              'vllm:prefix_cache_queries_total{engine="0",model_name="m"}': 1000.0}
    after = {'vllm:prefix_cache_hits_total{engine="0",model_name="m"}': 600.0,
             'vllm:prefix_cache_queries_total{engine="0",model_name="m"}': 3000.0}
    assert aiperf_results.cache_hit_share(before, after) == pytest.approx(0.25)
    assert aiperf_results.cache_hit_share(before, before) is None


# ----------------------------------------------------------------------
# Commands
# ----------------------------------------------------------------------
def test_aiperf_command_flags():
    cmd = ac.aiperf_command("aiperf", url="http://127.0.0.1:1", model="m", tokenizer="/tok", traces="/tr",
                            sessions=3, out_dir="/out")
    text = " ".join(cmd)
    for flag in ("--custom-dataset-type weka_trace", "--input-file /tr", "--session-header X-Session-ID",
                 "--no-fixed-schedule", "--use-think-time-only", "--concurrency 3", "--conversation-num 3",
                 "--extra-inputs ignore_eos:true", "--streaming", "--tokenizer /tok",
                 "--output-artifact-dir /out"):
        assert flag in text
    gpu = ac.gpu_command("/data/traces", 5)
    assert "--input-file /data/traces" in gpu and "--concurrency 5 --conversation-num 5" in gpu
    assert "--request-rate" not in cmd  # AIPerf's concurrency mode unless a clock is asked for


def test_aiperf_is_paced_by_a_clock_so_its_loop_leaves_the_servers_core_alone():
    """By default the runner has AIPerf issue due turns on a 50-per-second
    constant clock: its concurrency mode polls in a loop that keeps a core
    busy (one of the two the server has here). ``--request-rate 0`` is that
    mode; a run records its pacing, and runs paced differently are not one
    run (their arms would not compare)."""
    args = ar.build_parser().parse_args([])
    assert ar.request_rate(args) == ar.DEFAULT_REQUEST_RATE == 50.0
    cmd = ac.aiperf_command("aiperf", url="u", model="m", tokenizer="t", traces="tr", sessions=24, out_dir="o",
                            request_rate=ar.request_rate(args))
    text = " ".join(cmd)
    assert "--request-rate 50 --arrival-pattern constant" in text and "--concurrency 24" in text
    assert ar.request_rate(ar.build_parser().parse_args(["--request-rate", "0"])) is None
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(ValueError, match="--request-rate"):
            ar.request_rate(ar.build_parser().parse_args(["--request-rate", bad]))
    with pytest.raises(ValueError, match="request_rate"):
        ac.aiperf_command("aiperf", url="u", model="m", tokenizer="t", traces="tr", sessions=2, out_dir="o",
                          request_rate=0.0)
    assert "aiperf_request_rate" in ar._SAME_RUN_KEYS


def test_arms_name_the_policy_settings_pool_and_session_header():
    from vllm_continuum_plugin.benchmarks.aiperf_arms import parse_live_arms

    arms = parse_live_arms("fcfs, continuum-paper,oracle,continuum-no-header,context_serve-claude-header")
    assert [a.name for a in arms] == ["fcfs", "continuum-paper", "oracle", "continuum-no-header",
                                      "context_serve-claude-header"]
    fcfs, paper, oracle, no_header, claude = arms
    assert paper.policy == "continuum" and paper.continuum == {"ttl_policy": "cdf", "admission": False}
    assert oracle.policy == "fcfs" and oracle.unbounded_pool
    assert no_header.session_header is None and claude.session_header == "X-Claude-Code-Session-Id"
    # No session id at all: AIPerf's own X-Session-Affinity (a plugin
    # session header) is turned off; the affinity arm keeps it, no flag.
    (affinity,) = parse_live_arms("continuum-affinity")
    assert not no_header.affinity_header and affinity.affinity_header and affinity.session_header is None
    assert all(a.affinity_header for a in (fcfs, paper, oracle, claude))
    assert (no_header.session_source, affinity.session_source) == ("none", "X-Session-Affinity (AIPerf's default)")
    with pytest.raises(ValueError, match="'continum'"):
        parse_live_arms("fcfs,continum")
    # The server and AIPerf command each arm gets.
    args = ar.build_parser().parse_args(["--continuum-config", '{"default_ttl_s": 7}', "--dtype", "float32"])
    plan = ar.Plan([], [], num_blocks=100, max_model_len=1024, oracle_blocks=900)
    paper_args = ar.server_args(args, paper, plan)
    settings = json.loads(paper_args[paper_args.index("--additional-config") + 1])["continuum"]
    assert settings == {"default_ttl_s": 7, "ttl_policy": "cdf", "admission": False}
    assert "--additional-config" not in ar.server_args(args, fcfs, plan)
    oracle_args = ar.server_args(args, oracle, plan)
    assert oracle_args[oracle_args.index("--num-gpu-blocks-override") + 1] == "900"
    cmd = ac.aiperf_command("aiperf", url="u", model="m", tokenizer="t", traces="tr", sessions=2, out_dir="o",
                            session_header=None)
    assert "--session-header" not in cmd


def test_native_offload_arms_run_vllms_offloading_connector_with_a_tier_of_the_working_sets_share():
    """Stock and the plugin over vLLM's own CPU offloading: the same pool as
    every arm, plus a host tier of ``--host-tier`` times the sessions' peak
    working set (the oracle's pool), in bytes of the served dtype."""
    from vllm_continuum_plugin.benchmarks.aiperf_arms import parse_live_arms

    stock, ours, fcfs = parse_live_arms("native-offload,continuum-native-offload,fcfs")
    assert (stock.policy, ours.policy) == ("fcfs", "continuum") and stock.native_offload and ours.native_offload
    assert not fcfs.native_offload
    args = ar.build_parser().parse_args(["--dtype", "float32", "--host-tier", "0.5"])
    plan = ar.Plan([], [], num_blocks=100, max_model_len=1024, oracle_blocks=900)
    assert ar.host_tier_blocks(args, plan) == 450
    for arm in (stock, ours):
        argv = ar.server_args(args, arm, plan)
        assert argv[argv.index("--num-gpu-blocks-override") + 1] == "100"
        assert argv[argv.index("--kv-offloading-backend") + 1] == "native"
        tier_gib = float(argv[argv.index("--kv-offloading-size") + 1])
        # 450 blocks x 32 tokens x (2 x 30 layers x 3 heads x 64 dims x 4 bytes)
        assert tier_gib * 2**30 == pytest.approx(450 * 32 * 2 * 30 * 3 * 64 * 4, rel=1e-5)
    assert "--kv-offloading-size" not in ar.server_args(args, fcfs, plan)


@pytest.mark.parametrize("name,policy,mode", [("continuum-offload-explicit", "continuum", "explicit"),
                                               ("continuum-offload-victim", "continuum", "victim"),
                                               ("offload-victim", "fcfs", "victim")])
def test_the_plugin_connector_arms_run_its_store_mode_with_the_same_tier(name, policy, mode):
    """The plugin's connector arms: the scheduler and ``store_mode`` their
    name says, the store as large as the native arms' host tier."""
    import json

    from vllm_continuum_plugin.benchmarks.aiperf_arms import parse_live_arms

    (victim,) = parse_live_arms(name)
    assert victim.policy == policy and victim.host_tier and not victim.native_offload
    args = ar.build_parser().parse_args(["--dtype", "float32", "--host-tier", "0.5"])
    plan = ar.Plan([], [], num_blocks=100, max_model_len=1024, oracle_blocks=900)
    argv = ar.server_args(args, victim, plan)
    assert "--kv-offloading-size" not in argv
    assert argv[argv.index("--scheduling-policy") + 1] == policy
    config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert config["kv_connector"] == "ContinuumOffloadConnector"
    assert config["kv_connector_extra_config"]["store_mode"] == mode
    assert config["kv_connector_extra_config"]["cpu_bytes"] == 450 * 32 * 2 * 30 * 3 * 64 * 4


def test_aiperf_env_is_online_and_uncached(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    env = ac.aiperf_env()
    assert "HF_HUB_OFFLINE" not in env
    assert env["AIPERF_DATASET_MMAP_CACHE_ENABLED"] == "false"
    assert env["AIPERF_HTTP_X_SESSION_AFFINITY_FROM_CORRELATION_ID"] == "true"
    assert ac.aiperf_env(affinity_header=False)["AIPERF_HTTP_X_SESSION_AFFINITY_FROM_CORRELATION_ID"] == "false"


def test_server_keep_alive_outlasts_the_longest_think_time():
    """AIPerf reuses a session's keep-alive connection after its think time:
    with vLLM's 5 s default a 5 s think raced uvicorn's close and failed."""
    assert int(ar.server_env(5.0, 1.0)["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"]) > 5.0
    assert int(ar.server_env(60.0, 2.0)["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"]) > 120.0


def test_help_documents_scaling():
    out = subprocess.run([sys.executable, "-m", "benchmarks.aiperf_replay", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "DIVIDES PROMPT TOKENS BY M" in text and "--use-think-time-only" in text
    assert "On a GPU" in text


def test_dry_run_writes_scaled_traces(tmp_path):
    traces = tmp_path / "in"
    traces.mkdir()
    for i in (1, 2):
        (traces / f"trace_000{i}.json").write_text(json.dumps(
            trace([req(0.0, 40, 5, 100, 0.0), req(9.0, 44, 5, 100, 20.0)], tid=f"trace_000{i}")))
    out = tmp_path / "run"
    rc = ar.main(["--traces", str(traces), "--out", str(out), "--dry-run", "--merge", "4"])
    assert rc == 0
    written = sorted(os.listdir(out / "traces"))
    assert written == ["trace_0001.json", "trace_0002.json"]
    s = json.loads((out / "traces" / "trace_0001.json").read_text())
    assert s["requests"][0]["in"] == 10 * 64 + 1 and s["requests"][1]["think_time"] == 5.0
    assert sorted(os.listdir(out / "unscaled_traces")) == written


# ----------------------------------------------------------------------
# One small live arm
# ----------------------------------------------------------------------
AIPERF = os.path.join(ac.DEFAULT_AIPERF_VENV, "bin", "aiperf")


@pytest.mark.e2e
@pytest.mark.skipif(not os.path.exists(AIPERF), reason=f"AIPerf venv missing ({AIPERF})")
def test_live_arm_every_request_succeeds(tmp_path):
    if not os.path.isdir(ar.DEFAULT_MODEL_DIR):
        pytest.fail(f"embedded model missing at {ar.DEFAULT_MODEL_DIR}: run scripts/setup.sh")
    traces = tmp_path / "traces"
    traces.mkdir()
    # 2 sessions x 3 turns of short agent-like prompts (a shared 4-block
    # system prefix, growing by 1-2 blocks a turn), 1 s tool gaps.
    for i, first in ((1, 1), (2, 1)):
        reqs = [req(0.0, 6, 20, 8, 0.0, first=first), req(3.0, 7, 9, 8, 1.0, first=first),
                req(6.0, 9, 30, 8, 1.0, first=first)]
        (traces / f"trace_000{i}.json").write_text(json.dumps(trace(reqs, tool=200, system=56,
                                                                     tid=f"trace_000{i}")))
    out = tmp_path / "run"
    rc = ar.main(["--traces", str(traces), "--out", str(out), "--policies", "continuum", "--sessions", "2",
                  "--turns", "3", "--merge", "1", "--max-out", "8", "--max-think", "1"])
    results = json.loads((out / "results.json").read_text())
    arm = results["arms"][0]
    assert "error" not in arm, arm.get("error")
    assert rc == 0
    assert (arm["sessions"], arm["requests"], arm["failed"]) == (2, 6, 0)
    assert arm["incomplete_sessions"] == []
    assert all(s["jct_s"] > 0 for s in arm["per_session"].values())
    assert all(r["ttft_s"] is not None and r["ttft_s"] > 0 for r in arm["requests_detail"])
    # The second and third turns reuse the first's prefix (same server, 1 s gaps).
    assert arm["prefix_cache_hit_share"] is not None and arm["prefix_cache_hit_share"] > 0
