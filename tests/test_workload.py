"""Benchmark workloads: generation, presets, distributions and trace files."""

import dataclasses
import json
import math
import re

import numpy as np
import pytest

from vllm_continuum_plugin.benchmarks.workload import (
    PRESETS,
    Distribution,
    Fixed,
    Job,
    LogNormal,
    Mixture,
    ToolSpec,
    Turn,
    Uniform,
    WorkloadSpec,
    describe,
    generate_jobs,
    read_trace,
    write_trace,
)
from vllm_continuum_plugin.estimators.parser import tool_key_for_command


def without_arrivals(jobs):
    return [dataclasses.replace(j, arrival_s=0.0) for j in jobs]


def tool_times(jobs):
    return np.array([t.tool_seconds for j in jobs for t in j.turns[:-1]])


# ----------------------------------------------------------------------
# Determinism and independent streams
# ----------------------------------------------------------------------
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_same_seed_same_jobs_different_seed_different_jobs(preset):
    spec = PRESETS[preset](30, 0.5)
    a, b = generate_jobs(spec, 11), generate_jobs(spec, 11)
    assert a == b
    c = generate_jobs(spec, 12)
    assert [j.arrival_s for j in a] != [j.arrival_s for j in c]
    # Contents differ too (tool choice at least, even for the "fixed" preset).
    assert [[t.tool for t in j.turns] for j in a] != [[t.tool for t in j.turns] for j in c]


def test_changing_the_rate_changes_only_arrivals_and_rescales_time():
    slow = generate_jobs(PRESETS["heavy-tail"](40, 0.25), 3)
    fast = generate_jobs(PRESETS["heavy-tail"](40, 2.0), 3)
    assert without_arrivals(slow) == without_arrivals(fast)
    assert [j.arrival_s for j in slow] != [j.arrival_s for j in fast]
    # Same exponential gaps, scaled by the rate ratio.
    for s, f in zip(slow, fast):
        assert s.arrival_s == pytest.approx(f.arrival_s * 8.0, rel=1e-12)


def test_more_jobs_extend_the_run_without_changing_earlier_jobs():
    short = generate_jobs(PRESETS["cpu-small"](10, 1.0), 5)
    long = generate_jobs(PRESETS["cpu-small"](25, 1.0), 5)
    assert long[:10] == short


def test_tool_output_scale_changes_only_tool_output_tokens():
    base = generate_jobs(PRESETS["field-report"](20, 1.0), 9)
    doubled = generate_jobs(PRESETS["field-report"](20, 1.0, tool_output_scale=2.0), 9)
    for a, b in zip(base, doubled):
        assert a.arrival_s == b.arrival_s
        assert a.turns[0] == b.turns[0]  # task prompt untouched
        for ta, tb in zip(a.turns[1:], b.turns[1:]):
            assert tb.new_tokens == 2 * ta.new_tokens
            assert dataclasses.replace(tb, new_tokens=ta.new_tokens) == ta


def test_ids_are_in_arrival_order_and_arrivals_start_after_a_gap():
    jobs = generate_jobs(PRESETS["fixed"](50, 1.0), 0)
    assert [j.job_id for j in jobs] == [f"job-{i:04d}" for i in range(50)]
    arrivals = [j.arrival_s for j in jobs]
    assert arrivals == sorted(arrivals)
    assert arrivals[0] > 0.0  # documented: the first job arrives after its first gap


def test_arrivals_are_poisson_with_the_requested_rate():
    rate = 2.0
    jobs = generate_jobs(PRESETS["cpu-small"](2000, rate), 1)
    arrivals = np.array([j.arrival_s for j in jobs])
    gaps = np.diff(np.concatenate([[0.0], arrivals]))
    assert gaps.mean() == pytest.approx(1.0 / rate, rel=0.06)
    # Exponential gaps: coefficient of variation 1 (a regular grid would be
    # 0) and P(gap < mean) = 1 - 1/e.
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.08)
    assert np.mean(gaps < 1.0 / rate) == pytest.approx(1.0 - math.exp(-1.0), abs=0.03)


# ----------------------------------------------------------------------
# Distributions
# ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "distribution",
    [
        Fixed(1.5),
        Uniform(2.0, 5.0),
        LogNormal(0.2, 0.7),
        LogNormal(3.0, 0.6),
        Mixture([(0.97, LogNormal(0.2, 0.7)), (0.03, LogNormal(30.0, 0.5))]),
        Mixture([(3.0, Fixed(1.0)), (1.0, Uniform(0.0, 2.0))]),  # weights need not sum to 1
    ],
    ids=repr,
)
def test_sample_mean_matches_mean(distribution):
    assert isinstance(distribution, Distribution)
    rng = np.random.default_rng(123)
    samples = np.array([distribution.sample(rng) for _ in range(100_000)])
    assert (samples >= 0).all()
    assert samples.mean() == pytest.approx(distribution.mean(), rel=0.03)


