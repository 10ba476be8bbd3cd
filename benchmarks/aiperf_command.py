"""How the live replay drives NVIDIA AIPerf: its command line, its
environment and its process.

:mod:`benchmarks.aiperf_replay` plans a run and starts one ``vllm serve`` per
arm; this module is the AIPerf side of an arm: the ``aiperf profile``
command (and the unscaled one a GPU user would run), the environment AIPerf
needs on these machines (online tokenizer resolution, no dataset cache, its
``X-Session-Affinity`` header on or off), and running it in its own process
group with progress lines, stopped by its PID on timeout or interrupt.

Invariant: nothing here starts or reads the server; an AIPerf process this
starts is stopped (its whole process group) before :func:`run_aiperf`
returns or raises.
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence

__all__ = [
    "AFFINITY_ENV",
    "AIPERF_VERSION",
    "DEFAULT_AIPERF_VENV",
    "aiperf_command",
    "aiperf_env",
    "aiperf_version",
    "gpu_command",
    "last_line",
    "log",
    "run_aiperf",
]

# The AIPerf release the runner is written against (scripts/setup.sh installs it).
AIPERF_VERSION = "0.13.0"
DEFAULT_AIPERF_VENV = os.environ.get("CONTINUUM_AIPERF_VENV", os.path.expanduser("~/.venvs/vllm-continuum-aiperf"))


def log(msg: str) -> None:
    """A progress line of the replay, on stderr."""
    print(f"[aiperf-replay] {msg}", file=sys.stderr, flush=True)


def aiperf_command(
    aiperf: str,
    *,
    url: str,
    model: str,
    tokenizer: str,
    traces: str,
    sessions: int,
    out_dir: str,
    concurrency: int | None = None,
    ramp_s: float | None = None,
    seed: int = 0,
    timeout_s: float | None = None,
    extra: Sequence[str] = (),
    session_header: str | None = "X-Session-ID",
    request_rate: float | None = None,
) -> list[str]:
    """The ``aiperf profile`` command line of one arm (``session_header``
    None: no session id is sent).

    ``request_rate``: AIPerf issues turns on a constant clock of that many
    per second (``--request-rate R --arrival-pattern constant``; turns still
    wait their think time, then the next tick) instead of its concurrency
    mode, whose zero-interval loop (``RequestRateStrategy.execute_phase``
    yielding to the event loop while no turn is due) keeps one CPU core busy
    for the whole replay: on a 2-core machine the core vLLM's engine process
    and API server run on. None: AIPerf's concurrency mode."""
    n = str(concurrency or sessions)
    header = ["--session-header", session_header] if session_header else []
    cmd = [
        aiperf, "profile",
        "--model", model, "--url", url, "--endpoint-type", "chat", "--streaming",
        "--tokenizer", tokenizer,
        "--custom-dataset-type", "weka_trace", "--input-file", traces,
        *header,
        "--no-fixed-schedule", "--use-think-time-only",
        "--concurrency", n, "--conversation-num", str(sessions),
        # A randomly initialised model (tiny-llama) samples special tokens
        # too; skipped, a reply can decode to nothing, which AIPerf counts as
        # an error ("no responses with actual content").
        "--extra-inputs", "ignore_eos:true", "skip_special_tokens:false",
        # Token counts from the server's usage (no client-side tokenising of
        # every reply on a 2-core machine that also runs the server).
        "--use-server-token-count",
        "--random-seed", str(seed),
        "--output-artifact-dir", out_dir,
        "--ui-type", "none", "--no-server-metrics", "--no-gpu-telemetry",
    ]
    if request_rate is not None:
        if not (math.isfinite(request_rate) and request_rate > 0):
            raise ValueError(f"request_rate must be a positive number of turns per second, got {request_rate!r}")
        cmd += ["--request-rate", f"{request_rate:g}", "--arrival-pattern", "constant"]
    if ramp_s:
        cmd += ["--concurrency-ramp-duration", f"{ramp_s:g}"]
    if timeout_s:
        cmd += ["--request-timeout-seconds", f"{timeout_s:g}"]
    return cmd + list(extra)


