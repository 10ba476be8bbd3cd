"""Every test has exactly one level marker (unit / scheduler / engine / e2e),
so that `pytest -m unit` and friends select the whole suite between them and
a new test file cannot be forgotten (tests/conftest.py assigns the levels)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _conftest():
    # The conftest pytest loaded (the same module object, hence the same stash key).
    return sys.modules["conftest"]


def test_every_test_file_has_a_level():
    conftest = _conftest()
    files = {p.name for p in TESTS.glob("test_*.py")}
    missing = sorted(files - conftest.FILE_LEVELS.keys())
    assert not missing, f"add these test files to FILE_LEVELS in tests/conftest.py: {missing}"
    stale = sorted(conftest.FILE_LEVELS.keys() - files)
    assert not stale, f"FILE_LEVELS in tests/conftest.py names files that do not exist: {stale}"
    bad = {f: level for f, level in conftest.FILE_LEVELS.items() if level not in conftest.LEVELS}
    assert not bad, f"unknown levels (use one of {conftest.LEVELS}): {bad}"


def test_the_levels_are_registered_markers(pytestconfig):
    registered = {line.split(":")[0].strip() for line in pytestconfig.getini("markers")}
    assert set(_conftest().LEVELS) <= registered


def test_every_collected_test_has_exactly_one_level(request):
    """Over the tests of this session (all of them when the whole suite is
    collected, before any `-m` deselection)."""
    levels = request.config.stash[_conftest().COLLECTED_LEVELS]
    assert request.node.nodeid in levels
    wrong = {nodeid: found for nodeid, found in levels.items() if len(found) != 1}
    assert not wrong, "tests without exactly one level marker:\n" + "\n".join(
        f"  {nodeid}: {found or 'none'}" for nodeid, found in sorted(wrong.items())
    )


@pytest.mark.scheduler
def test_a_tests_own_level_replaces_its_files(request):
    # This file is "unit"; the explicit marker wins, and only it is kept.
    assert [m.name for m in request.node.iter_markers() if m.name in _conftest().LEVELS] == ["scheduler"]
