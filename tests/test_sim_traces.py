"""The kv-cache-tester trace reader (benchmarks/sim/traces.py), its statistics
(benchmarks/sim/trace_stats.py) and the shipped subset
(benchmarks/data/claude_code_traces). Pure logic: no vLLM."""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.sim.trace_stats import main, summarize  # noqa: E402
from benchmarks.sim.traces import (  # noqa: E402
    DEFAULT_TRACE_DIR, MAIN_KINDS, TraceFormatError, TraceSession,
    load_trace_dir, load_trace_file)


def _load_build_script() -> Any:
    path = REPO_ROOT / "scripts" / "build_trace_subset.py"
    spec = importlib.util.spec_from_file_location("build_trace_subset", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def shipped() -> list[TraceSession]:
    sessions, skipped = load_trace_dir(DEFAULT_TRACE_DIR, strict=True)
    assert skipped == []
    return sessions


def _req(t: float, n_in: int, ids: list[int], **kw: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "t": t, "type": "n", "model": "m", "in": n_in, "out": 10,
        "hash_ids": ids, "input_types": ["tool_result"],
        "output_types": ["tool_use"], "stop": "tool_use", "api_time": 1.0,
        "think_time": 2.0,
    }
    r.update(kw)
    return r


def _session(requests: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": "trace_x", "models": ["m"], "block_size": 64,
            "hash_id_scope": "local", "system_tokens": 10, "tool_tokens": 20,
            "requests": requests}


def _write(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj))
    return path


# ---------------------------------------------------------------- the subset


def test_shipped_subset_loads(shipped: list[TraceSession]) -> None:
    assert 40 <= len(shipped) <= 60
    names = [Path(s.source).name for s in shipped]
    assert names == sorted(names)
    assert all(s.session_id == Path(s.source).name.removesuffix(".json")
               for s in shipped)
    for name in ("LICENSE", "NOTICE", "README.md"):
        assert (DEFAULT_TRACE_DIR / name).is_file()
    total = sum(p.stat().st_size for p in DEFAULT_TRACE_DIR.glob("*.json"))
    assert total < 6.5e6


def test_main_requests_in_time_order(shipped: list[TraceSession]) -> None:
    for s in shipped:
        main_reqs = s.main_requests()
        assert len(main_reqs) >= 2, s.source
        assert main_reqs[0].t == 0.0
        assert all(a.t <= b.t for a, b in zip(main_reqs, main_reqs[1:]))
        assert all(r.is_main and r.kind in MAIN_KINDS for r in main_reqs)
        assert all(a.t <= b.t for a, b in zip(s.requests, s.requests[1:]))
        assert len(s.requests) == len(main_reqs) + sum(
            len(sub.requests) for sub in s.subagents)


def test_one_hash_id_per_full_block(shipped: list[TraceSession]) -> None:
    """The real invariant: ``len(hash_ids) == in // block_size`` exactly;
    the ``in % block_size`` tail tokens have no id."""
    for s in shipped:
        assert s.block_size == 64 and s.hash_id_scope == "local"
        for r in s.requests:
            assert len(r.hash_ids) == r.input_tokens // s.block_size
            assert 0 <= r.input_tokens - len(r.hash_ids) * s.block_size < 64


def test_hash_ids_are_prefix_chains(shipped: list[TraceSession]) -> None:
    extends = pairs = 0
    for s in shipped:
        s.check_hash_chain()
        main_reqs = s.main_requests()
        for a, b in zip(main_reqs, main_reqs[1:]):
            pairs += 1
            extends += b.hash_ids[:len(a.hash_ids)] == a.hash_ids
    assert extends / pairs > 0.9


def test_shipped_subagents(shipped: list[TraceSession]) -> None:
    with_subs = [s for s in shipped if s.subagents]
    assert with_subs
    for s in with_subs:
        main_ids = {h for r in s.main_requests() for h in r.hash_ids}
        for sub in s.subagents:
            assert sub.duration_ms is not None
            assert sub.start_s == pytest.approx(sub.end_s -
                                                sub.duration_ms / 1000)
            assert sub.requests and sub.requests[0].t == sub.start_s
            assert all(r.agent_id == sub.agent_id for r in sub.requests)
            # As in every upstream file: no block shared with the parent.
            assert not main_ids & {h for r in sub.requests
                                   for h in r.hash_ids}
        assert s.conversations()[None] == s.main_requests()


def test_shipped_subset_follows_its_rule(
        shipped: list[TraceSession]) -> None:
    build = _load_build_script()
    for s in shipped:
        assert build.is_eligible(s, Path(s.source).stat().st_size), s.source
    readme = (DEFAULT_TRACE_DIR / "README.md").read_text()
    for s in shipped:
        assert Path(s.source).name in readme


def test_main_prints_statistics(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(DEFAULT_TRACE_DIR)]) == 0
    out = capsys.readouterr().out
    assert "main requests per session p50" in out
    assert "stop == tool_use" in out


# ---------------------------------------------------------- parsing, errors


def test_malformed_file_names_file_and_field(tmp_path: Path) -> None:
    bad = _write(tmp_path / "trace_bad.json", _session([
        _req(0.0, 200, [1, 2, 3]),
        _req(5.0, 300, [1, 2, 3]),  # 300 // 64 == 4 ids expected
    ]))
    with pytest.raises(TraceFormatError) as exc:
        load_trace_file(bad)
    assert exc.value.path == str(bad)
    assert exc.value.field == "requests[1].hash_ids"
    assert str(bad) in str(exc.value) and "300 // 64 = 4" in str(exc.value)