def test_distribution_closed_forms():
    assert Uniform(2.0, 5.0).mean() == 3.5
    assert LogNormal(2.0, 0.5).mean() == pytest.approx(2.0 * math.exp(0.125))
    mixture = Mixture([(0.97, Fixed(1.0)), (0.03, Fixed(30.0))])
    assert mixture.mean() == pytest.approx(0.97 + 0.9)
    rng = np.random.default_rng(0)
    samples = np.array([mixture.sample(rng) for _ in range(50_000)])
    assert np.mean(samples == 30.0) == pytest.approx(0.03, abs=0.005)
    ln = LogNormal(0.4, 0.8)
    assert np.median([ln.sample(rng) for _ in range(50_000)]) == pytest.approx(0.4, rel=0.03)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Fixed(-1.0), "Fixed.seconds must be a finite number >= 0, got -1.0"),
        (lambda: Uniform(3.0, 2.0), "low=3.0, high=2.0"),
        (lambda: LogNormal(0.0, 0.5), "LogNormal.median must be a finite number > 0, got 0.0"),
        (lambda: Mixture([]), "at least one component"),
        (lambda: Mixture([(0.0, Fixed(1.0))]), r"components\[0\] weight must be a finite number > 0, got 0.0"),
        (lambda: Mixture([(1.0, 3.0)]), r"components\[0\] must hold a Distribution, got 3.0"),
    ],
)
def test_distribution_errors_name_the_bad_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# ----------------------------------------------------------------------
# Presets
# ----------------------------------------------------------------------
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_turn_but_the_last_runs_a_tool_the_parser_would_name_the_same(preset):
    spec = PRESETS[preset](200, 1.0)
    for tool in spec.tools:
        assert tool_key_for_command(tool.command) == tool.key  # histories line up with the scheduler's
    for job in generate_jobs(spec, 0):
        last = job.turns[-1]
        assert (last.tool, last.tool_command, last.tool_seconds) == ("", "", 0.0)
        for turn in job.turns[:-1]:
            assert turn.tool and turn.tool_command and turn.tool_seconds > 0


def test_field_report_preset_reproduces_the_measured_table():
    jobs = generate_jobs(PRESETS["field-report"](1000, 1.0), 0)
    assert {j.num_turns for j in jobs} == {8}
    # Report: prompt tokens 92 on turn 1, 2,915 on turn 8, ~2,900 accumulated.
    assert np.mean([j.prompt_tokens(0) for j in jobs]) == pytest.approx(92, rel=0.05)
    assert np.mean([j.prompt_tokens(7) for j in jobs]) == pytest.approx(2915, rel=0.10)
    assert np.mean([j.context_tokens() for j in jobs]) == pytest.approx(2900, rel=0.20)
    # Tools: shell tools 50-200 ms, pytest 2-5 s on ~1 turn in 8.
    turns = [t for j in jobs for t in j.turns[:-1]]
    pytest_times = [t.tool_seconds for t in turns if t.tool == "python -m pytest"]
    fast_times = [t.tool_seconds for t in turns if t.tool != "python -m pytest"]
    assert 2.0 <= min(pytest_times) and max(pytest_times) <= 5.0
    assert 0.05 <= min(fast_times) and max(fast_times) <= 0.2
    assert len(pytest_times) / len(turns) == pytest.approx(1 / 8, abs=0.02)
    assert {t.tool for t in turns} == {"ls", "cat", "grep", "git status", "python -m pytest"}
    # Tool outputs of tens to a few hundred tokens.
    outputs = [t.new_tokens for j in jobs for t in j.turns[1:]]
    assert 10 <= min(outputs) and max(outputs) <= 1000


def test_cpu_small_preset_final_context_is_1200_to_1600_tokens():
    spec = PRESETS["cpu-small"](1000, 1.0)
    jobs = generate_jobs(spec, 0)
    contexts = [j.context_tokens() for j in jobs]
    assert 1200 <= np.mean(contexts) <= 1600
    assert {j.num_turns for j in jobs} == {6}
    assert spec.system_tokens == 120
    assert all(150 <= j.turns[0].new_tokens <= 250 for j in jobs)
    assert all(8 <= t.output_tokens <= 16 for j in jobs for t in j.turns)  # field report: 7-12
    # Same tool times as the field report.
    times = tool_times(jobs)
    assert times.min() >= 0.05 and times.max() <= 5.0


