"""A server is not started from an interpreter that cannot import the plugin.

An editable install maps the plugin's subpackages to the checkout it was made
from; re-made from another clone, the top-level package still imports from
the working directory while ``estimators`` does not, and ``vllm serve`` then
runs stock arms without the plugin's request patches and fails plugin arms
at engine start-up, after a benchmark has spent its earlier arms' time.
"""

from __future__ import annotations

import os
import sys

import pytest

from vllm_continuum_plugin.benchmarks.server import PluginImportError, VLLMServer, check_plugin_imports


def _interpreter_without_the_plugin() -> str:
    """The base interpreter of this venv: the repository's top-level package
    imports from the working directory, its mapped subpackages do not."""
    base = os.path.join(sys.base_prefix, "bin", "python3")
    if sys.base_prefix == sys.prefix or not os.path.exists(base):  # not in a venv
        pytest.skip("no interpreter outside this environment to check against")
    return base


def _environment() -> dict[str, str]:
    """This process's environment without a PYTHONPATH of its own."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_the_installed_plugin_passes():
    check_plugin_imports(dict(os.environ))


def test_an_interpreter_that_cannot_import_the_subpackages_is_refused(monkeypatch):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.chdir(repo)  # as a benchmark starts its servers: the top-level package is here
    python = _interpreter_without_the_plugin()
    with pytest.raises(PluginImportError, match=r"cannot import the plugin .*vllm_continuum_plugin\.\w+"):
        check_plugin_imports(_environment(), python=python)


def test_launch_checks_before_it_spawns(monkeypatch):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    server = VLLMServer("unused-model")
    server.env = _environment()
    monkeypatch.setattr(sys, "executable", _interpreter_without_the_plugin())
    with pytest.raises(PluginImportError):
        server.launch()
    assert server.proc is None  # nothing was started
