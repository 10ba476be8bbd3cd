"""The A/B client's handling of a reply that breaks off mid-stream.

When a replica dies while it streams, the router passes the cut on: the
client has its 200 and some chunks, then the connection closes without the
rest (measured: httpx's ``RemoteProtocolError`` "peer closed connection
without sending complete message body", which the OpenAI client raises as
``APIConnectionError`` from the stream and does not retry). An agent harness
re-asks such a reply; so does the replayer (``turn_retries``). Pure client
logic, so the server here is an in-process httpx transport.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from vllm_continuum_plugin.benchmarks import agent_replay
from vllm_continuum_plugin.benchmarks.agent_replay import AgentReplayer
from vllm_continuum_plugin.benchmarks.workload import Job, Turn


def _chunk(content: str | None, usage: dict | None = None) -> bytes:
    body = {
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m",
        "choices": [] if content is None else [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
        "usage": usage,
    }
    return f"data: {json.dumps(body)}\n\n".encode()


class _Body(httpx.AsyncByteStream):
    """A streamed reply; ``cut`` closes it after the first chunk, the way a
    router forwards a replica that died mid-stream."""

    def __init__(self, cut: bool) -> None:
        self.cut = cut

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield _chunk("hello")
        if self.cut:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
        yield _chunk(" world")
        yield _chunk(None, usage={"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14,
                                  "prompt_tokens_details": {"cached_tokens": 0}})
        yield b"data: [DONE]\n\n"


def _replay(cuts: int, turn_retries: int, monkeypatch: pytest.MonkeyPatch) -> tuple[agent_replay.JobRecord, int]:
    monkeypatch.setattr(agent_replay, "TURN_RETRY_BACKOFF_S", 0.0)
    requests_seen = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal requests_seen
        requests_seen += 1
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              stream=_Body(cut=requests_seen <= cuts))

    client = openai.AsyncOpenAI(base_url="http://replica/v1", api_key="unused", max_retries=0,
                                http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    replayer = AgentReplayer(client, "m", "system", seed=0, turn_retries=turn_retries)
    job = Job("job-1", 0.0, 4, (Turn(0, 8, 2, "", "", 0.0),))
    record = asyncio.run(replayer.run(job, t0=0.0))
    return record, requests_seen


def test_a_reply_cut_mid_stream_is_asked_again_and_the_job_completes(monkeypatch):
    record, requests_seen = _replay(cuts=2, turn_retries=2, monkeypatch=monkeypatch)
    assert record.error is None
    assert requests_seen == 3  # two cut replies, then a whole one
    assert [(t.turn, t.prompt_tokens, t.output_tokens) for t in record.turns] == [(0, 12, 2)]
    assert record.jct_s is not None


def test_a_reply_still_cut_after_the_retries_fails_its_job_with_the_cause(monkeypatch):
    record, requests_seen = _replay(cuts=5, turn_retries=1, monkeypatch=monkeypatch)
    assert requests_seen == 2
    assert record.turns == [] and record.jct_s is None
    assert record.error is not None and record.error.startswith("StreamCut")
    assert "RemoteProtocolError" in record.error