def test_heavy_tail_preset_has_a_tail():
    jobs = generate_jobs(PRESETS["heavy-tail"](2000, 1.0), 0)
    times = tool_times(jobs)
    p50, p99 = np.percentile(times, [50, 99])
    assert p99 > 10 * p50
    assert p99 > 10.0  # tens of seconds, not a long body
    assert np.mean(times > 15.0) == pytest.approx(0.03, abs=0.015)  # the few-percent stall component
    turns = [j.num_turns for j in jobs]
    assert min(turns) == 4 and max(turns) == 12
    assert np.mean(turns) == pytest.approx(8, abs=0.3)


def test_fixed_preset_is_fully_controlled():
    jobs = generate_jobs(PRESETS["fixed"](100, 1.0, tool_seconds=2.5), 4)
    assert set(tool_times(jobs).tolist()) == {2.5}
    assert {j.num_turns for j in jobs} == {6}
    assert len({j.context_tokens() for j in jobs}) == 1
    assert set(tool_times(generate_jobs(PRESETS["fixed"](10, 1.0), 4)).tolist()) == {1.0}


def test_presets_all_take_the_benchmark_arguments_positionally():
    for name, factory in PRESETS.items():
        spec = factory(7, 0.5, 1.5)
        assert (spec.name, spec.num_jobs, spec.jobs_per_s, spec.tool_output_scale) == (name, 7, 0.5, 1.5)


# ----------------------------------------------------------------------
# Jobs and specs
# ----------------------------------------------------------------------
def make_job(job_id="j", arrival_s=0.0):
    return Job(job_id, arrival_s, 10, (
        Turn(0, 5, 2, "ls", "ls -la", 0.1),
        Turn(1, 7, 4, "python -m pytest", "python -m pytest -q", 3.0),
        Turn(2, 3, 6, "", "", 0.0),
    ))


def test_prompt_and_context_tokens():
    job = make_job()
    assert job.num_turns == 3
    assert [job.prompt_tokens(k) for k in range(3)] == [15, 24, 31]
    assert job.context_tokens() == 37
    with pytest.raises(ValueError, match="turns 0..2, got turn_index 3"):
        job.prompt_tokens(3)


def test_job_and_turn_invariants_are_enforced():
    with pytest.raises(ValueError, match="Turn.output_tokens must be an integer >= 1, got 0"):
        Turn(0, 5, 0, "", "", 0.0)
    with pytest.raises(ValueError, match="last turn .* must run no tool.*tool='ls'"):
        Job("j", 0.0, 10, (Turn(0, 5, 2, "ls", "ls", 0.1),))
    with pytest.raises(ValueError, match=r"turns\[1\] has index 2"):
        Job("j", 0.0, 10, (Turn(0, 5, 2, "ls", "ls", 0.1), Turn(2, 5, 2, "", "", 0.0)))
    with pytest.raises(ValueError, match="arrival_s must be a finite number >= 0, got -1.0"):
        make_job(arrival_s=-1.0)


def test_spec_errors_name_the_bad_value():
    spec = PRESETS["cpu-small"](5, 1.0)
    with pytest.raises(ValueError, match="jobs_per_s must be a finite number > 0, got 0"):
        dataclasses.replace(spec, jobs_per_s=0)
    with pytest.raises(ValueError, match=r"WorkloadSpec.turns .* got \(5, 3\)"):
        dataclasses.replace(spec, turns=(5, 3))
    with pytest.raises(ValueError, match="tools is empty"):
        dataclasses.replace(spec, tools=())
    with pytest.raises(ValueError, match="weight must be a finite number > 0, got -1"):
        ToolSpec("ls", "ls", -1, Fixed(0.1), (1, 2))
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got -1"):
        generate_jobs(spec, -1)


def test_describe():
    jobs = [make_job("a", 1.0), make_job("b", 4.0)]
    d = describe(jobs)
    assert d["num_jobs"] == 2 and d["num_turns"] == 6 and d["mean_turns"] == 3.0
    assert d["mean_context_tokens"] == 37.0 and d["max_context_tokens"] == 37
    assert d["arrival_span_s"] == 3.0
    assert d["tool_calls"] == 4
    assert d["tool_seconds_mean"] == pytest.approx((0.1 + 3.0) / 2)
    assert d["tool_seconds_p50"] == pytest.approx(1.55)
    assert d["tool_share"] == {"ls": 0.5, "python -m pytest": 0.5}
    with pytest.raises(ValueError, match="at least one job"):
        describe([])


