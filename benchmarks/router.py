"""A real ``vllm-router`` process in front of several ``vllm serve`` replicas.

``vllm-router`` (PyPI ``vllm-router``, pinned by ``scripts/setup.sh`` in its
own venv) is a Python console script that runs the Rust router in the same
process, so the PID started here is the router; it is stopped by that PID.

Facts this launcher relies on (vllm-router 0.1.17, measured here):

* ``--policy consistent_hash`` keys a chat request on the first of the
  headers ``x-session-id``, ``x-user-id``, ``x-tenant-id``,
  ``x-correlation-id``, ``x-request-id``, ``x-trace-id`` (not configurable;
  body fields such as ``job_id`` are not read, and a request with none of
  them always goes to the same worker). A job's turns therefore stay on one
  replica when its client sends ``X-Session-ID: <job id>`` -- which the
  plugin also accepts as the job id.
* ``cache_aware`` (the router's default) routes by longest shared prefix with
  load balancing; in 0.1.17 its prefix tree is built with one worker, so a
  sequential stream of new conversations all goes to one replica and only
  load imbalance spreads them (see docs/scaling-out.md).
* It opens its port once one worker answers ``/health`` (and counts workers
  it never reached as healthy), so ``start`` first waits for every worker.
  Readiness: ``GET /readiness`` answers 200.
* A retry re-runs the policy: with consistent hashing a dead worker is
  picked again until 10 failures open its circuit breaker, after which its
  keys move to the next worker on the ring; health checks (1 s, 2 failures
  here) take it out without traffic. Only the dead worker's keys move.
* It always starts a Prometheus exporter (default port 29000), so every
  router gets its own free ``--prometheus-port``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence

from .process import ManagedProcess, free_port, http_ok

ROUTER_VENV_ENV = "CONTINUUM_ROUTER_VENV"
DEFAULT_ROUTER_VENV = os.path.expanduser("~/.venvs/vllm-continuum-router")
POLICIES = ("round_robin", "consistent_hash", "cache_aware", "random", "power_of_two", "sticky_least_loaded")


def router_executable() -> str:
    """The ``vllm-router`` script: ``$CONTINUUM_ROUTER_VENV`` (default
    ``~/.venvs/vllm-continuum-router``), else ``PATH``."""
    venv = os.environ.get(ROUTER_VENV_ENV, DEFAULT_ROUTER_VENV)
    candidate = os.path.join(venv, "bin", "vllm-router")
    if os.path.exists(candidate):
        return candidate
    found = shutil.which("vllm-router")
    if found is None:
        raise FileNotFoundError(
            f"vllm-router not found in {candidate} or on PATH: run scripts/setup.sh "
            "(or pip install vllm-router==0.1.17)")
    return found


class VLLMRouter(ManagedProcess):
    """One router process over ``worker_urls`` with one routing ``policy``."""

    name = "vllm-router"

    def __init__(
        self,
        worker_urls: Sequence[str],
        policy: str,
        health_interval_s: int = 1,
        health_failures: int = 2,
        breaker_timeout_s: int = 5,
        extra_args: Sequence[str] = (),
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown router policy {policy!r}; known: {', '.join(POLICIES)}")
        if not worker_urls:
            raise ValueError("a router needs at least one worker URL")
        super().__init__("vllm-router-")
        self.worker_urls = list(worker_urls)
        self.policy = policy
        self.port = free_port()
        self.prometheus_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [
            router_executable(),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.prometheus_port),
            "--policy", policy,
            "--worker-startup-check-interval", "1",
            "--health-check-interval-secs", str(health_interval_s),
            "--health-failure-threshold", str(health_failures),
            "--health-success-threshold", "1",
            "--cb-timeout-duration-secs", str(breaker_timeout_s),
            *extra_args,
            "--worker-urls", *self.worker_urls,  # nargs='*': last
        ]

    def start(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        for url in self.worker_urls:  # the router itself waits for one only
            while not http_ok(url + "/health"):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"worker {url} not healthy in {timeout_s}s")
                time.sleep(0.2)
        self.spawn(self.argv)
        self.wait_until(lambda: http_ok(self.url + "/readiness"), max(1.0, deadline - time.monotonic()),
                        interval_s=0.1)