@pytest.mark.parametrize("mutate, field", [
    (lambda s: s.pop("block_size"), "block_size"),
    (lambda s: s.update(block_size=0), "block_size"),
    (lambda s: s["requests"][0].pop("in"), "requests[0].in"),
    (lambda s: s["requests"][0].update(out=True), "requests[0].out"),
    (lambda s: s["requests"][0].update(type="x"), "requests[0].type"),
    (lambda s: s["requests"][1].update(t=-1.0), "requests[1].t"),
    (lambda s: s["requests"][1].update(t=0.5, think_time=None),
     "requests[1].t"),  # earlier than requests[0]'s t=1.0
    (lambda s: s["requests"][1]["hash_ids"].__setitem__(0, "a"),
     "requests[1].hash_ids[0]"),
    (lambda s: s["requests"][0].update(input_types="text"),
     "requests[0].input_types"),
    (lambda s: s.update(requests=[]), "requests"),
])
def test_format_errors(tmp_path: Path, mutate: Any, field: str) -> None:
    raw = _session([_req(1.0, 130, [1, 2]), _req(5.0, 200, [1, 2, 3])])
    mutate(raw)
    path = _write(tmp_path / "t.json", raw)
    with pytest.raises(TraceFormatError) as exc:
        load_trace_file(path)
    assert exc.value.field == field
    assert str(path) in str(exc.value)


def test_not_json_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "trace_0001.json"
    path.write_text('{"id": "trace_0001", "requests": [')
    with pytest.raises(TraceFormatError, match="trace_0001.json.*not valid"):
        load_trace_file(path)


def test_dir_skips_and_reports_unparseable(tmp_path: Path,
                                           shipped: list[TraceSession]
                                           ) -> None:
    src = Path(shipped[0].source)
    shutil.copyfile(src, tmp_path / "trace_0002.json")
    (tmp_path / "trace_0001.json").write_text("not json at all")
    (tmp_path / "README.md").write_text("# not a trace")
    with gzip.open(tmp_path / "trace_0003.json.gz", "wb") as f:
        f.write(src.read_bytes())

    sessions, skipped = load_trace_dir(tmp_path)
    assert [Path(s.source).name for s in sessions] == [
        "trace_0002.json", "trace_0003.json.gz"]
    assert sessions[0].requests == sessions[1].requests
    assert len(skipped) == 1
    name, reason = skipped[0]
    assert name == "trace_0001.json" and "not valid JSON" in reason

    assert len(load_trace_dir(tmp_path, limit=1)[0]) == 1
    with pytest.raises(TraceFormatError, match="trace_0001.json"):
        load_trace_dir(tmp_path, strict=True)
    with pytest.raises(FileNotFoundError):
        load_trace_dir(tmp_path / "missing")


def test_subagent_times_and_ordering(tmp_path: Path) -> None:
    sub_reqs = [_req(0.0, 128, [50, 51], think_time=0.0),
                _req(4.0, 192, [50, 51, 52])]
    raw = _session([
        _req(0.0, 128, [1, 2], think_time=0.0),
        {"t": 20.0, "type": "subagent", "agent_id": "agent_001",
         "subagent_type": "Explore", "status": "completed",
         "duration_ms": 15000, "total_tokens": 300, "tool_use_count": 1,
         "models": ["h"], "system_tokens": 5, "tool_tokens": 6,
         "requests": sub_reqs},
        {"t": 21.0, "type": "subagent", "agent_id": "agent_002",
         "subagent_type": "Explore", "status": "async_launched",
         "duration_ms": None, "total_tokens": None, "tool_use_count": None,
         "models": ["h"], "system_tokens": 5, "tool_tokens": 6,
         "requests": [_req(0.0, 128, [50, 51], think_time=0.0)]},
        _req(22.0, 256, [1, 2, 3, 4]),
    ])
    s = load_trace_file(_write(tmp_path / "t.json", raw))
    done, launched = s.subagents
    assert (done.start_s, done.end_s) == (5.0, 20.0)
    assert [r.t for r in done.requests] == [5.0, 9.0]
    assert (launched.start_s, launched.end_s) == (21.0, 21.0)
    assert [(r.t, r.agent_id) for r in s.requests] == [
        (0.0, None), (5.0, "agent_001"), (9.0, "agent_001"),
        (21.0, "agent_002"), (22.0, None)]
    assert [r.t for r in s.main_requests()] == [0.0, 22.0]
    s.check_hash_chain()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.requests[0].t = 1.0  # type: ignore[misc]


def test_check_hash_chain_rejects_reused_ids(tmp_path: Path) -> None:
    raw = _session([_req(0.0, 128, [1, 2]), _req(1.0, 128, [3, 2])])
    s = load_trace_file(_write(tmp_path / "t.json", raw))
    with pytest.raises(TraceFormatError, match="hash id 2 at position 1"):
        s.check_hash_chain()


def test_summarize_synthetic(tmp_path: Path) -> None:
    raw = _session([
        _req(0.0, 128, [1, 2], think_time=0.0),
        _req(3.0, 256, [1, 2, 3, 4], think_time=2.0),  # extends
        _req(9.0, 192, [1, 2, 5], think_time=4.0, stop="end_turn"),
    ])
    st = summarize([load_trace_file(_write(tmp_path / "t.json", raw))])
    assert (st.sessions, st.main_turns) == (1, 3)
    assert (st.first_input_p50, st.last_input_p50,
            st.peak_input_p50) == (128, 192, 256)
    assert st.growth_per_turn_mean == 32.0
    assert st.think_p50_s == 3.0
    assert st.tool_use_share == pytest.approx(2 / 3)
    assert st.prefix_extends_share == 0.5
    assert st.shrink_share == 0.5