# ----------------------------------------------------------------------
# Trace files
# ----------------------------------------------------------------------
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_trace_round_trip(tmp_path, preset):
    jobs = generate_jobs(PRESETS[preset](25, 0.7, 1.3), 2)
    path = str(tmp_path / "trace.jsonl")
    write_trace(path, jobs)
    assert read_trace(path) == jobs
    lines = open(path).read().splitlines()
    assert len(lines) == sum(j.num_turns for j in jobs)
    assert list(json.loads(lines[0])) == [
        "job", "turn", "arrival_s", "system_tokens", "new_tokens",
        "output_tokens", "tool", "tool_command", "tool_seconds",
    ]


def test_read_trace_redraws_arrivals_exactly_as_generate_jobs(tmp_path):
    path = str(tmp_path / "trace.jsonl")
    write_trace(path, generate_jobs(PRESETS["heavy-tail"](30, 0.1), 8))
    assert read_trace(path, jobs_per_s=2.0, seed=8) == generate_jobs(PRESETS["heavy-tail"](30, 2.0), 8)


def test_read_trace_accepts_interleaved_jobs_and_sorts_by_arrival(tmp_path):
    late, early = make_job("late", 5.0), make_job("early", 1.0)
    path = tmp_path / "t.jsonl"
    write_trace(str(path), [late, early])
    lines = path.read_text().splitlines()
    interleaved = [lines[0], lines[3], lines[1], "", lines[4], lines[2], lines[5]]  # plus a blank line
    path.write_text("\n".join(interleaved) + "\n")
    assert read_trace(str(path)) == [early, late]


GOOD = [
    {"job": "job-0003", "turn": 0, "arrival_s": 1.25, "system_tokens": 120, "new_tokens": 180,
     "output_tokens": 24, "tool": "ls", "tool_command": "ls -la", "tool_seconds": 0.08},
    {"job": "job-0003", "turn": 1, "arrival_s": 1.25, "system_tokens": 120, "new_tokens": 60,
     "output_tokens": 24, "tool": "python -m pytest", "tool_command": "python -m pytest -q", "tool_seconds": 3.1},
    {"job": "job-0003", "turn": 2, "arrival_s": 1.25, "system_tokens": 120, "new_tokens": 400,
     "output_tokens": 24, "tool": "", "tool_command": "", "tool_seconds": 0.0},
]


def edit(index, **changes):
    lines = [json.dumps(r) for r in GOOD]
    record = dict(GOOD[index])
    for key, value in changes.items():
        if value is ...:
            del record[key]
        else:
            record[key] = value
    lines[index] = json.dumps(record)
    return lines


@pytest.mark.parametrize(
    "lines, line_no, message",
    [
        (edit(1, output_tokens=...), 2, "field 'output_tokens' is missing"),
        (edit(1, new_tokens=-5), 2, "field 'new_tokens' must be an integer >= 0, got -5"),
        (edit(0, turn=0.0), 1, "field 'turn' must be an integer >= 0, got 0.0"),
        (edit(1, output_tokens=True), 2, "field 'output_tokens' must be an integer >= 1, got True"),
        (edit(1, tool_seconds="slow"), 2, "field 'tool_seconds' must be a finite number >= 0, got 'slow'"),
        (edit(0, arrival_s=-0.5), 1, "field 'arrival_s' must be a finite number >= 0, got -0.5"),
        (edit(2, job=""), 3, "field 'job' must be a non-empty string"),
        (edit(1, turn=2), 2, "field 'turn' of job 'job-0003' must be 1 .*got 2"),
        (edit(0, turn=1), 1, "field 'turn' of job 'job-0003' must be 0 .*got 1"),
        (edit(2, arrival_s=9.0), 3, "field 'arrival_s' of job 'job-0003' is 9.0, but line 1 says 1.25"),
        (edit(2, tool_seconds=0.4), 3, r"field 'tool_seconds' of the last turn \(2\) of job 'job-0003'"),
        (edit(2, tool="ls"), 3, r"field 'tool' of the last turn \(2\)"),
        ([json.dumps(GOOD[0]), '{"job": "job-0003", "turn": 1,', json.dumps(GOOD[2])], 2, "invalid JSON"),
        ([json.dumps(GOOD[0]), "[1, 2]"], 2, "expected a JSON object, got list"),
    ],
)
def test_read_trace_errors_name_file_line_and_field(tmp_path, lines, line_no, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}:{line_no}: ") + message):
        read_trace(str(path))


