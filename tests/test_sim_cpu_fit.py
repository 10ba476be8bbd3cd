"""Pure parts of the CPU fit and the live-vs-simulated validation (no engine)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from benchmarks.sim.batch import BatchShape, PrefillChunk
from benchmarks.sim.cpu_fit import (
    LIVE_LIMITS,
    EngineLimits,
    batch_from_scheduler_output,
    cpu_profile,
    decode_plan,
    fit_report,
    median_samples,
    model_arch_from_dir,
    prefill_plan,
)
from benchmarks.sim.jobs import jobs_from_workload
from benchmarks.sim.step_model import CpuStepModel
from benchmarks.sim.validate import (ScaledStepModel, calibrated_jobs, compare, live_step_factor, overhead_adjusted,
                                     ranking, request_steps)
from benchmarks.workload import Job, Turn

SMOLLM_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536, "head_dim": 64,
    "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3, "vocab_size": 49152,
    "max_position_embeddings": 8192, "model_type": "llama", "tie_word_embeddings": True,
}


@pytest.fixture
def model_dir(tmp_path):
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(SMOLLM_CONFIG))
    return str(path)


def test_model_arch_from_config(model_dir):
    arch = model_arch_from_dir(model_dir, "float32")
    assert (arch.num_layers, arch.num_kv_heads, arch.head_dim, arch.dtype_bytes) == (30, 3, 64, 4)
    # 2 (K, V) x 30 layers x 3 heads x 64 dims x 4 bytes, as the A/B runner's default
    assert arch.kv_bytes_per_token() == 2 * 30 * 3 * 64 * 4


@pytest.mark.parametrize("blocks", [1, 64, 160, 1000])
def test_cpu_profile_has_exactly_the_live_pool(model_dir, blocks):
    limits = EngineLimits(num_blocks=blocks)
    profile = cpu_profile(model_dir, limits)
    assert profile.num_gpu_blocks() == blocks
    assert profile.block_size == 32 and profile.max_num_seqs == 16
    assert profile.max_num_batched_tokens == 2048 and profile.max_model_len == 4096


def test_live_limits_match_the_ab_runner_defaults():
    from benchmarks.ab_benchmark import build_parser

    args = build_parser().parse_args([])
    assert (args.block_size, args.num_blocks, args.max_num_seqs, args.max_model_len) == (
        LIVE_LIMITS.block_size, LIVE_LIMITS.num_blocks, LIVE_LIMITS.max_num_seqs, LIVE_LIMITS.max_model_len)


def test_plans_fit_the_engine_limits():
    for n, cached in prefill_plan(32, 2048):
        assert 1 <= n <= 2048 and cached % 32 == 0 and cached + n < 4096
    for b, ctx in decode_plan():
        assert 1 <= b <= 16 and ctx < 4096


def test_batch_from_scheduler_output():
    out = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="a", num_computed_tokens=64)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=["b", "c"], num_computed_tokens=[100, 200]),
        num_scheduled_tokens={"a": 30, "b": 1, "c": 50},
    )
    shape = batch_from_scheduler_output(out)
    assert shape == BatchShape((PrefillChunk(30, 64), PrefillChunk(50, 200)), (100,))


def test_median_samples_groups_by_shape():
    a, b = BatchShape((PrefillChunk(10, 0),)), BatchShape((), (5, 5))
    got = median_samples([(a, 1.0), (b, 2.0), (a, 3.0), (a, 2.0)])
    assert got == [(a, 2.0, 3), (b, 2.0, 1)]


def test_fit_recovers_a_known_model_and_reports_zero_residuals():
    truth = CpuStepModel(c0=0.01, c_tok=2e-4, c_attn=1e-8, c_dec=1e-3, c_kv=2e-6)
    shapes = [BatchShape((PrefillChunk(n, c),)) for n, c in prefill_plan(32, 2048)]
    shapes += [BatchShape((), (ctx,) * b) for b, ctx in decode_plan()]
    samples = [(s, truth.step_seconds(s)) for s in shapes]
    model = CpuStepModel.fit(samples)
    for s, t in samples:
        assert model.step_seconds(s) == pytest.approx(t, rel=1e-6)
    report = fit_report(model, samples)
    assert report["all"]["max_abs_rel"] < 1e-6
    assert report["prefill"]["n"] + report["decode"]["n"] == len(samples)


def _job(job_id="job-0000"):
    return Job(job_id, 1.5, 120, (
        Turn(0, 200, 10, "ls", "ls -la", 0.1),
        Turn(1, 50, 12, "cat", "cat main.py", 0.2),
        Turn(2, 300, 8, "", "", 0.0),
    ))


def test_calibrated_jobs_reproduce_live_prompt_lengths():
    job = _job()
    # Live: turn-0 prompt 360 (system prefix 140 + 220), then the template
    # adds tokens around each reply and tool output.
    live = {"job-0000": [(360, 10), (430, 12), (760, 8)]}
    (cal,) = calibrated_jobs([job], live, system_prefix=140)
    assert [cal.prompt_tokens(k) for k in range(3)] == [360, 430, 760]
    assert [t.output_tokens for t in cal.turns] == [10, 12, 8]
    assert [t.tool_seconds for t in cal.turns] == [0.1, 0.2, 0.0]
    (sim,) = jobs_from_workload([cal], shared_system=True)
    assert [t.prompt_tokens for t in sim.turns] == [360, 430, 760]


def test_calibrated_jobs_keep_jobs_without_records():
    job = _job()
    assert calibrated_jobs([job], {}, 140) == [job]


def test_overhead_adjusted_lengthens_every_gap_but_the_first():
    (sim,) = jobs_from_workload([_job()])
    (adj,) = overhead_adjusted([sim], 0.05)
    assert adj.turns[0].think_s == sim.turns[0].think_s == 0.0
    assert [a.think_s - s.think_s for a, s in zip(adj.turns[1:], sim.turns[1:])] == pytest.approx([0.05, 0.05])
    assert adj.arrival_s == sim.arrival_s


def test_compare_and_ranking():
    live = {"fcfs": {"jct_mean": 10.0, "jct_p90": 20.0, "hit_share": 0.40},
            "continuum": {"jct_mean": 6.0, "jct_p90": 9.0, "hit_share": 0.70}}
    sim = {"fcfs": {"jct_mean": 11.0, "jct_p90": 18.0, "hit_share": 0.45},
           "continuum": {"jct_mean": 8.0, "jct_p90": 9.0, "hit_share": 0.58}}
    assert ranking({"a": 2.0, "b": 1.0}) == ["b", "a"]
    got = compare(live, sim)
    assert got["rank_ok"] and got["live_rank"] == ["continuum", "fcfs"]
    assert got["rows"]["fcfs"]["jct_ok"] and got["rows"]["fcfs"]["hit_ok"]
    assert got["rows"]["continuum"]["jct_rel"] == pytest.approx(1 / 3)
    assert not got["rows"]["continuum"]["jct_ok"]
    assert got["rows"]["continuum"]["hit_points"] == pytest.approx(-12.0)
    assert not got["rows"]["continuum"]["hit_ok"]


def test_request_steps_are_the_idle_engines_steps() -> None:
    steps = request_steps(prompt=3000, cached=160, output=4, chunk=2048)
    assert steps == [
        BatchShape((PrefillChunk(2048, 160),), ()),
        BatchShape((PrefillChunk(792, 2208),), ()),
        BatchShape((), (3000,)), BatchShape((), (3001,)), BatchShape((), (3002,)),
    ]


def test_live_step_factor_is_measured_over_predicted() -> None:
    model = CpuStepModel(c0=0.05, c_tok=0.001, c_attn=0.0, c_dec=0.0, c_kv=0.0)
    # Two requests: 100 new tokens then 2 decodes -> 0.15 + 0.05 + 0.05 = 0.25 s each.
    probe = {"engine_e2e_s": 0.30, "shapes": [[130, 30, 3], [130, 30, 3]]}
    factor = live_step_factor(model, probe, chunk=2048)
    assert factor == pytest.approx(1.2)
    assert ScaledStepModel(model, factor).step_seconds(BatchShape((), (10,))) == pytest.approx(0.06)
    assert live_step_factor(model, {"engine_e2e_s": 0.3}, chunk=2048) is None  # older records: no shapes
    with pytest.raises(ValueError, match="step factor"):
        ScaledStepModel(model, 0.0)
