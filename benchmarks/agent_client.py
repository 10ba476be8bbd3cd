"""Talking to the server: chat completions carrying the plugin's job
metadata (``extra_body={"job_id": ..., "is_last_step": ...}``), the served
model's name, and token counts from the server's tokenizer.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import openai
import requests

__all__ = [
    "ChatClient",
    "ChatReply",
    "OpenAIChatClient",
    "ServerTokenCounter",
    "fetch_default_model",
    "forced_reply_regex",
]


@dataclass(frozen=True)
class ChatReply:
    """One reply; token counts are None when the server sent no usage."""

    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None


class ChatClient(Protocol):
    def complete(self, messages: Sequence[dict[str, str]], job_id: str, is_last_step: bool) -> ChatReply:
        ...


def forced_reply_regex(programs: Iterable[str] | None = None) -> str:
    """vLLM structured-outputs regex for ``--force-bash-block``: a THOUGHT
    line and one single-line ```bash command, starting with one of
    ``programs`` when given, else with anything but a comment."""
    if programs is None:
        command = r"[^\n`#][^\n`]{0,159}"
    else:
        names = "|".join(re.escape(p) for p in sorted(programs))
        command = rf"({names})( [^\n`]{{1,150}})?"
    return rf"THOUGHT: [^\n`]{{1,160}}\n\n```bash\n{command}\n```"


class OpenAIChatClient:
    """Chat completions with the plugin's job metadata in ``extra_body``.

    ``forced_regex``, when set, constrains every reply with vLLM structured
    outputs (see ``forced_reply_regex``), for models too weak to follow the
    format; the commands are still the model's own.
    """

    def __init__(self, url: str, model: str, max_tokens: int, temperature: float,
                 request_timeout_s: float = 600.0, forced_regex: str | None = None) -> None:
        self.forced_regex = forced_regex
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._client = openai.OpenAI(
            base_url=url.rstrip("/") + "/v1",
            api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"),
            max_retries=0,
            timeout=request_timeout_s,
        )

    def complete(self, messages: Sequence[dict[str, str]], job_id: str, is_last_step: bool) -> ChatReply:
        reply = self._client.chat.completions.create(
            model=self.model,
            messages=list(messages),  # type: ignore[arg-type]
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            extra_body=self._extra_body(job_id, is_last_step),
        )
        usage = reply.usage
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        return ChatReply(
            text=reply.choices[0].message.content or "",
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            cached_tokens=getattr(details, "cached_tokens", None) if details else None,
        )

    def _extra_body(self, job_id: str, is_last_step: bool) -> dict[str, object]:
        body: dict[str, object] = {"job_id": job_id, "is_last_step": is_last_step}
        if self.forced_regex is not None:
            body["structured_outputs"] = {"regex": self.forced_regex}
        return body


def fetch_default_model(url: str, timeout_s: float = 30.0) -> str:
    """The first model id served at ``url`` (``GET /v1/models``)."""
    response = requests.get(url.rstrip("/") + "/v1/models", timeout=timeout_s)
    response.raise_for_status()
    models = response.json().get("data") or []
    if not models:
        raise RuntimeError(f"{url}/v1/models lists no models")
    return str(models[0]["id"])


class ServerTokenCounter:
    """Counts tokens with the server's tokenizer (``POST /tokenize``).

    Falls back to ``len(text) // 4`` for good once the endpoint fails
    (``used_fallback`` then says so). Results are cached; thread-safe.
    """

    def __init__(self, url: str, model: str, timeout_s: float = 30.0) -> None:
        self.endpoint = url.rstrip("/") + "/tokenize"
        self.model = model
        self.timeout_s = timeout_s
        self.used_fallback = False
        self._cache: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, text: str) -> int:
        with self._lock:
            if text in self._cache:
                return self._cache[text]
            use_server = not self.used_fallback
        n: int | None = None
        if use_server:
            try:
                response = requests.post(
                    self.endpoint,
                    json={"model": self.model, "prompt": text, "add_special_tokens": False},
                    timeout=self.timeout_s,
                )
                response.raise_for_status()
                n = int(response.json()["count"])
            except (requests.RequestException, KeyError, TypeError, ValueError):
                n = None
        with self._lock:
            if n is None:
                self.used_fallback = True
                n = len(text) // 4
            self._cache[text] = n
        return n
