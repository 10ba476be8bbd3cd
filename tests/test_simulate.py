"""The simulator: vLLM's real scheduler replaying agent jobs on a virtual
clock (``benchmarks.simulate``, ``benchmarks.sim``).

What a user relies on: two runs print the same bytes; every arm ends with
every KV block free; a turn's batch is priced with the context it really had
cached; the block hashes are vLLM's own; retention shows up where the pool is
under pressure; the CLI replays the shipped Claude Code subset.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator

import pytest
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import Request
from vllm.sampling_params import SamplingParams

from benchmarks import simulate
from benchmarks.sim.arms import ARMS, parse_arms
from benchmarks.sim.batch import BatchShape, PrefillChunk
from benchmarks.sim.engine import JobHasher
from benchmarks.sim.jobs import Segment, SimJob, SimTurn, TokenBook, stable_key
from benchmarks.sim.trace_jobs import jobs_from_traces
from benchmarks.sim.profiles import PROFILES, write_config_dir
from benchmarks.sim.step_model import RooflineStepModel
from benchmarks.sim.traces import DEFAULT_TRACE_DIR, load_trace_dir

PROFILE = PROFILES["h100-llama8b"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield write_config_dir(PROFILE, str(tmp_path_factory.mktemp("sim") / "model"))


class Recording:
    """The roofline model, remembering every batch it priced."""

    name = "recording-roofline"

    def __init__(self) -> None:
        self.inner = RooflineStepModel(PROFILE)
        self.batches: list[BatchShape] = []

    def step_seconds(self, batch: BatchShape) -> float:
        self.batches.append(batch)
        return self.inner.step_seconds(batch)


def agent_job(name: str, arrival: float, system: int, turns: int, new: int, out: int, tool_s: float,
              shared_system: bool = False) -> SimJob:
    """A job whose turn k re-sends the whole history plus ``new`` tokens."""
    history = [Segment(stable_key("system" if shared_system else name), system)]
    out_turns = []
    for k in range(turns):
        prompt = tuple(history + [Segment(stable_key(name, k), new)])
        out_turns.append(SimTurn(prompt, out, tool_s if k else 0.0, "tool_use" if k < turns - 1 else ""))
        history = list(prompt) + [Segment(stable_key(name, k, "reply"), out)]
    return SimJob(name, arrival, tuple(out_turns))


def settings(model_dir: str, step_model: object, num_blocks: int) -> simulate.SimSettings:
    return simulate.SimSettings(PROFILE, step_model, model_dir, num_blocks)


def test_reply_is_what_the_next_turn_resends() -> None:
    job = agent_job("j", 0.0, 100, 3, 40, 20, 1.0)
    book = TokenBook()
    for k in range(2):
        prompt = book.prompt(job.turns[k].prompt)
        reply = job.reply_tokens(k, book)
        nxt = book.prompt(job.turns[k + 1].prompt)
        assert nxt[: len(prompt) + len(reply)] == prompt + reply
        assert job.reusable_tokens(k + 1) == len(prompt) + len(reply) - 1  # the last sampled token has no KV
    assert job.reusable_tokens(0) == 0


def test_job_hasher_gives_vllms_own_block_hashes() -> None:
    init_none_hash(sha256)
    tokens = TokenBook().prompt([Segment(stable_key("h"), 1000)])
    ours = JobHasher(16).for_job("job")
    params = SamplingParams(max_tokens=1)
    a = Request("a", tokens, params, None, 0.0, block_hasher=get_request_block_hasher(16, sha256))
    b = Request("b", tokens, params, None, 0.0, block_hasher=ours)
    assert len(a.block_hashes) == 1000 // 16
    assert b.block_hashes == a.block_hashes
    # A second turn of the job (memo hits) still matches vLLM's.
    longer = tokens + [5] * 40
    c = Request("c", longer, params, None, 0.0, block_hasher=get_request_block_hasher(16, sha256))
    d = Request("d", longer, params, None, 0.0, block_hasher=ours)
    assert d.block_hashes == c.block_hashes


def test_job_hasher_matches_vllm_over_edits_branches_and_decodes() -> None:
    # A job's requests extend, edit mid-history, branch back to an older
    # history and grow by decoded tokens: every hash must still be vLLM's.
    init_none_hash(sha256)
    rng = random.Random(3)
    ours = JobHasher(16).for_job("job")
    params = SamplingParams(max_tokens=1)
    history = [rng.randrange(1000, 2000) for _ in range(300)]
    older = list(history)
    for i in range(40):
        kind = rng.choice(["extend", "edit", "branch", "short"])
        if kind == "extend":
            history = history + [rng.randrange(1000, 2000) for _ in range(rng.randrange(1, 90))]
        elif kind == "edit":
            history = list(history)
            history[rng.randrange(len(history))] += 1
        elif kind == "branch":
            history, older = older, history
        else:
            history = history[: rng.randrange(1, len(history))]
        ref = Request(f"r{i}", history, params, None, 0.0, block_hasher=get_request_block_hasher(16, sha256))
        got = Request(f"g{i}", history, params, None, 0.0, block_hasher=ours)
        assert got.block_hashes == ref.block_hashes, (i, kind)
        for _ in range(rng.randrange(0, 40)):  # decoded tokens, one at a time
            token = rng.randrange(1000, 2000)
            ref.append_output_token_ids(token)
            got.append_output_token_ids(token)
        assert got.block_hashes == ref.block_hashes, (i, kind, "decode")


def test_next_turn_is_priced_with_its_cached_context(model_dir: str) -> None:
    # Two turns, nothing else running, a pool that never evicts: turn 1's
    # prefill computes only its new tokens, on top of turn 0's context.
    job = agent_job("solo", 0.0, 3000, 2, 500, 20, 2.0)
    model = Recording()
    summary, records = simulate.run_arm(ARMS["oracle"], [job], settings(model_dir, model, 4096))
    prefills = [p for b in model.batches for p in b.prefills]
    assert prefills[0] == PrefillChunk(3500, 0)
    hit = records.turns[1].cached_tokens
    # Whole blocks of turn 0's computed prompt and reply (its last sampled
    # token has no KV).
    assert hit == (3520 - 1) // 16 * 16
    assert prefills[1] == PrefillChunk(3520 + 500 - hit, hit)
    assert summary.recomputed_tokens == 0
    # Decodes see their growing context; 20 output tokens a turn.
    decodes = [c for b in model.batches for c in b.decode_contexts]
    assert len(decodes) == 2 * 19
    # JCT: both turns' steps plus the 2 s tool gap, in virtual seconds.
    assert summary.jct_mean_s == pytest.approx(sum(model.inner.step_seconds(b) for b in model.batches) + 2.0)


def pressured_jobs() -> list[SimJob]:
    # 12 agents, 4k-token contexts growing, 1.5 s tools, a 1,000-block pool
    # (16k tokens): the pool holds about four contexts.
    return [agent_job(f"a{i}", 0.3 * i, 3000, 5, 300, 40, 1.5) for i in range(12)]


def test_retention_arms_are_deterministic_and_free_every_block(model_dir: str) -> None:
    jobs = pressured_jobs()
    model = RooflineStepModel(PROFILE)
    by_arm = {}
    for arm in parse_arms("fcfs,continuum,context_serve,continuum-offload,continuum-offload-explicit,"
                          "continuum-offload-victim,offload-victim,native-offload,continuum-native-offload,oracle"):
        first, _ = simulate.run_arm(arm, jobs, settings(model_dir, model, 1000))  # asserts all blocks free
        again, _ = simulate.run_arm(arm, jobs, settings(model_dir, model, 1000))
        assert first == again, arm.name
        by_arm[arm.name] = first
    assert by_arm["oracle"].hit_share >= max(s.hit_share for s in by_arm.values()) - 1e-9
    assert by_arm["oracle"].recomputed_tokens == 0
    # Pins carry contexts across tool gaps that FCFS's LRU loses.
    assert by_arm["continuum"].pins_created > 0
    assert by_arm["continuum"].hit_share > by_arm["fcfs"].hit_share
    assert by_arm["fcfs"].pins_created == 0
    # The plugin's offload connector (its real scheduler side): what leaves a
    # pin is stored and reloaded rather than recomputed.
    offload = by_arm["continuum-offload"]
    assert offload.stored_tokens > 0 and offload.loaded_tokens > 0
    assert offload.hit_share > by_arm["continuum"].hit_share
    assert offload.recomputed_tokens < by_arm["continuum"].recomputed_tokens
    # The same connector as a victim tier stores only what leaves a pin (or
    # a SLOW turn), not every computed block, and still reloads rather than
    # recomputes what the pins let go.
    victim = by_arm["continuum-offload-explicit"]
    assert 0 < victim.stored_tokens < offload.stored_tokens
    assert victim.loaded_tokens > 0
    assert victim.recomputed_tokens < by_arm["continuum"].recomputed_tokens
    # Storing what the GPU prefix cache evicts (store_mode victim): what
    # stock FCFS lets go is reloaded rather than recomputed, and never with
    # more copies than write-through (whose tier also copies what the GPU
    # keeps; this pool holds a third of the contexts, so nearly all leave).
    evicted = by_arm["offload-victim"]
    assert evicted.pins_created == 0 and evicted.loaded_tokens > 0
    assert evicted.recomputed_tokens < by_arm["fcfs"].recomputed_tokens
    assert 0 < evicted.stored_tokens <= by_arm["native-offload"].stored_tokens
    plugin_evicted = by_arm["continuum-offload-victim"]
    assert plugin_evicted.pins_created > 0 and plugin_evicted.loaded_tokens > 0
    assert plugin_evicted.recomputed_tokens < by_arm["continuum"].recomputed_tokens
    assert plugin_evicted.stored_tokens < offload.stored_tokens
    # vLLM's own offloading (its real OffloadingConnectorScheduler and LRU
    # CPU manager): every computed block is stored write-through, and what
    # FCFS evicted is loaded back instead of recomputed.
    native = by_arm["native-offload"]
    assert native.pins_created == 0
    assert native.stored_tokens > 0 and native.loaded_tokens > 0
    assert native.hit_share > by_arm["fcfs"].hit_share
    assert native.recomputed_tokens < by_arm["fcfs"].recomputed_tokens
    assert by_arm["continuum-native-offload"].pins_created > 0
    # Its loads are asynchronous: a returning turn waits for its prefix
    # before it runs, a part of its queueing that the records keep apart
    # (the plugin's connector loads inside the step; nothing else loads).
    assert 0 < native.load_wait_mean_s <= native.queue_mean_s
    assert by_arm["fcfs"].load_wait_mean_s == 0 and offload.load_wait_mean_s == 0


def test_continuum_learns_what_reloading_from_vllms_native_tier_costs(model_dir: str) -> None:
    # Under vLLM's native offloading the plugin does not drive the tier; it
    # times the loads of returning turns and prices a dropped context as
    # that reload, which on PCIe is far cheaper than its prefill.
    jobs = pressured_jobs()
    engine = simulate.build_engine(ARMS["continuum-native-offload"], jobs, settings(model_dir, RooflineStepModel(PROFILE), 1000))
    try:
        engine.run()
        scheduler = engine.scheduler
        assert scheduler.tier is not None
        tier = scheduler.tier.model
        assert tier.ready
        assert scheduler.tier.timed_loads == 0  # every timed load was reported
        assert tier.coverage.share() > 0.9  # write-through stores: the tier has what the GPU lost
        reload = scheduler.tier.rebuild_seconds(4000)
        assert reload is not None and 0 < reload < scheduler.prefill_cost.seconds(4000)
        # So a waiting request may take an older job's pin: the tier has it.
        assert scheduler.tier.pins_are_cheap()
    finally:
        engine.scheduler.shutdown()


def test_a_request_whose_load_completes_in_an_idle_step_is_scheduled(model_dir: str) -> None:
    # A small pool under vLLM's native offloading: the engine goes idle while
    # a turn's prefix loads; the load is reported in an idle step, and the
    # turn must run at the next schedule(), not wait for an event that never
    # comes (the run used to stop with SimulationStuck here).
    sessions, _ = load_trace_dir(DEFAULT_TRACE_DIR)
    arrivals = simulate.poisson_arrivals(6, 20 / 60.0, 7)
    jobs = jobs_from_traces(sessions[:6], arrivals, max_turns=8, max_context_tokens=3000 * 16)
    summary, _ = simulate.run_arm(ARMS["native-offload"], jobs, settings(model_dir, RooflineStepModel(PROFILE), 3000))
    assert summary.turns == sum(len(j.turns) for j in jobs)
    assert summary.loaded_tokens > 0


def test_trace_sessions_become_jobs_with_their_prefix_structure() -> None:
    sessions, skipped = load_trace_dir(DEFAULT_TRACE_DIR)
    assert not skipped and len(sessions) >= 40
    jobs = jobs_from_traces(sessions[:5], [0.0] * 5, max_think_s=60.0, max_context_tokens=131072)
    for job, session in zip(jobs, sessions):
        mains = session.main_requests()
        assert len(job.turns) == len(mains)
        assert job.turns[0].prompt_tokens == mains[0].input_tokens
        assert all(t.think_s <= 60.0 for t in job.turns)
        # Most turns extend the previous one (the trace's hash-id chains).
        extends = sum(job.reusable_tokens(k) > 0 for k in range(1, len(job.turns)))
        assert extends >= 0.8 * (len(job.turns) - 1)


def test_prompt_ids_built_after_the_previous_turn_equal_a_fresh_build() -> None:
    # The engine builds each turn's ids from its job's previous prompt; the
    # shortcut must give exactly the ids of a build from nothing, also where
    # a trace's prompt drops or rewrites its history.
    sessions, _ = load_trace_dir(DEFAULT_TRACE_DIR)
    jobs = jobs_from_traces(sessions[:8], [0.0] * 8, max_context_tokens=131072)
    fresh, reused = TokenBook(), TokenBook()
    rewrites = 0
    for job in jobs:
        prev = None
        for k, turn in enumerate(job.turns):
            ids = reused.prompt(turn.prompt, prev)
            assert ids == fresh.prompt(turn.prompt), (job.job_id, k)
            if prev is not None and job.reusable_tokens(k) < len(prev[1]):
                rewrites += 1
            prev = (turn.prompt, ids)
    assert rewrites > 0  # the subset holds turns that do not extend their predecessor


def test_cli_replays_the_shipped_traces_byte_identically(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    argv = ["--step-model", "roofline", "--policies", "fcfs,continuum,oracle", "--seed", "7",
            "--sessions", "6", "--max-turns", "6", "--rate", "20", "--num-blocks", "3000", "--workers", "1", "--out", str(tmp_path)]
    assert simulate.main(argv) == 0
    first = capsys.readouterr().out
    assert simulate.main(argv) == 0
    assert capsys.readouterr().out == first
    lines = [line for line in first.splitlines() if line.startswith(("fcfs:", "continuum:", "oracle:"))]
    assert len(lines) == 3
    assert "gap_closed" in lines[1]
    points = json.loads((tmp_path / "results.json").read_text())["points"]
    oracle = next(p for p in points if p["arm"] == "oracle")
    # The oracle's pool never evicts: it recomputes nothing any turn had before.
    assert oracle["recomputed_tokens"] == 0
    assert oracle["hit_share"] == pytest.approx(oracle["reusable_share"])


def test_cli_rejects_unknown_names() -> None:
    with pytest.raises(SystemExit, match="unknown policy 'lifo'"):
        simulate.main(["--policies", "fcfs,lifo"])
    with pytest.raises(SystemExit, match="unknown --profile 'a100'"):
        simulate.main(["--profile", "a100"])


def test_retention_arms_run_the_coding_agent_preset_when_the_working_set_overflows(model_dir: str) -> None:
    """The coding-agent preset with a working set about twice the pool: the
    defaults (priced TTLs, admission gate), the paper's rule, FCFS and the
    oracle all finish every turn and free every block (``run_arm`` asserts
    it); the defaults pin, and the oracle hits at least as much as any arm.

    Which arm is fastest on this one seed is a benchmark, not a property:
    docs/retention.md reports the ranking over its workloads
    (``scripts/retention_report.py``)."""
    from benchmarks.sim.jobs import jobs_from_workload
    from benchmarks.workload import coding_agent_workload, generate_jobs

    # 16 sessions arriving 1 a second, contexts of 14k-28k tokens, a pool of
    # 8,000 blocks (128k tokens).
    jobs = jobs_from_workload(generate_jobs(coding_agent_workload(16, 1.0), 3), shared_system=True)
    model = RooflineStepModel(PROFILE)
    by_arm = {
        arm.name: simulate.run_arm(arm, jobs, settings(model_dir, model, 8_000))[0]
        for arm in parse_arms("fcfs,continuum-paper,continuum,oracle")
    }
    summaries = {s.arm: s for s in simulate.add_gap_closed(list(by_arm.values()))}
    turns = sum(len(j.turns) for j in jobs)
    assert all(s.turns == turns for s in summaries.values())
    priced = summaries["continuum"]
    assert priced.pins_created > 0 and priced.gap_closed is not None
    assert summaries["oracle"].hit_share >= max(s.hit_share for s in summaries.values()) - 1e-9


def test_plain_admission_cap_keeps_at_most_k_sessions_in_flight(model_dir: str) -> None:
    """``fcfs-capK``: a session starts only when fewer than K are under way,
    first come first served, and its wait counts in its JCT."""
    jobs = pressured_jobs()
    model = RooflineStepModel(PROFILE)
    summary, records = simulate.run_arm(parse_arms("fcfs-cap2")[0], jobs, settings(model_dir, model, 1000))
    assert summary.jobs == len(jobs)
    first_turn = {r.job_id: r.arrival_s for r in records.turns if r.turn == 0}
    spans = sorted((first_turn[j], records.job_finish_s[j]) for j in first_turn)
    for i, (start, _) in enumerate(spans):
        under_way = sum(1 for s, f in spans[:i] if f > start + 1e-9)
        assert under_way <= 1  # this one makes at most 2
    # Sessions were held, and a held session's JCT counts its wait.
    held = [j for j in jobs if first_turn[j.job_id] > j.arrival_s + 1e-6]
    assert held
    for j in held:
        wait = first_turn[j.job_id] - j.arrival_s
        assert records.jct_s()[j.job_id] == pytest.approx(records.job_finish_s[j.job_id] - first_turn[j.job_id] + wait)
