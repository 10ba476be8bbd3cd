"""A test-only vLLM logits processor: the engine emits scripted replies.

A 135M model does not write valid tool calls, so the end-to-end tests with
real agent clients (``tests/test_e2e_agent_clients.py``) force its replies
on the server side. Everything else stays real: the client, vLLM's API
server and tool parser, the plugin, the engine (prefill, decode, KV cache,
scheduler). Only the sampled token ids are chosen here.

Loaded by ``vllm serve --logits-processors scripted_replies:ScriptedReplies``
with this directory on ``PYTHONPATH`` (vLLM 0.32's v1 logits-processor
interface: a :class:`AdapterLogitsProcessor` whose per-request callable gets
the prompt's token ids, the live list of output ids and the row of logits).

The scripts come from the JSON file named by ``CONTINUUM_SCRIPTED_REPLIES``
(read again whenever it changes, so one server can serve several tests)::

    {"scripts": [{"match": "text every prompt of this client holds",
                  "steps": [{"reply": "<tool_call>...</tool_call>", "marker": "cstep-1"},
                            ...,
                            {"reply": "Done."}]}],
     "default": "OK."}

For each new request the prompt is decoded once; the first script whose
``match`` occurs in it is used, and its step is the number of that script's
``marker`` strings already in the prompt (each scripted tool call carries its
marker in its arguments, so a prompt holds the markers of the calls it has
seen: the step works for any client that re-sends its history, with no
state kept here). A prompt that matches no script gets ``default`` (a
client's side requests: titles, summaries). After the reply the processor
forces the end-of-sequence token. Without the variable, it does nothing.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

__all__ = ["ENV", "ScriptedReplies", "choose_reply"]

ENV = "CONTINUUM_SCRIPTED_REPLIES"


def choose_reply(scripts: dict[str, Any], prompt: str) -> tuple[str, str, int]:
    """``(script match or "", reply text, step)`` for ``prompt``."""
    for script in scripts.get("scripts", []):
        if script["match"] in prompt:
            steps = script["steps"]
            step = sum(1 for s in steps if s.get("marker") and s["marker"] in prompt)
            return script["match"], steps[min(step, len(steps) - 1)]["reply"], step
    return "", scripts.get("default", "OK."), 0


class _Loader:
    """The scripts file, re-read when its mtime changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._mtime = -1.0
        self._value: dict[str, Any] = {}
        self._lock = threading.Lock()

    def get(self) -> dict[str, Any]:
        with self._lock:
            try:
                mtime = os.stat(self.path).st_mtime
            except OSError:
                return self._value
            if mtime != self._mtime:
                with open(self.path) as f:
                    self._value = json.load(f)
                self._mtime = mtime
            return self._value


class _ForcedReply:
    """One request's forcing: the reply's ids, then end of sequence."""

    def __init__(self, owner: "ScriptedReplies") -> None:
        self.owner = owner
        self.ids: list[int] | None = None

    def __call__(self, prompt_ids: list[int], output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        if self.ids is None:
            self.ids = self.owner.reply_ids(prompt_ids)
        i = len(output_ids)
        token = self.ids[i] if i < len(self.ids) else self.owner.eos_id
        forced = torch.full_like(logits, float("-inf"))
        forced[token] = 0.0
        return forced


class ScriptedReplies(AdapterLogitsProcessor):
    """Forces each request's reply to its script step (see the module doc)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(vllm_config, device, is_pin_memory)
        path = os.environ.get(ENV)
        self.loader = _Loader(path) if path else None
        self.tokenizer = None
        self.eos_id = 0
        if self.loader is not None:
            from transformers import AutoTokenizer

            model_config = vllm_config.model_config
            self.tokenizer = AutoTokenizer.from_pretrained(model_config.tokenizer)
            self.eos_id = int(self.tokenizer.eos_token_id)
        # Decisions, for a test's post-mortem: (match, step, reply head).
        self.log_path = os.environ.get(ENV + "_LOG")

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params: Any) -> _ForcedReply | None:
        return _ForcedReply(self) if self.loader is not None else None

    def reply_ids(self, prompt_ids: list[int]) -> list[int]:
        assert self.tokenizer is not None and self.loader is not None
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        match, reply, step = choose_reply(self.loader.get(), prompt)
        if self.log_path:
            with open(self.log_path, "a") as f:
                f.write(json.dumps({"match": match, "step": step, "prompt_tokens": len(prompt_ids),
                                    "reply": reply[:80]}) + "\n")
        return self.tokenizer.encode(reply, add_special_tokens=False)