def gpu_command(trace_dir: str, sessions: int, model: str = "MODEL", url: str = "http://HOST:8000",
                policy: str = "POLICY") -> str:
    """The unscaled replay for a GPU user (sub-agents and all), as text."""
    return " ".join([
        "aiperf profile", "--model", model, "--url", url, "--endpoint-type chat --streaming",
        "--tokenizer", model, "--custom-dataset-type weka_trace", "--input-file", shlex.quote(trace_dir),
        "--session-header X-Session-ID --no-fixed-schedule --use-think-time-only",
        f"--concurrency {sessions} --conversation-num {sessions}",
        "--extra-inputs ignore_eos:true", f"--output-artifact-dir artifacts/{policy}",
        f"   # against: vllm serve {model} --scheduling-policy {policy}",
    ])


# AIPerf 0.13's switch for its default X-Session-Affinity header (the
# session's id, which the plugin reads as a session header).
AFFINITY_ENV = "AIPERF_HTTP_X_SESSION_AFFINITY_FROM_CORRELATION_ID"


def aiperf_env(affinity_header: bool = True) -> dict[str, str]:
    """AIPerf's environment: online mode (with ``HF_HUB_OFFLINE`` set AIPerf
    0.13 resolves even a local tokenizer directory in the hub cache and
    fails), its dataset cache off (it keys on the tokenizer *path* and could
    serve a stale tokenisation of a rebuilt model), and sub-agent chain
    splitting off (the scaled traces hold one main chain each).
    ``affinity_header`` False: AIPerf does not send its default
    ``X-Session-Affinity`` (the session id, which the plugin reads)."""
    env = dict(os.environ)
    env[AFFINITY_ENV] = "true" if affinity_header else "false"
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(k, None)
    env["AIPERF_DATASET_MMAP_CACHE_ENABLED"] = "false"
    env["AIPERF_DATASET_WEKA_SPLIT_FLATTENED_AGENTS"] = "false"
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    return env


def aiperf_version(aiperf: str) -> str | None:
    """The AIPerf version installed beside the ``aiperf`` executable (its
    venv's ``python``); None when it cannot be asked."""
    python = os.path.join(os.path.dirname(aiperf), "python")
    try:
        out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('aiperf'))"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _count_lines(path: str) -> int:
    """Non-blank lines of the file at ``path`` (0 when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def run_aiperf(cmd: Sequence[str], log_path: str, timeout_s: float, report_s: float = 30.0,
               records_path: str | None = None, expected: int | None = None,
               affinity_header: bool = True) -> int:
    """Run AIPerf in its own process group (stopped by its PID on timeout or
    interrupt), its output to ``log_path``; progress every ``report_s``
    (requests recorded so far: AIPerf appends to ``records_path`` as they
    finish). ``affinity_header``: see :func:`aiperf_env`."""
    import signal

    started = time.monotonic()
    with open(log_path, "w") as logf:
        proc = subprocess.Popen(list(cmd), stdout=logf, stderr=subprocess.STDOUT, env=aiperf_env(affinity_header),
                                start_new_session=True)
    try:
        while True:
            try:
                return proc.wait(timeout=report_s)
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - started
                if elapsed > timeout_s:
                    log(f"  aiperf still running after {elapsed:.0f}s: stopping it (pid {proc.pid})")
                    raise TimeoutError(f"aiperf exceeded {timeout_s:.0f}s")
                if records_path is not None:
                    log(f"  aiperf running {elapsed:.0f}s: {_count_lines(records_path)}"
                        f"{'' if expected is None else f'/{expected}'} requests recorded")
                else:
                    log(f"  aiperf running {elapsed:.0f}s: {last_line(log_path)}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def last_line(path: str, width: int = 110) -> str:
    """The last non-blank line of the file at ``path`` (its last ``width``
    characters; "" when it cannot be read, "(no output yet)" when it holds
    none)."""
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f.readlines()[-20:] if line.strip()]
    except OSError:
        return ""
    return lines[-1][-width:] if lines else "(no output yet)"
