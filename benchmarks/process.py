"""A child process the tests and benchmarks start and stop by PID.

``ManagedProcess`` is what ``VLLMServer``, ``VLLMRouter`` and
``LMCacheServer`` share: the process runs in its own session (so its whole
process group -- e.g. vLLM's API server, EngineCore and worker -- is
signalled through the PID, never by name), its output goes to a log file
kept for failures (its tail is printed when a ``with`` block around it
fails), and start-up waits on a readiness check while watching for an
early exit. ``free_port`` picks the ports they listen on.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence

import requests

__all__ = ["ManagedProcess", "free_port", "http_ok"]


_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now and that this process has not
    handed out before.

    Launchers pick ports seconds before their processes bind them (vLLM
    binds after its imports), and the kernel may give a port that is free in
    that gap to the next caller; remembering what was handed out removes
    that race between the launchers of one process. (Another process can
    still take a port in the gap: ``VLLMServer.wait_ready`` checks that the
    server answering is its own.)"""
    with _handed_out_lock:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _handed_out:
                _handed_out.add(port)
                return port


def http_ok(url: str) -> bool:
    """``GET url`` answered 200 (any connection error: no)."""
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


class ManagedProcess:
    """One child process: ``spawn``, ``wait_until`` ready, ``stop``/``kill``.

    Invariant: ``proc`` is ``None`` until ``spawn``; after ``stop`` or
    ``kill`` no process of its group is left running.
    """

    name = "process"

    def __init__(self, log_prefix: str, env: dict[str, str] | None = None) -> None:
        self.env = {**os.environ, **(env or {})}
        self.log_path = tempfile.mkstemp(prefix=log_prefix, suffix=".log")[1]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "ManagedProcess":
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            # What the process saw is what explains most failures around it
            # (pytest shows a failed test's stderr).
            sys.stderr.write(f"--- {self.name} ({self.log_path}), last lines ---\n{self.log_tail(40)}\n")
        self.stop()

    def start(self) -> None:  # pragma: no cover - each launcher defines it
        raise NotImplementedError

    def spawn(self, argv: Sequence[str]) -> None:
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )

    def wait_until(
        self,
        ready: Callable[[], bool],
        timeout_s: float,
        interval_s: float = 0.5,
        on_wait: Callable[[float], None] | None = None,
        report_s: float = 10.0,
    ) -> None:
        """Poll ``ready`` until true; raise (with the log's tail) if the
        process exits first or ``timeout_s`` passes (then it is stopped).
        ``on_wait(elapsed)`` is called every ``report_s`` while waiting."""
        assert self.proc is not None, "spawn() first"
        started = time.monotonic()
        next_report = started + report_s
        while time.monotonic() < started + timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if ready():
                return
            if on_wait is not None and time.monotonic() >= next_report:
                next_report += report_s
                on_wait(time.monotonic() - started)
            time.sleep(interval_s)
        self.stop()
        raise TimeoutError(f"{self.name} not ready in {timeout_s}s:\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``."""
        if not self.alive():
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def kill(self) -> None:
        """Crash it: SIGKILL the whole process group, no shutdown path runs
        (a machine or container dying)."""
        if not self.alive():
            return
        os.killpg(os.getpgid(self.proc.pid), signal.SIGKILL)
        self.proc.wait(timeout=30)

    def log_tail(self, lines: int = 60) -> str:
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""
