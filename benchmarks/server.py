"""Start and stop a real ``vllm serve`` for tests and benchmarks.

The server is the stock OpenAI-compatible server; the plugin is active only
through its entry point. Processes are stopped by their own PID (process
group), ports are picked free, and logs go to a file kept for failures.
Unless the arguments name ``--dtype``, the server computes in
:func:`~.dtype.serving_dtype` (fp32 on CPUs without native bf16).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import requests

from .dtype import serving_dtype

__all__ = ["VLLMServer", "free_port", "parse_metrics"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class VLLMServer:
    def __init__(
        self,
        model: str,
        args: Sequence[str] = (),
        served_name: str = "model",
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 300.0,
        dtype: str | None = None,
        on_wait: Callable[[float, "VLLMServer"], None] | None = None,
        wait_report_s: float = 10.0,
    ) -> None:
        self.model = model
        self.served_name = served_name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = list(args)
        if not any(a == "--dtype" or a.startswith("--dtype=") for a in self.args):
            # The fastest exact dtype for this machine (bf16 only where native).
            self.args += ["--dtype", dtype or serving_dtype()]
        self.env = {**os.environ, **(env or {})}
        self.startup_timeout_s = startup_timeout_s
        # Called every ``wait_report_s`` while the server starts (progress).
        self.on_wait = on_wait
        self.wait_report_s = wait_report_s
        self.log_path = tempfile.mkstemp(prefix="vllm-serve-", suffix=".log")[1]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "VLLMServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Launch and wait until ``/health`` answers (or raise with the log)."""
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the process without waiting (several replicas start in
        parallel: ``launch`` each, then ``wait_ready`` each)."""
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model,
            "--served-model-name", self.served_name,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            *self.args,
        ]
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )

    def wait_ready(self) -> None:
        assert self.proc is not None, "launch() first"
        started = time.monotonic()
        deadline = started + self.startup_timeout_s
        next_report = started + self.wait_report_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if self.on_wait is not None and time.monotonic() >= next_report:
                next_report += self.wait_report_s
                self.on_wait(time.monotonic() - started, self)
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"vllm serve not ready in {self.startup_timeout_s}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        # The server was started in its own session: signal its process
        # group (API server + EngineCore + worker), by PID, never by name.
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def kill(self) -> None:
        """Crash the replica: SIGKILL its whole process group (by PID), no
        shutdown path runs (a machine or container dying)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(os.getpgid(self.proc.pid), signal.SIGKILL)
        self.proc.wait(timeout=30)

    def last_log_line(self, width: int = 100) -> str:
        """The server log's last non-empty line (progress while starting)."""
        lines = [line.strip() for line in self.log_tail(5).splitlines() if line.strip()]
        return lines[-1][-width:] if lines else "(no output yet)"

    def log_tail(self, lines: int = 60) -> str:
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def metrics(self) -> dict[str, float]:
        return parse_metrics(requests.get(self.url + "/metrics", timeout=10).text)

    def metric(self, prefix: str, **labels: str) -> float:
        """Sum of the samples whose name starts with ``prefix`` and whose
        labels include ``labels`` (exposition order does not matter)."""
        wanted = {f'{k}="{v}"' for k, v in labels.items()}
        total = 0.0
        for key, value in self.metrics().items():
            if not key.startswith(prefix):
                continue
            if wanted:
                _, _, label_text = key.partition("{")
                if not wanted.issubset(set(label_text.rstrip("}").split(","))):
                    continue
            total += value
        return total
