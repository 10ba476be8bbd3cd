"""The A/B runner's client: seeded agent jobs replayed against a server.

Each job re-sends its whole conversation every turn (streamed, usage
included), sleeps its tool time between turns and records per-turn TTFT,
latency, prompt and cached tokens; ``run_jobs`` runs a whole set of jobs at
their Poisson arrival times. Used by ``ab_benchmark`` (one server per arm)
and ``router_ab`` (replicas behind a router).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import openai
import requests

from .mswea_agents import FINISH, hermes_regex
from .server import parse_metrics
from .workload import Job

# mini-swe-agent's bash tool, as it sends it.
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash", "description": "Execute a bash command",
        "parameters": {"type": "object", "required": ["command"],
                       "properties": {"command": {"type": "string", "description": "The bash command to execute"}}},
    },
}
NATIVE_MAX_TOKENS = 128


_WORDS = (
    "the file test function error value return module class import line call "
    "result output path data list string number check build run fix patch "
    "change update config option input index buffer token cache block queue "
    "request server client agent tool shell command status branch commit diff "
    "assert expected actual failed passed warning debug trace stack frame source"
).split()


def synthetic_text(tag: str, tokens: int, seed: int) -> str:
    """About ``tokens`` tokens of text, unique to ``tag`` (so different jobs
    never share a prefix beyond the system prompt)."""
    import random

    rng = random.Random(f"{tag}:{seed}")
    words = [tag] + [rng.choice(_WORDS) for _ in range(max(0, tokens - 1))]
    return " ".join(words)


@dataclass
class TurnRecord:
    job_id: str
    turn: int
    start_s: float
    ttft_s: float
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    error: str | None = None


@dataclass
class JobRecord:
    job_id: str
    arrival_s: float
    finish_s: float | None
    jct_s: float | None
    turns: list[TurnRecord] = field(default_factory=list)
    error: str | None = None


class StreamCut(RuntimeError):
    """A streamed reply broke off: its connection was cut mid-body (a replica
    killed while it streamed; the router passes the cut on) or it ended
    before its final (usage) chunk."""


# Seconds before re-asking a broken reply, times the attempt number: long
# enough for a router's health check (1 s here) to take a dead replica out,
# so the retry reaches a live one.
TURN_RETRY_BACKOFF_S = 1.0


class AgentReplayer:
    """Replays one job's turns against the server (asyncio).

    ``native``: replies are forced native tool calls (see module doc);
    ``tagged``: requests carry ``job_id`` / ``is_last_step`` / the tool hint;
    ``session_header``: requests carry ``X-Session-ID: <job id>``.
    """

    def __init__(self, client: openai.AsyncOpenAI, model: str, system_prompt: str, seed: int,
                 native: bool = False, tagged: bool = True, session_header: bool = False,
                 turn_retries: int = 0) -> None:
        self.client = client
        self.model = model
        self.system_prompt = system_prompt
        self.seed = seed
        self.native = native
        self.tagged = tagged
        # X-Session-ID: <job id> on every turn (what routers hash on).
        self.session_header = session_header
        # A reply whose stream breaks off (``StreamCut``) is asked again this
        # many times, after a backoff, as an agent harness re-asks a broken
        # reply. (Errors before any reply -- refused connections, 5xx -- are
        # the OpenAI client's own ``max_retries``.)
        self.turn_retries = turn_retries

    async def run(self, job: Job, t0: float) -> JobRecord:
        await asyncio.sleep(max(0.0, t0 + job.arrival_s - time.time()))
        record = JobRecord(job.job_id, job.arrival_s, None, None)
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system_prompt}]
        call_id: str | None = None
        try:
            for turn in job.turns:
                if turn.index == 0:
                    content = synthetic_text(job.job_id, turn.new_tokens, self.seed)
                else:
                    content = synthetic_text(f"{job.job_id}-out{turn.index}", turn.new_tokens, self.seed)
                if call_id is not None:  # the tool's output answers the call
                    messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
                else:
                    messages.append({"role": "user", "content": content})
                last = turn.index == job.num_turns - 1
                for attempt in range(self.turn_retries + 1):
                    try:
                        turn_record, reply, calls = await self._turn(
                            job, turn.index, turn.output_tokens, turn.tool_command, messages, last)
                        break
                    except StreamCut:
                        if attempt == self.turn_retries:
                            raise
                        await asyncio.sleep(TURN_RETRY_BACKOFF_S * (attempt + 1))
                record.turns.append(turn_record)
                if calls:
                    messages.append({"role": "assistant", "content": reply or None, "tool_calls": calls})
                    call_id = calls[-1]["id"]
                else:
                    messages.append({"role": "assistant", "content": reply})
                    call_id = None
                if not last:
                    await asyncio.sleep(turn.tool_seconds)
            record.finish_s = time.time() - t0
            record.jct_s = record.finish_s - job.arrival_s
        except Exception as e:  # reported per job, never dropped
            record.error = f"{type(e).__name__}: {e}"[:300]
        return record

    async def _turn(self, job: Job, index: int, max_tokens: int, tool_command: str,
                    messages: list[dict[str, Any]], last: bool) -> tuple[TurnRecord, str, list[dict[str, Any]]]:
        extra: dict[str, Any] = {}
        if self.tagged:
            extra |= {"job_id": job.job_id, "is_last_step": last}
            if tool_command:
                extra["tool_command"] = tool_command
        kwargs: dict[str, Any] = {}
        if self.native:
            command = FINISH if last else (tool_command or "ls")
            extra["structured_outputs"] = {"regex": hermes_regex(command)}
            kwargs["tools"] = [BASH_TOOL]
            max_tokens = NATIVE_MAX_TOKENS
        else:
            extra["ignore_eos"] = True
        start = time.time()
        first: float | None = None
        pieces: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage = None
        stream = await self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=max_tokens, temperature=0.0,
            stream=True, stream_options={"include_usage": True}, extra_body=extra,
            extra_headers={"X-Session-ID": job.job_id} if self.session_header else None, **kwargs,
        )
        try:
            async for chunk in stream:
                delta = chunk.choices[0].delta if chunk.choices else None
                if delta is not None and (delta.content or delta.tool_calls):
                    if first is None:
                        first = time.time()
                    if delta.content:
                        pieces.append(delta.content)
                    for piece in delta.tool_calls or ():
                        call = calls.setdefault(piece.index, {"id": "", "type": "function",
                                                              "function": {"name": "", "arguments": ""}})
                        call["id"] = piece.id or call["id"]
                        if piece.function is not None:
                            call["function"]["name"] += piece.function.name or ""
                            call["function"]["arguments"] += piece.function.arguments or ""
                if chunk.usage is not None:
                    usage = chunk.usage
        except openai.APIConnectionError as e:  # the OpenAI client's wrap of a cut body
            raise StreamCut(f"job {job.job_id} turn {index}: the stream broke off ({e.__cause__!r})") from e
        end = time.time()
        if usage is None:
            raise StreamCut(f"job {job.job_id} turn {index}: the stream ended without its usage chunk")
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        return TurnRecord(
            job_id=job.job_id, turn=index, start_s=start, ttft_s=(first or end) - start,
            latency_s=end - start,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            cached_tokens=(details.cached_tokens or 0) if details else 0,
            output_tokens=usage.completion_tokens if usage else 0,
        ), "".join(pieces), [calls[i] for i in sorted(calls)]


class KVSampler(threading.Thread):
    """Samples KV usage and pinned blocks from /metrics while an arm runs."""

    def __init__(self, url: str, interval_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.interval_s = interval_s
        self.samples: list[tuple[float, float, float]] = []
        self._stop_event = threading.Event()
        self._t0 = time.time()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            try:
                m = parse_metrics(requests.get(self.url + "/metrics", timeout=5).text)
            except requests.RequestException:
                continue
            self.samples.append((
                time.time() - self._t0,
                metric_total(m, "vllm:kv_cache_usage_perc"),
                metric_total(m, "vllm_continuum:pinned_blocks"),
            ))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


def metric_total(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(prefix))


async def run_jobs(url: str, model: str, jobs: list[Job], seed: int, max_concurrency: int, progress: bool,
                   native: bool = False, tagged: bool = True, session_header: bool = False,
                   max_retries: int = 0, turn_retries: int = 0) -> tuple[list[JobRecord], float]:
    import httpx

    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
    client = openai.AsyncOpenAI(
        base_url=url + "/v1", api_key="unused", max_retries=max_retries, timeout=600,
        http_client=httpx.AsyncClient(limits=limits, timeout=600),
    )
    system_prompt = synthetic_text("system", jobs[0].system_tokens if jobs else 120, 0)
    replayer = AgentReplayer(client, model, system_prompt, seed, native=native, tagged=tagged,
                             session_header=session_header, turn_retries=turn_retries)
    t0 = time.time() + 0.5
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), desc="jobs", unit="job", leave=False)

    async def one(job: Job) -> JobRecord:
        record = await replayer.run(job, t0)
        if bar is not None:
            bar.update(1)
        return record

    records = await asyncio.gather(*(one(j) for j in jobs))
    makespan = time.time() - t0
    if bar is not None:
        bar.close()
    await client.close()
    return list(records), makespan
