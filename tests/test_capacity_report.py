"""scripts/capacity_report.py and its modules: the scoring
(``capacity_scoring``: SLO attainment per session against its JCT served
alone, capacity as the largest rate sustained with every lower rate
sustained), the page's sections (``capacity_sections``) and the report's
own arguments (pure logic over simulator results)."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from scripts import capacity_report as cr  # noqa: E402
from scripts import capacity_scoring as cs  # noqa: E402
from scripts import capacity_sections as sec  # noqa: E402

sys.path.pop(0)

SLO = cs.Slo(ttft_p90_s=2.0, jct_factor=1.3, attainment=0.9)


def _session(job, jct, ttft=0.5, tokens=1000):
    return {"job": job, "jct_s": jct, "ttft_p90_s": ttft, "tokens": tokens}


def test_a_session_keeps_the_slo_only_within_both_bounds_and_only_same_jobs_are_judged():
    solo = {"a": (100.0, 1000), "b": (100.0, 1000), "c": (100.0, 1000), "d": (100.0, 999)}
    point = {"sessions": [
        _session("a", 129.0),  # kept: 1.29x alone, TTFT fine
        _session("b", 131.0),  # JCT over 1.3x alone
        _session("c", 110.0, ttft=2.5),  # p90 TTFT over 2 s
        _session("d", 100.0),  # another job's content under the same id: not judged
        _session("e", 100.0),  # never ran alone: not judged
    ]}
    assert cs.attainment(point, solo, SLO) == 1 / 3
    assert cs.attainment({"sessions": []}, solo, SLO) is None


def test_capacity_is_the_largest_rate_sustained_with_every_lower_rate_sustained():
    assert cs.capacity({0.5: 1.0, 1.0: 0.95, 1.5: 0.85, 2.0: 0.92}, SLO) == 1.0  # 2.0 after a miss does not count
    assert cs.capacity({0.5: 0.8, 1.0: 0.95}, SLO) is None  # not even the lowest rate
    assert cs.capacity({0.5: 0.9}, SLO) == 0.5  # the bar is inclusive


def test_offload_arms_compare_with_stock_native_offloading_at_their_tier():
    assert cs.reference_arm("continuum-native-offload (64 GiB)") == "native-offload (64 GiB)"
    assert cs.reference_arm("continuum-offload (256 GiB)") == "native-offload (256 GiB)"
    assert cs.reference_arm("continuum-native-prefetch (256 GiB)") == "native-offload (256 GiB)"  # runs under it
    assert cs.reference_arm("continuum") == "fcfs"
    assert cs.reference_arm("fcfs-cap (best)") == "fcfs"


def _point(arm, rate, jcts, ttft=0.5):
    sessions = [_session(f"j{i}", jct, ttft) for i, jct in enumerate(jcts)]
    return {"arm": arm, "rate_per_min": rate, "jct_mean_s": sum(jcts) / len(jcts), "makespan_s": 1000.0,
            "ttft_mean_s": ttft, "queue_mean_s": ttft / 2, "sessions": sessions}


def test_the_table_names_each_arms_capacity_against_stock_at_the_same_tier():
    solo = {f"j{i}": (100.0, 1000) for i in range(10)}
    fine, slow = [110.0] * 10, [110.0] * 8 + [200.0] * 2  # 100% and 80% keep the SLO
    base = [_point("fcfs", 1, fine), _point("fcfs", 2, slow),
            _point("continuum", 1, fine), _point("continuum", 2, fine),
            _point("oracle", 1, fine), _point("oracle", 2, fine)]
    caps = [_point("fcfs-cap8", 1, slow), _point("fcfs-cap8", 2, slow),
            _point("fcfs-cap12", 1, fine), _point("fcfs-cap12", 2, slow)]
    tier = [_point("native-offload", 1, fine), _point("native-offload", 2, slow),
            _point("continuum-native-offload", 1, fine), _point("continuum-native-offload", 2, fine),
            _point("continuum-offload", 1, slow), _point("continuum-offload", 2, fine)]
    lines, shares, capacities = sec.profile_section(
        "h100-llama8b", solo, base, caps, ["fcfs-cap8", "fcfs-cap12"], {"64": tier}, SLO)
    assert capacities["fcfs"] == 1 and capacities["continuum"] == 2
    assert capacities["fcfs-cap (best)"] == 1  # cap12 at 1/min, nothing at 2/min
    assert capacities["continuum-offload (64 GiB)"] is None  # misses the lowest rate
    assert shares["fcfs"] == {1: 1.0, 2: 0.8}
    text = "\n".join(lines)
    # 2/min over native offloading's 1/min at the same tier; in flight = rate x mean JCT.
    assert "| continuum-native-offload (64 GiB) | 100% | 100% | 2 | 3.7 | 10 | 2.00x |" in text
    assert "| continuum-offload (64 GiB) | 80% | 100% | none | - | - | - |" in text
    # What breaks first: fcfs at 2/min, two sessions over 1.3x alone, none over the TTFT bound.
    assert "| fcfs | 2/min | 10 | 0 | 2 | 0.50 | 0.25 | 128.0 |" in text
    assert "| continuum-offload (64 GiB) | 1/min | 10 | 0 | 2 |" in text
    assert not any(line.startswith("| continuum | ") and "/min |" in line for line in lines)  # never fails


def test_misses_counts_each_half_of_the_slo_a_session_breaks():
    solo = {"a": (100.0, 1000), "b": (100.0, 1000), "c": (100.0, 1000), "d": (100.0, 999)}
    point = {"sessions": [_session("a", 129.0), _session("b", 131.0, ttft=2.5), _session("c", 110.0, ttft=2.5),
                          _session("d", 500.0, ttft=9.0)]}  # d: another job's content, not judged
    assert cs.misses(point, solo, SLO) == (3, 2, 1)


def test_the_ttft_split_says_what_prefetching_could_give_at_most():
    oracle = {"arm": "oracle", "ttft_mean_s": 0.2, "queue_mean_s": 0.05, "jct_mean_s": 1000.0}

    def native(arm, ttft, queue, load):
        return {"arm": arm, "ttft_mean_s": ttft, "queue_mean_s": queue, "load_wait_mean_s": load,
                "jct_mean_s": 1100.0}

    lines = sec.ttft_section("h100-llama8b", 1.0, oracle, {
        "64": [native("native-offload", 1.6, 1.4, 0.05)],  # queueing for the pool, not for loads
        "256": [native("continuum-native-offload", 0.9, 0.7, 0.6)],  # mostly loads
    })
    text = "\n".join(lines)
    assert "| oracle | 0.20 | 0.00 | 0.05 | 0.15 | 0.20 | 1000.0 |" in text
    # TTFT = load wait + other queueing + first step; without loads: TTFT - load wait.
    assert "| native-offload (64 GiB) | 1.60 | 0.05 | 1.35 | 0.20 | 1.55 | 1100.0 |" in text
    assert "without them 1.55 s, above 2x the oracle's (0.40 s)" in text
    assert "without them 0.30 s, within 2x the oracle's (0.40 s)" in text
    assert lines[-2] == ("So prefetching contexts before their turns return could bring the mean TTFT within 2x the "
                         "oracle's for `continuum-native-offload` at 256 GiB.")
    lines = sec.ttft_section("h100-llama8b", 1.0, oracle, {"64": [native("native-offload", 1.6, 1.4, 0.05)]})
    assert lines[-2].startswith("So prefetching contexts before their turns return cannot bring the mean TTFT within 2x "
                                "the oracle's for any arm or tier here: the turns wait for room")
    # Already within 2x without prefetching: the page says so, and claims nothing for prefetching.
    lines = sec.ttft_section("h100-llama70b-tp4", 0.5, oracle, {"64": [native("native-offload", 0.38, 0.1, 0.02)]})
    assert lines[-2] == ("So the mean TTFT is already within 2x the oracle's, without prefetching, for every "
                         "arm and tier here.")
    lines = sec.ttft_section("h100-llama8b", 1.0, oracle, {
        "64": [native("native-offload", 1.6, 1.4, 0.05)], "256": [native("native-offload", 0.38, 0.1, 0.02)]})
    assert lines[-2] == ("So the mean TTFT is already within 2x the oracle's, without prefetching, for "
                         "`native-offload` at 256 GiB; prefetching contexts before their turns return cannot "
                         "bring it within 2x the oracle's for `native-offload` at 64 GiB: the turns wait for "
                         "room in the GPU pool (the oracle's pool never fills), not for their loads; a prefetch "
                         "would take that room earlier.")
    # The plugin's arm is held to stock + native offloading's mean JCT at the same tier (the bar
    # is a lower TTFT without a higher JCT).
    faster = native("continuum-native-offload", 0.38, 0.1, 0.02) | {"jct_mean_s": 1089.0}
    text = "\n".join(sec.ttft_section("h100-llama8b", 1.0, oracle, {
        "256": [native("native-offload", 1.6, 1.4, 0.05), faster]}))
    assert "mean JCT 1089.0 s against stock + native offloading's 1100.0 s (-1.0%)" in text
    assert text.count("against stock + native offloading's") == 1  # not said of stock itself


def test_the_ttft_bar_on_other_draws_is_judged_on_their_mean_and_each_draw_is_shown():
    def arm(name, ttft, jct):
        return {"arm": name, "ttft_mean_s": ttft, "jct_mean_s": jct}

    def draw(oracle, stock, plugin, prefetch, jct=(1000.0, 1010.0, 1009.0, 1008.0)):
        return [arm("oracle", oracle, jct[0]), arm("native-offload", stock, jct[1]),
                arm("continuum-native-offload", plugin, jct[2]), arm("continuum-native-prefetch", prefetch, jct[3])]

    # Seed 7 misses 2x its oracle (one burst), seeds 8 and 9 are within theirs: the mean decides.
    lines, readme = sec.ttft_seed_section("h100-llama8b", 1.0, "256", {
        "7": draw(0.22, 1.6, 0.51, 0.49), "8": draw(0.21, 0.34, 0.26, 0.24), "9": draw(0.20, 0.5, 0.30, 0.28)})
    assert readme[-1] == ("Mean TTFT under native offloading, h100-llama8b, 256 GiB, 1 sessions/min, over seeds "
                          "7, 8, 9 (bar: 2x the oracle's 0.21 s = 0.42 s): native-offload 0.81 s, "
                          "continuum-native-offload 0.36 s, continuum-native-prefetch 0.34 s; mean JCT of "
                          "continuum-native-prefetch -0.20% against native-offload's.")
    text = "\n".join(lines)
    assert "| 7 | 0.220 | 0.440 | 1.600 | 0.510 | 0.490 | -0.20% |" in text  # prefetch JCT vs stock + native
    assert "| mean of 3 | 0.210 | 0.420 | 0.813 | 0.357 | 0.337 | -0.20% |" in text
    assert ("- `continuum-native-prefetch`: mean TTFT 0.337 s over seeds 7, 8, 9, within 2x the oracle's mean "
            "(0.420 s); within on 2 of 3 draws; mean JCT 1008.0 s against stock + native offloading's 1010.0 s "
            "(-0.20%).") in lines
    assert any(v.startswith("- `native-offload`: mean TTFT 0.813 s over seeds 7, 8, 9, above 2x") for v in lines)
    assert not any(v.startswith("- `native-offload`") and "mean JCT" in v for v in lines)  # not against itself
    # A draw that lacks an arm (an interrupted run) says nothing about the bar; none at all: no section.
    lines, _ = sec.ttft_seed_section("h100-llama8b", 1.0, "256", {"7": draw(0.22, 1.6, 0.51, 0.49),
                                                                  "8": draw(0.21, 0.34, 0.26, 0.24)[:3]})
    assert "| mean of 1 | 0.220 | 0.440 |" in "\n".join(lines)
    assert sec.ttft_seed_section("h100-llama8b", 1.0, "256", {"8": []}) == ([], [])


def test_the_verdict_says_what_bounds_the_plugins_ratio_over_stock_native_offloading():
    rates = [0.25, 0.5, 1.0, 1.5]
    assert sec.offload_verdict(0.5, 0.25, 0.5, rates).startswith("2.00x: the 1.5x bar holds")
    # Stock with native offloading already at the oracle's capacity: nothing serves more on the sweep.
    tied = sec.offload_verdict(0.5, 0.5, 0.5, rates)
    assert "1.00x: the 1.5x bar is not reached" in tied and "already sustains the oracle's 0.5/min" in tied
    assert "serves fewer" in sec.offload_verdict(0.25, 0.5, 1.0, rates)
    assert sec.offload_verdict(None, 0.25, 0.5, rates).startswith("not comparable")
    # A sweep without a rate at 1.5x stock's cannot show the bar.
    assert "the sweep has no rate at 1.5x stock's 0.5/min" in sec.offload_verdict(0.5, 0.5, 0.6, [0.25, 0.5, 0.6])
    # The oracle itself misses the SLO within 1.5x stock's capacity: the GPU's compute bounds every policy,
    # and that is said before the weaker "stock already sustains the oracle's capacity".
    grid = [0.3, 0.35, 0.4, 0.45, 0.5, 0.525, 0.75]
    bounded = sec.offload_verdict(0.4, 0.35, 0.5, grid, oracle_rates=grid)
    assert bounded.startswith("1.14x: the 1.5x bar is not reached")
    assert ("the oracle (a pool that never evicts) misses the SLO at 0.525/min, within 1.5x stock + native "
            "offloading's 0.35/min") in bounded
    assert "misses the SLO at 0.5/min" in sec.offload_verdict(0.375, 0.375, 0.375, [0.25, 0.375, 0.5],
                                                             oracle_rates=[0.25, 0.375, 0.5])
    # Only a rate the oracle ran and missed proves it: 0.75 is past the bar and says nothing.
    assert "misses" not in sec.offload_verdict(0.4, 0.35, 0.5, grid, oracle_rates=[0.3, 0.5, 0.75])
    # The oracle sustains the bar's rate: the arm's own retention falls short, not the GPU.
    open_bar = sec.offload_verdict(0.4, 0.35, 0.525, grid, oracle_rates=grid)
    assert "the oracle (a pool that never evicts) sustains 0.525/min, at least 1.5x" in open_bar
    assert "keeps too little of what the sessions reuse" in open_bar


def test_finer_rates_are_per_tier_and_bad_ones_name_themselves():
    import pytest

    assert cr.fine_rates("", "h100-llama8b", ["64", "256"]) == cr.DEFAULT_FINE_RATES["h100-llama8b"]
    assert cr.fine_rates("", "h100-llama8b", ["64"]) == {"64": cr.DEFAULT_FINE_RATES["h100-llama8b"]["64"]}
    assert cr.fine_rates("", "h100-llama70b-tp4", ["64", "256"]) == {}
    assert cr.fine_rates("none", "h100-llama8b", ["64"]) == {}
    assert cr.fine_rates("64=0.3,0.4; 256=0.75", "any", ["64"]) == {"64": "0.3,0.4"}  # tiers not swept drop
    with pytest.raises(ValueError, match="entry '0.3,0.4' is not TIER=R,R"):
        cr.fine_rates("0.3,0.4", "any", ["64"])
    with pytest.raises(ValueError, match="rate 'x' of tier 64 is not a positive number"):
        cr.fine_rates("64=0.3,x", "any", ["64"])
    with pytest.raises(ValueError, match="rate '-1' of tier 64"):
        cr.fine_rates("64=-1", "any", ["64"])


def test_finer_rates_decide_a_capacity_between_two_coarse_rates():
    """Stock + native offloading sustains 1/min on the coarse grid, the
    victim tier too; a finer rate between 1 and 2/min that only the victim
    tier sustains makes its capacity 1.5x stock's. Arms not run at a rate
    show `-` there, and their capacity stands on the rates they ran."""
    solo = {f"j{i}": (100.0, 1000) for i in range(10)}
    fine, slow = [110.0] * 10, [110.0] * 8 + [200.0] * 2
    base = [_point("fcfs", 1, fine), _point("fcfs", 2, slow), _point("continuum", 1, fine),
            _point("continuum", 2, slow), _point("oracle", 1, fine), _point("oracle", 1.5, fine),
            _point("oracle", 2, fine)]
    tier = [_point("native-offload", 1, fine), _point("native-offload", 2, slow),
            _point("native-offload", 1.5, slow),
            _point("continuum-native-offload", 1, fine), _point("continuum-native-offload", 2, slow),
            _point("continuum-native-offload", 1.5, slow),
            _point("continuum-offload", 1, fine), _point("continuum-offload", 2, slow),
            _point("continuum-offload", 1.5, slow),
            _point(cs.VICTIM_ARM, 1, fine), _point(cs.VICTIM_ARM, 2, slow), _point(cs.VICTIM_ARM, 1.5, fine)]
    lines, shares, capacities = sec.profile_section("h100-llama8b", solo, base, [], [], {"64": tier}, SLO)
    assert capacities[f"{cs.VICTIM_ARM} (64 GiB)"] == 1.5
    assert capacities["native-offload (64 GiB)"] == 1
    assert capacities["fcfs"] == 1 and capacities["oracle"] == 2
    text = "\n".join(lines)
    assert f"| {cs.VICTIM_ARM} (64 GiB) | 100% | 100% | 80% | 1.5 | 2.8 | 10 | 1.50x |" in text
    assert "| fcfs | 100% | - | 80% | 1 |" in text  # not run at 1.5/min
    assert sec.offload_verdict(1.5, 1.0, 2.0, [1, 1.5, 2]).startswith("1.50x: the 1.5x bar holds")


def test_the_readme_summary_gives_each_arms_capacity_against_its_stock_reference(tmp_path):
    capacities = {
        "h100-llama8b": {"fcfs": 0.25, "native-offload (64 GiB)": 0.3, "continuum": 0.25,
                         f"{cs.VICTIM_ARM} (64 GiB)": 0.45, "oracle": 0.5, "fcfs-cap (best)": None},
        "h100-llama70b-tp4": {"fcfs": 0.125, "native-offload (64 GiB)": 0.25, "continuum": 0.125, "oracle": 0.25},
    }
    body = sec.readme_body(capacities, SLO, "docs/capacity.md")
    assert "| arm | h100-llama8b | h100-llama70b-tp4 |" in body
    assert "| fcfs | 0.25/min | 0.125/min |" in body  # the reference carries no ratio
    assert f"| {cs.VICTIM_ARM} (64 GiB) | 0.45/min (1.50x) | - |" in body  # over native at its tier; not run on 70B
    assert "| continuum | 0.25/min (1.00x) | 0.125/min (1.00x) |" in body
    assert "| fcfs-cap (best cap per rate) | none | - |" in body
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{cr.README_BEGIN}\nold\n{cr.README_END}\nafter\n")
    cr.replace_readme_block(str(readme), cr.README_BEGIN, cr.README_END, body)
    text = readme.read_text()
    assert text.startswith(f"intro\n{cr.README_BEGIN}\nSimulated") and text.endswith(f"{cr.README_END}\nafter\n")
    assert "old" not in text


def test_the_readme_summary_marks_plugin_arms_that_ran_before_the_prefill_cut():
    """A figure from code older than the plugin it describes is marked, on
    its profile only, and the note says where the page tells which runs."""
    capacities = {
        "h100-llama8b": {"native-offload (64 GiB)": 0.35, "continuum-native-offload (64 GiB)": 0.35},
        "h100-llama70b-tp4": {"native-offload (64 GiB)": 0.375, "continuum-native-offload (64 GiB)": 0.5},
    }
    body = sec.readme_body(capacities, SLO, "docs/capacity.md", {"h100-llama8b": {"continuum-native-offload (64 GiB)"}})
    assert "| continuum-native-offload (64 GiB) | 0.35/min (1.00x) † | 0.5/min (1.33x) |" in body
    assert "| native-offload (64 GiB) | 0.35/min | 0.375/min |" in body
    assert any(line.startswith("† ran before `cut_long_prefills`") for line in body)
    assert not any("†" in line for line in sec.readme_body(capacities, SLO, "docs/capacity.md"))


def test_slow_turns_are_split_by_cause_once_each():
    """A slow turn is counted under the first cause that applies: lost
    context first, then waiting to be scheduled, then new prefill; a turn
    within the bound or never answered is not counted."""
    from types import SimpleNamespace as T

    from benchmarks.sim.report import slow_turn_causes

    turns = [T(first_token_s=9.0, ttft_s=3.0, recomputed_tokens=5000, queueing_s=2.9),  # recomputed wins
             T(first_token_s=9.0, ttft_s=3.0, recomputed_tokens=100, queueing_s=1.5),  # queued half its TTFT
             T(first_token_s=9.0, ttft_s=3.0, recomputed_tokens=0, queueing_s=0.2),  # a long new prefill
             T(first_token_s=9.0, ttft_s=2.0, recomputed_tokens=9000, queueing_s=2.0),  # within the bound
             T(first_token_s=None, ttft_s=0.0, recomputed_tokens=0, queueing_s=0.0)]  # never answered
    assert slow_turn_causes(turns) == {"slow": 3, "recomputed": 1, "queued": 1, "new_prompt": 1}


def test_the_slow_turn_section_compares_each_arm_with_the_oracle():
    slo = cs.Slo(2.0, 1.3, 0.9)
    pts = [{"arm": "offload-victim", "slow_turns": {"slow": 71, "recomputed": 20, "queued": 35, "new_prompt": 16}},
           {"arm": "native-offload"},  # an older run without the breakdown: left out
           {"arm": "oracle", "slow_turns": {"slow": 28, "recomputed": 0, "queued": 10, "new_prompt": 18}}]
    text = "\n".join(sec.slow_turns_section("h100-llama8b", "64", 0.525, pts, slo))
    assert "| offload-victim (64 GiB) | 71 | 20 | 35 | 16 |" in text
    assert "| oracle | 28 | 0 | 10 | 18 |" in text and "native-offload" not in text
    assert "- `offload-victim (64 GiB)`: +43 slow turns over the oracle's; +20 recomputed, +25 queued." in text
    assert sec.slow_turns_section("h100-llama8b", "64", 0.525, pts[1:2], slo) == []


def test_vllms_static_chunk_cut_stands_beside_stock_and_names_the_oracle_it_bounds_with():
    solo = {f"j{i}": (100.0, 1000) for i in range(10)}
    fine, slow = [110.0] * 10, [110.0] * 8 + [200.0] * 2
    base = [_point("fcfs", 1, fine), _point("fcfs", 2, slow), _point("continuum", 1, fine),
            _point("continuum", 2, slow), _point("oracle", 1, fine), _point("oracle", 2, slow)]
    cut = cs.relabel_static_cut([_point("native-offload", 1, fine), _point("native-offload", 2, fine),
                                 _point("oracle", 1, fine), _point("oracle", 2, fine)])
    assert {p["arm"] for p in cut} == {"native-offload-cut4096", "oracle-cut4096"}
    tier = [_point("native-offload", 1, fine), _point("native-offload", 2, slow),
            *[p for p in cut if p["arm"] != "oracle-cut4096"]]
    pts = base + [p for p in cut if p["arm"] == "oracle-cut4096"]
    lines, _, capacities = sec.profile_section("h100-llama8b", solo, pts, [], [], {"64": tier}, SLO)
    text = "\n".join(lines)
    # The flag's arm is compared with stock + native offloading at its tier, and the cut oracle is shown.
    assert capacities["native-offload-cut4096 (64 GiB)"] == 2 and capacities["oracle-cut4096"] == 2
    assert "| native-offload-cut4096 (64 GiB) | 100% | 100% | 2 |" in text and "| 2.00x |" in text
    assert "| oracle-cut4096 | 100% | 100% | 2 |" in text
    named = sec.offload_verdict(1, 1, 2, [1, 2], oracle_rates=[1, 2], oracle_name="the cut oracle")
    assert "the cut oracle sustains 2/min" in named


def test_an_arm_past_the_oracle_is_said_to_win_by_scheduling():
    # 70B, 64 GiB: the plugin + native offloading at 0.5/min where the oracle
    # (stock scheduling, a pool that never evicts) sustains 0.375.
    text = sec.offload_verdict(0.5, 0.375, 0.375, [0.125, 0.25, 0.375, 0.5], oracle_rates=[0.125, 0.25, 0.375, 0.5])
    assert text.startswith("1.33x: the 1.5x bar is not reached")
    assert "sustains more than the oracle (a pool that never evicts), which sustains 0.375/min" in text
    assert "the sweep has no rate at 1.5x stock's 0.375/min" in text and "misses" not in text


def test_rate_lists_merge_sorted_without_repeats():
    assert cs.rate_union("0.5,1", "0.75,1") == "0.5,0.75,1"
    assert cs.rate_union("0.25,0.5", "") == "0.25,0.5"  # a tier without finer rates


def test_the_plugin_with_native_offloading_is_judged_on_its_own_points_only():
    # An older point ran it beside the stock arms (before preempt_for_turns); its own point is the code
    # the page reports: the older run must not stand beside it as a second series of the same arm.
    stock = {"arm": "native-offload", "rate_per_min": 0.5}
    old = {"arm": cs.PLUGIN_NATIVE_ARM, "rate_per_min": 0.5, "code_commit": "old"}
    assert cs.superseded([stock, old, {"arm": "continuum-offload", "rate_per_min": 0.5}]) == [
        stock, {"arm": "continuum-offload", "rate_per_min": 0.5}]
    assert cs.PLUGIN_NATIVE_ARM in cs.OFFLOAD_ARMS and cs.PLUGIN_NATIVE_ARM in sec.NATIVE_ARMS  # what it supersedes


def test_the_seed_check_gives_each_arms_capacity_and_ratio_on_another_draw_beside_seed_7s():
    solo = {f"j{i}": (100.0, 1000) for i in range(10)}
    fine, slow = [110.0] * 10, [110.0] * 8 + [200.0] * 2  # 100% and 80% keep the SLO
    pts = [_point("native-offload", 0.3, fine), _point("native-offload", 0.4, slow), _point("native-offload", 0.5, slow),
           _point("continuum-native-offload", 0.3, fine), _point("continuum-native-offload", 0.4, fine),
           _point("continuum-native-offload", 0.5, slow),
           _point("continuum-offload-victim", 0.3, slow), _point("continuum-offload-victim", 0.4, fine),
           _point("continuum-offload-victim", 0.5, fine)]
    seed7 = {"native-offload (64 GiB)": 0.35, "continuum-native-offload (64 GiB)": 0.35,
             "continuum-offload-victim (64 GiB)": 0.45}
    lines, found = sec.seed_check_section("h100-llama8b", "64", seed7, {"8": (solo, pts)}, SLO)
    assert found == {"8": ([0.3, 0.4, 0.5], {"native-offload": 0.3, "continuum-native-offload": 0.4,
                                               "continuum-offload-victim": None})}
    text = "\n".join(lines)
    # Seed 8's capacity and ratio over stock + native offloading, then seed 7's.
    assert "| continuum-native-offload (64 GiB) | 100% | 100% | 80% | 0.4/min | 1.33x | 0.35/min | 1.00x |" in text
    # A miss at the lowest rate: below what the check ran, not "0".
    assert "| continuum-offload-victim (64 GiB) | 80% | 100% | 100% | < 0.3/min | - | 0.45/min | 1.29x |" in text
    readme = sec.seed_check_readme({"h100-llama8b": found})
    assert readme[-1] == ("On another draw of sessions (64 GiB, over `native-offload`): h100-llama8b (seed 8): "
                          "continuum-native-offload 1.33x, continuum-offload-victim below 0.3/min.")
    assert sec.seed_check_readme({}) == []


def test_a_seed_check_capacity_outside_its_rates_is_a_bound_and_so_is_its_ratio():
    solo = {f"j{i}": (100.0, 1000) for i in range(10)}
    fine, slow = [110.0] * 10, [110.0] * 8 + [200.0] * 2
    pts = [_point("native-offload", 0.3, slow), _point("native-offload", 0.5, slow),
           _point("continuum-native-offload", 0.3, slow), _point("continuum-native-offload", 0.5, fine),
           _point("continuum-offload-victim", 0.3, fine), _point("continuum-offload-victim", 0.5, fine)]
    lines, found = sec.seed_check_section("h100-llama8b", "64", {}, {"8": (solo, pts)}, SLO)
    text = "\n".join(lines)
    # Stock sustains none of the rates: the victim tier's 0.5 is more than 0.5 / 0.3 of it, and at least 0.5.
    assert "| continuum-offload-victim (64 GiB) | 100% | 100% | >= 0.5/min | > 1.67x | none | - |" in text
    assert "| native-offload (64 GiB) | 80% | 80% | < 0.3/min | - | none | - |" in text
    assert sec.seed_check_readme({"h100-llama8b": found})[-1].endswith(
        "continuum-native-offload below 0.3/min, continuum-offload-victim > 1.67x; "
        "stock + native offloading below 0.3/min.")


def test_the_seed_checks_refuse_seed_7_or_a_non_number(tmp_path):
    for flag in ("--check-seeds", "--ttft-check-seeds"):
        for bad in ("7", "x"):
            with pytest.raises(SystemExit, match=flag):
                cr.main([flag, bad, "--profiles", "", "--out", str(tmp_path), "--doc",
                         str(tmp_path / "c.md"), "--plot", str(tmp_path / "c.png"), "--readme", ""])
