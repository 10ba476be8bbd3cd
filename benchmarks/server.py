"""Start and stop a real ``vllm serve`` for tests and benchmarks.

The server is the stock OpenAI-compatible server; the plugin is active only
through its entry point. Processes are stopped by their own PID (process
group), ports are picked free, and logs go to a file kept for failures.
Unless the arguments name ``--dtype``, the server computes in
:func:`~.dtype.serving_dtype` (fp32 on CPUs without native bf16).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable, Sequence

import requests

from .dtype import serving_dtype
from .process import ManagedProcess, free_port, http_ok

__all__ = ["PluginImportError", "VLLMServer", "check_plugin_imports", "free_port", "parse_metrics", "start_all"]

# Every package of the plugin a server imports (the wheel maps three of them
# from top-level directories: pyproject's package-dir).
_PLUGIN_PACKAGES = ("vllm_continuum_plugin", "vllm_continuum_plugin.estimators",
                    "vllm_continuum_plugin.connectors", "vllm_continuum_plugin.benchmarks")


class PluginImportError(RuntimeError):
    """The interpreter a server would run in cannot import the plugin."""


@functools.lru_cache(maxsize=8)
def _plugin_import_failure(python: str, cwd: str, env_key: tuple[tuple[str, str], ...]) -> str | None:
    probe = "import importlib\n" + "".join(f"importlib.import_module({name!r})\n" for name in _PLUGIN_PACKAGES)
    done = subprocess.run([python, "-c", probe], cwd=cwd, env=dict(env_key), capture_output=True, text=True,
                          timeout=120)
    if done.returncode == 0:
        return None
    lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {done.returncode}"


def check_plugin_imports(env: dict[str, str], python: str | None = None) -> None:
    """Raise :class:`PluginImportError` unless ``python`` (this
    interpreter when None) with ``env`` (from
    this process's working directory, as the server starts) imports every
    package of the plugin. Checked once per interpreter, directory and
    environment (a fraction of a second: the packages import nothing heavy).

    Why: an editable install maps the plugin's subpackages to directories
    of the checkout it was made from; moved or re-made elsewhere (another
    clone's ``pip install -e``), the top-level package may still import from
    the working directory while ``estimators`` does not, and a server then
    starts with its request patches failed (stock arms run, silently without
    the plugin's API) or its engine core fails (plugin arms) -- after a
    benchmark has spent its earlier arms' time."""
    python = python or sys.executable
    failure = _plugin_import_failure(python, os.getcwd(), tuple(sorted(env.items())))
    if failure is not None:
        raise PluginImportError(
            f"{python} cannot import the plugin ({failure}); reinstall it from this checkout: "
            f"{python} -m pip install --no-deps -e <repository root>")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {"name{labels}": value} (first sample wins)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            values.setdefault(name, float(value))
        except ValueError:
            continue
    return values


def metric_sum(metrics: dict[str, float], prefix: str, **labels: str) -> float:
    """Sum of the samples in ``metrics`` (``parse_metrics``' output) whose
    name starts with ``prefix`` and whose labels include ``labels``."""
    wanted = {f'{k}="{v}"' for k, v in labels.items()}
    total = 0.0
    for key, value in metrics.items():
        if not key.startswith(prefix):
            continue
        if wanted:
            _, _, label_text = key.partition("{")
            if not wanted.issubset(set(label_text.rstrip("}").split(","))):
                continue
        total += value
    return total


class VLLMServer(ManagedProcess):
    """``python -m vllm.entrypoints.openai.api_server`` on a free port."""

    name = "vllm serve"

    def __init__(
        self,
        model: str,
        args: Sequence[str] = (),
        served_name: str = "model",
        aliases: Sequence[str] = (),
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 300.0,
        dtype: str | None = None,
        on_wait: Callable[[float, "VLLMServer"], None] | None = None,
        wait_report_s: float = 10.0,
    ) -> None:
        super().__init__("vllm-serve-", env)
        self.model = model
        self.served_name = served_name
        # More names the server answers to; responses carry ``served_name``
        # (vLLM reports the first), so replicas behind one router can share an
        # alias yet say which of them answered.
        self.aliases = list(aliases)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = list(args)
        if not any(a == "--dtype" or a.startswith("--dtype=") for a in self.args):
            # The fastest exact dtype for this machine (bf16 only where native).
            self.args += ["--dtype", dtype or serving_dtype()]
        self.startup_timeout_s = startup_timeout_s
        # Called every ``wait_report_s`` while the server starts (progress).
        self.on_wait = on_wait
        self.wait_report_s = wait_report_s

    def start(self) -> None:
        """Launch and wait until ``/health`` answers (or raise with the log)."""
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the process without waiting (several replicas start in
        parallel: ``launch`` each, then ``wait_ready`` each); raises
        :class:`PluginImportError` first when the server's interpreter cannot
        import the plugin."""
        check_plugin_imports(self.env, sys.executable)
        self.spawn([
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model,
            "--served-model-name", self.served_name, *self.aliases,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            *self.args,
        ])

    def wait_ready(self) -> None:
        """Wait for ``/health``, then check that the server answering on the
        port is this one (it serves this server's names): a port picked free
        can be taken by another process before this server binds it, and a
        test that then talked to that process would measure the wrong one."""
        on_wait = None if self.on_wait is None else (lambda elapsed: self.on_wait(elapsed, self))
        self.wait_until(lambda: http_ok(self.url + "/health"), self.startup_timeout_s, interval_s=1.0,
                        on_wait=on_wait, report_s=self.wait_report_s)
        served = {m["id"] for m in requests.get(self.url + "/v1/models", timeout=10).json().get("data", [])}
        if not served >= {self.served_name, *self.aliases}:
            self.stop()
            raise RuntimeError(
                f"port {self.port} is answered by a server of {sorted(served)}, not this one "
                f"({self.served_name!r}): the port was taken before this server bound it")

    def last_log_line(self, width: int = 100) -> str:
        """The server log's last non-empty line (progress while starting)."""
        lines = [line.strip() for line in self.log_tail(5).splitlines() if line.strip()]
        return lines[-1][-width:] if lines else "(no output yet)"

    def metrics(self) -> dict[str, float]:
        return parse_metrics(requests.get(self.url + "/metrics", timeout=10).text)

    def metric(self, prefix: str, **labels: str) -> float:
        """Sum of the samples whose name starts with ``prefix`` and whose
        labels include ``labels`` (exposition order does not matter)."""
        return metric_sum(self.metrics(), prefix, **labels)


def start_all(servers: Sequence[VLLMServer]) -> None:
    """Start several servers in parallel (``launch`` each, then
    ``wait_ready`` each); if one fails, stop them all and re-raise."""
    try:
        for s in servers:
            s.launch()
        for s in servers:
            s.wait_ready()
    except BaseException:
        for s in servers:
            s.stop()
        raise
