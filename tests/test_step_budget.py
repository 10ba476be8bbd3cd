"""The per-step budget benchmark runs end to end and reports every arm.

``benchmarks/step_budget.py`` on one round of two turns per phase: real
schedulers for the three policies, the hostile hints and replies it claims
to send, a classifier refit beside the ``refit`` phase, and a report that
names its command. No figure is checked against a bound here (speed lives in
the benchmark's output, docs/step_budget.md), only that the figures exist
and mean what the report says.
"""

from __future__ import annotations

from vllm_continuum_plugin.benchmarks import step_budget
from vllm_continuum_plugin.benchmarks.step_budget import MAX_HINT_CHARS, PHASES, POLICIES, REPLY_CHARS


def test_hostile_inputs_are_as_large_as_claimed_and_distinct():
    hints = [step_budget.hostile_hint(i) for i in range(8)]
    replies = [step_budget.hostile_reply(i) for i in range(8)]
    assert all(len(h) == MAX_HINT_CHARS for h in hints) and len(set(hints)) == 8
    assert all(len(r) == REPLY_CHARS for r in replies) and len(set(replies)) == 8


def test_one_round_per_phase_reports_every_policy(tmp_path):
    doc, js = tmp_path / "budget.md", tmp_path / "budget.json"
    assert step_budget.main(["--rounds", "1", "--batch", "2", "--doc", str(doc), "--json", str(js)]) == 0
    text = doc.read_text()
    assert "python -m benchmarks.step_budget --rounds 1 --batch 2" in text
    import json

    data = json.loads(js.read_text())
    rows = {(r["phase"], r["policy"]) for r in data["rows"]}
    expected = {(p, q) for p in PHASES for q in POLICIES if p != "refit" or q in ("fcfs", "context_serve")}
    assert rows == expected
    for r in data["rows"]:
        assert r["round_median_ms"] > 0 and r["turn_median_ms"] > 0
        if r["policy"] == "fcfs":
            assert abs(r["added_median_ms"]) < 1e-9
    assert data["rounds_ms"]["context_serve"]["refit_rounds"] == 1  # the refit phase ran beside a refit
