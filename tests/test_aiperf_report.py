"""scripts/aiperf_report.py: the live AIPerf replays' page, from the runs'
results.json files (gap shares pooled over runs, each run's machine, arm
order and session ids, the README block, a page of its own)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from vllm_continuum_plugin.benchmarks import aiperf_replay as ar

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
try:
    import aiperf_report
finally:
    sys.path.pop(0)


def test_the_report_pools_the_gap_share_over_runs_and_writes_the_readme_block(tmp_path):

    def arm(name, jct, hit=0.5):
        return {"policy": name, "jct_s": {"mean": jct}, "prefix_cache_hit_share": hit, "failed": 0,
                "server_counters": {"jobs_ended": 3, "pins_created": 10}}

    runs = []
    for i, (fcfs, cont, oracle) in enumerate([(300.0, 150.0, 100.0), (200.0, 150.0, 100.0)]):
        d = tmp_path / f"run{i + 1}"
        d.mkdir()
        (d / "results.json").write_text(json.dumps({
            "cpu": "Test CPU", "dtype": "float32", "aiperf_version": "0.13.0", "num_blocks": 600, "block_size": 32,
            "config": {"merge": 16, "max_think": 5.0}, "sessions": [{"turns": 15}] * 24,
            "arms": [arm("fcfs", fcfs), arm("continuum", cont), arm("oracle", oracle)]}))
        runs.append(d)
    results = [aiperf_report.load(d) for d in runs]
    text = aiperf_report.render(results, ["fcfs", "continuum", "oracle"], "cmd")
    # Run 1 closes 75% of its gap, run 2 50%; pooled (500-300)/(500-200) = 67%.
    assert "| continuum | 150.0 | 150.0 | +75%, +50% | +67% |" in text
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{aiperf_report.README_BEGIN}\nold\n{aiperf_report.README_END}\noutro\n")
    aiperf_report.update_readme(readme, aiperf_report.readme_block(results, ["fcfs", "continuum", "oracle"]))
    body = readme.read_text()
    assert body.startswith("intro\n") and body.endswith("outro\n") and "old" not in body
    assert "| continuum | 2 | 150.0 s | +67% |" in body
    # Each arm's session ids, as its run recorded them.
    assert aiperf_report.session_note(results, ["fcfs", "continuum"]) == []  # not recorded: nothing said
    recorded = [{"arms": [{"policy": "continuum", "arm": {"session_header": "X-Session-ID", "affinity_header": True}},
                          {"policy": "fcfs", "arm": {"session_header": "X-Session-ID", "affinity_header": True}},
                          {"policy": "continuum-affinity", "arm": {"session_header": None, "affinity_header": True}},
                          {"policy": "continuum-no-header", "arm": {"session_header": None, "affinity_header": False}},
                          {"policy": "old-no-header", "arm": {"session_header": None}}]}]
    note = aiperf_report.session_note(
        recorded, ["fcfs", "continuum", "continuum-affinity", "continuum-no-header", "old-no-header"])
    assert note == ["Session ids: `fcfs`, `continuum`: `--session-header X-Session-ID`; `continuum-affinity`: AIPerf's "
                    "default `X-Session-Affinity` only (no `--session-header`); `continuum-no-header`: none "
                    "(AIPerf's `X-Session-Affinity` off); `old-no-header`: no session id read (AIPerf's default "
                    "`X-Session-Affinity` was sent; the plugin of the time did not read it)."]


def test_a_run_is_completed_arm_by_arm_and_pooled_over_the_runs_each_arm_has(tmp_path):
    """--resume runs only what a run lacks; a replay into the run keeps the
    other arms when the workload matches and refuses another workload; an arm
    added to some runs only is pooled over those."""
    base = {"cpu": "Test CPU", "dtype": "float32", "aiperf_version": "0.13.0", "num_blocks": 600, "block_size": 32,
            "max_model_len": 4096, "sessions": [{"turns": 15}] * 24, "commit": "old1234",
            "config": {"merge": 16, "max_think": 5.0}}

    def arm(name, jct, **extra):
        return {"policy": name, "jct_s": {"mean": jct}, "prefix_cache_hit_share": 0.5, "failed": 0, **extra}

    run = tmp_path / "run1"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(
        {**base, "arms": [arm("fcfs", 300.0), arm("continuum", 150.0), {"policy": "oracle", "error": "boom"}]}))
    assert aiperf_report.missing_arms(run, ["fcfs", "continuum", "oracle", "continuum-paper"]) == [
        "oracle", "continuum-paper"]
    kept = ar.previous_arms(str(run / "results.json"), {**base, "commit": "new5678"}, {"continuum"})
    assert [a["policy"] for a in kept] == ["fcfs"] and kept[0]["commit"] == "old1234"
    with pytest.raises(ValueError, match="'num_blocks'"):
        ar.previous_arms(str(run / "results.json"), {**base, "num_blocks": 300}, set())

    results = [
        {**base, "arms": [arm("fcfs", 300.0), arm("continuum", 150.0), arm("oracle", 100.0)]},
        {**base, "arms": [arm("fcfs", 200.0), arm("continuum", 150.0), arm("oracle", 100.0),
                          arm("continuum-paper", 175.0, commit="new5678")]},
    ]
    text = aiperf_report.render(results, ["fcfs", "continuum", "oracle", "continuum-paper"], "cmd")
    assert "| continuum-paper | - | 175.0 | +25% | +25% |" in text
    assert "new5678: continuum-paper (run 2)" in text
    block = aiperf_report.readme_block(results, ["fcfs", "continuum", "continuum-paper"])
    assert "| continuum-paper | 1 | 175.0 s | +25% |" in block


def test_runs_from_different_machines_are_each_named_with_their_machine():
    """A page pooled over runs of several sessions names each run's CPU
    (each run's arms compare on its own machine); one machine is named once."""
    base = {"aiperf_version": "0.13.0", "num_blocks": 600, "block_size": 32, "sessions": [{"turns": 8}] * 24,
            "config": {"merge": 32, "max_think": 5.0}, "dtype": "bfloat16"}
    arms = [{"policy": p, "jct_s": {"mean": j}, "prefix_cache_hit_share": 0.5, "failed": 0}
            for p, j in (("fcfs", 300.0), ("continuum", 150.0), ("oracle", 100.0))]
    results = [{**base, "cpu": cpu, "arms": arms} for cpu in ("Xeon", "EPYC", "EPYC")]
    text = aiperf_report.render(results, ["fcfs", "continuum", "oracle"], "cmd")
    assert "Machine: Xeon, bfloat16 (run 1); EPYC, bfloat16 (runs 2-3);" in text
    assert "Xeon" in "\n".join(aiperf_report.readme_block(results, ["continuum"]))
    assert aiperf_report.machines(results[1:]) == "EPYC, bfloat16"
    assert aiperf_report.machines([results[1], results[0], results[2]]) == (
        "EPYC, bfloat16 (runs 1, 3); Xeon, bfloat16 (run 2)")


def test_a_page_of_its_own_leaves_the_readme_and_names_where_it_went(tmp_path, monkeypatch):
    """``--readme ''`` with another --doc/--plot/--out-root: a side
    experiment (the victim tier against native offloading) gets its own page,
    written from its runs, while README's block keeps the main replay's."""
    run = tmp_path / "runs" / "run1"
    run.mkdir(parents=True)
    arms = [{"policy": p, "jct_s": {"mean": j}, "prefix_cache_hit_share": 0.5, "failed": 0,
             "arm": {"host_tier_blocks": 40 if "offload" in p else 0}}
            for p, j in (("native-offload", 300.0), ("continuum-offload-explicit", 250.0), ("oracle", 100.0))]
    (run / "results.json").write_text(json.dumps({
        "cpu": "Test CPU", "dtype": "float32", "aiperf_version": "0.13.0", "num_blocks": 600, "block_size": 32,
        "config": {"merge": 16, "max_think": 5.0, "host_tier": 0.5}, "sessions": [{"turns": 15}] * 24,
        "arms": arms}))
    doc, plot = tmp_path / "docs" / "side.md", tmp_path / "docs" / "side.png"
    doc.parent.mkdir()
    readme = tmp_path / "README.md"
    readme.write_text("untouched\n")
    monkeypatch.setattr(aiperf_report, "REPO", tmp_path)
    assert aiperf_report.main(["--runs", "1", "--arms", "native-offload,continuum-offload-explicit,oracle",
                               "--out-root", str(tmp_path / "runs"), "--doc", str(doc), "--plot", str(plot),
                               "--readme", "", "--only-report"]) == 0
    text = doc.read_text()
    assert readme.read_text() == "untouched\n"
    assert "| continuum-offload-explicit | 250.0 | - | - |" in text  # no fcfs in the run: no gap share
    assert "--out-root=runs --doc=docs/side.md --plot=docs/side.png --readme=" in text
    assert "![mean session JCT per arm and run](side.png)" in text and plot.exists()
    assert "the plugin's connector storing what leaves a pin (`store_mode: explicit`)" in text
    assert "storing what the GPU evicts (`store_mode: victim`), with a host tier of 40 blocks" in text


def test_the_page_says_in_which_order_each_runs_arms_ran():
    """Arms of a run share one machine one after another; the page says the
    order (as each run's results list it: an arm resumed later goes last),
    runs with one order grouped, so an order effect can be seen; new runs
    rotate the order."""
    base = {"cpu": "EPYC", "dtype": "bfloat16", "aiperf_version": "0.13.0", "num_blocks": 320, "block_size": 32,
            "sessions": [{"turns": 15}] * 24, "config": {"merge": 32, "max_think": 5.0}}

    def arms(*names):
        return [{"policy": p, "jct_s": {"mean": 100.0 + 10 * i}, "prefix_cache_hit_share": 0.5, "failed": 0}
                for i, p in enumerate(names)]

    first = ("fcfs", "continuum-affinity", "continuum", "oracle")
    swapped = ("continuum", "continuum-affinity", "fcfs", "oracle")
    results = [{**base, "arms": arms(*first)}, {**base, "arms": arms(*first)}, {**base, "arms": arms(*swapped)}]
    text = aiperf_report.render(results, list(first), "cmd")
    assert ("Arms ran one after another, each on a fresh server, in this order: runs 1-2: `fcfs`, "
            "`continuum-affinity`, `continuum`, `oracle`; run 3: `continuum`, `continuum-affinity`, `fcfs`, "
            "`oracle`.") in text
    assert aiperf_report.order_note(results[:2]) == [
        "Arms ran one after another, each on a fresh server, in this order: `fcfs`, `continuum-affinity`, "
        "`continuum`, `oracle`."]
    assert aiperf_report.order_note([]) == []
    # How AIPerf paced each run (older runs recorded nothing: concurrency mode).
    paced = [{**results[0], "aiperf_request_rate": 50.0}, results[1]]
    assert aiperf_report.pacing_note(paced) == [
        "AIPerf issued due turns on a 50-per-second clock (`--request-rate 50 --arrival-pattern constant`) "
        "(run 1); AIPerf in its concurrency mode (its timing loop keeps a CPU core busy all run) (run 2)."]
    assert aiperf_report.pacing_note(paced[:1]) == [
        "AIPerf issued due turns on a 50-per-second clock (`--request-rate 50 --arrival-pattern constant`)."]
    # New runs rotate the order, so no arm always runs first or after the same arm.
    assert [aiperf_report.run_order(list(first), i) for i in range(5)] == [
        list(first), list(first[1:] + first[:1]), list(first[2:] + first[:2]), list(first[3:] + first[:3]),
        list(first)]
    assert aiperf_report.run_order([], 2) == []