def test_the_documented_example_trace_reads(tmp_path):
    path = tmp_path / "ok.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in GOOD) + "\n")
    (job,) = read_trace(str(path))
    assert job.job_id == "job-0003" and job.arrival_s == 1.25 and job.num_turns == 3
    assert job.turns[1].tool_command == "python -m pytest -q"
    assert job.context_tokens() == 120 + 180 + 60 + 400 + 3 * 24


def test_read_trace_rejects_empty_file_and_bad_rate(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}: no turns found")):
        read_trace(str(path))
    path.write_text("\n".join(json.dumps(r) for r in GOOD) + "\n")
    with pytest.raises(ValueError, match="jobs_per_s must be a finite number > 0, got -1.0"):
        read_trace(str(path), jobs_per_s=-1.0)


def test_write_trace_rejects_duplicate_job_ids(tmp_path):
    with pytest.raises(ValueError, match="job id 'j' appears twice"):
        write_trace(str(tmp_path / "t.jsonl"), [make_job("j"), make_job("j", 2.0)])


def test_coding_agent_preset_is_the_documented_gpu_scale_agent():
    jobs = generate_jobs(PRESETS["coding-agent"](400, 1.0), 0)
    # A 6k system prompt and a 7-9k task: first contexts ~14k tokens.
    assert np.mean([j.prompt_tokens(0) for j in jobs]) == pytest.approx(14_000, rel=0.05)
    assert np.mean([j.num_turns for j in jobs]) == pytest.approx(20, abs=0.5)
    # Each turn adds ~700 tokens (a 150-token reply and ~550 of tool output).
    growth = [(j.prompt_tokens(j.num_turns - 1) - j.prompt_tokens(0)) / (j.num_turns - 1) for j in jobs]
    assert np.mean(growth) == pytest.approx(700, rel=0.1)
    # Tools between ~0.2 s and ~20 s at their medians, pip install the slowest.
    turns = [t for j in jobs for t in j.turns[:-1]]
    medians = {k: np.median([t.tool_seconds for t in turns if t.tool == k]) for k in {t.tool for t in turns}}
    assert min(medians.values()) == pytest.approx(0.2, rel=0.3)
    assert max(medians, key=medians.get) == "pip install" and medians["pip install"] == pytest.approx(20, rel=0.3)


def test_spread_preset_spreads_sizes_and_lengths_lognormally():
    spec = PRESETS["spread"](600, 1.0)
    jobs = generate_jobs(spec, 0)
    # A shared 6k system prompt plus a task log-normal around 14k (sigma 0.5).
    assert all(j.system_tokens == 6000 for j in jobs)
    tasks = np.array([j.turns[0].new_tokens for j in jobs])
    assert np.median(tasks) == pytest.approx(14_000, rel=0.08)
    assert np.std(np.log(tasks)) == pytest.approx(0.5, abs=0.05)
    # 3-40 turns, spread (not coding-agent's 16-24).
    turns = np.array([j.num_turns for j in jobs])
    assert turns.min() >= 3 and turns.max() <= 40
    assert np.median(turns) == pytest.approx(12, abs=1.5)
    assert np.percentile(turns, 95) > 2.5 * np.percentile(turns, 5)
    # ~700 tokens a turn, tools between ~0.2 s and ~20 s at their medians.
    growth = [(j.prompt_tokens(j.num_turns - 1) - j.prompt_tokens(0)) / (j.num_turns - 1) for j in jobs]
    assert np.mean(growth) == pytest.approx(700, rel=0.1)
    tools = [t for j in jobs for t in j.turns[:-1]]
    medians = {k: np.median([t.tool_seconds for t in tools if t.tool == k]) for k in {t.tool for t in tools}}
    assert min(medians.values()) == pytest.approx(0.2, rel=0.3)
    assert max(medians.values()) == pytest.approx(20, rel=0.3)


def test_spread_draws_are_clipped_to_the_ranges():
    spec = WorkloadSpec("clip", 5, 1.0, (3, 4), 10, (50, 60), (5, 5), PRESETS["cpu-small"](1, 1.0).tools,
                        turns_distribution=Fixed(100.0), task_distribution=Fixed(1.0))
    jobs = generate_jobs(spec, 1)
    assert {j.num_turns for j in jobs} == {4} and {j.turns[0].new_tokens for j in jobs} == {50}
    with pytest.raises(ValueError, match="turns_distribution"):
        WorkloadSpec("bad", 1, 1.0, (1, 1), 0, (1, 1), (1, 1), (), turns_distribution=3.0)
