"""The machine a live measurement runs on: its CPU model, its load, and the
other heavy processes (vLLM servers, aiperf, simulator runs) that would skew
a timing. Used by ``validate`` and ``cpu_fit``; nothing here imports vLLM.
"""

from __future__ import annotations

import os
import platform
import subprocess

__all__ = ["BUSY_PATTERN", "busy_processes", "load_average", "lscpu_model"]

BUSY_PATTERN = "vllm serve|aiperf|benchmarks.simulate"


def lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or "unknown"


def busy_processes(own: set[int] | None = None) -> list[str]:
    """Other processes matching ``BUSY_PATTERN`` (read-only pgrep)."""
    own = own or set()
    try:
        out = subprocess.run(["pgrep", "-af", BUSY_PATTERN], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    lines = []
    for line in out.splitlines():
        pid = int(line.split()[0])
        if pid in own or pid == os.getpid() or "pgrep" in line:
            continue
        lines.append(line[:160])
    return lines


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"
