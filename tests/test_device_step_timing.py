"""The GPU timing script (scripts/device_step_timing.py), checked end to end
on the CPU with its two-layer toy: it times every shape of its grid, and the
figures land beside the roofline's in the doc, between their markers,
replacing an earlier section. (On a GPU it builds the Llama-3.1-8B shape;
no GPU here.)"""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import device_step_timing as timing  # noqa: E402


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("timing") / "toy.json"
    assert timing.main(["measure", "--tiny", "--device", "cpu", "--repeats", "1", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_the_toy_times_every_shape_of_its_grid(toy):
    grid = timing.TINY_GRID
    assert {(p["new"], p["cached"]) for p in toy["prefill"]} == {
        (n, c) for n in grid["prefill_new"] for c in grid["prefill_cached"]}
    assert {(d["batch"], d["context"]) for d in toy["decode"]} == {
        (b, c) for b in grid["decode_batch"] for c in grid["decode_context"]}
    assert [c["tokens"] for c in toy["copies"]] == list(grid["copy_tokens"])
    times = [p["seconds"] for p in toy["prefill"]] + [d["seconds"] for d in toy["decode"]]
    times += [c[k] for c in toy["copies"] for k in ("h2d_seconds", "d2h_seconds")]
    assert all(t > 0 and math.isfinite(t) for t in times)
    assert toy["tiny"] and not toy["skipped"]


def test_the_toys_figures_are_refused_by_compare(toy, tmp_path):
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(toy))
    with pytest.raises(SystemExit):
        timing.main(["compare", str(path), "--doc", str(tmp_path / "doc.md")])


def test_compare_writes_the_figures_beside_the_rooflines_once(toy, tmp_path):
    # The toy's figures standing in for an H100's (only the writing is checked).
    results = dict(toy, tiny=False, device="NVIDIA H100 80GB HBM3",
                   skipped=[{"kind": "decode", "batch": 256, "context": 65536, "kv_bytes": 68 * 2**30}])
    path = tmp_path / "device_timing.json"
    path.write_text(json.dumps(results))
    doc = tmp_path / "step_models.md"
    doc.write_text("# Step models\n\nThe roofline.\n")
    for _ in range(2):  # a second run replaces the section, never appends another
        assert timing.main(["compare", str(path), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# Step models\n\nThe roofline.\n")
    assert text.count(timing.BEGIN) == 1 and text.count(timing.END) == 1
    assert "roofline step model of `h100-llama8b`" in text
    rows = [line for line in text.splitlines() if line.startswith("| prefill") or line.startswith("| decode")]
    assert len(rows) == len(toy["prefill"]) + len(toy["decode"]) + 1
    assert "| decode 256 x 65,536 | does not fit (68 GiB of KV) | | |" in text
    # Every measured row has a positive roofline figure and their ratio.
    for line in rows[:-1]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        measured, modelled, ratio = (float(c) for c in cells[1:])
        assert modelled > 0 and ratio == pytest.approx(measured / modelled, rel=0.05, abs=0.01)


def test_a_h200_is_compared_with_the_h200_profile():
    assert timing.profile_for("NVIDIA H200") == "h200-llama8b"
    assert timing.profile_for("NVIDIA H100 80GB HBM3") == "h100-llama8b"


def test_rewriting_the_step_model_comparison_keeps_the_gpu_section(toy, tmp_path):
    import compare_step_models

    results = dict(toy, tiny=False, device="NVIDIA H100 80GB HBM3")
    path = tmp_path / "device_timing.json"
    path.write_text(json.dumps(results))
    doc = tmp_path / "step_models.md"
    doc.write_text("# Step models\n")
    timing.main(["compare", str(path), "--doc", str(doc)])
    section = doc.read_text().split("# Step models\n", 1)[1]
    kept = compare_step_models.kept_device_section(str(doc))
    assert kept.strip() == section.strip() and timing.BEGIN in kept
    assert compare_step_models.kept_device_section(str(tmp_path / "none.md")) == ""
