"""Read a finished turn's reply in the EngineCore: text, stop strings, tool call.

The scheduler only has token ids; whether a turn ended normally (a stop
string looks like an abort to the engine), which tool it calls and whether
an untagged prompt continues an earlier turn all need text. This class owns
the tokenizer lookup and every decode, so a tokenizer problem degrades to
"no tool call" (stock behaviour) and never reaches the engine loop.

Invariants: no method raises on a tokenizer failure; decoding keeps special
tokens (many delimit tool calls: ``<tool_call>``, ``[TOOL_CALLS]``,
``<|call|>``, ``<|python_tag|>``) and drops trailing stop tokens; a reply is
decoded from at most its last ``REPLY_TAIL_TOKENS`` tokens (the tool call
sits at the end).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from vllm.v1.request import Request, RequestStatus

from .estimators.parser import ToolCall, extract_tool_call, parsed_prefix, shell_call
from .metadata import JobMetadata

logger = logging.getLogger("vllm.continuum_plugin")

__all__ = ["REPLY_TAIL_TOKENS", "ReplyReader", "stop_token_ids"]

REPLY_TAIL_TOKENS = 512
_NORMAL_FINISH = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)


def stop_token_ids(request: Request) -> frozenset[int]:
    """Token ids that end ``request``'s generation (EOS and stop tokens)."""
    params = request.sampling_params
    if params is None:
        return frozenset()
    # (The engine adds the model's EOS to all_stop_token_ids.)
    ids = set(params.all_stop_token_ids)
    if params.eos_token_id is not None:
        ids.add(params.eos_token_id)
    return frozenset(ids)


# Agents re-run the same commands: a hint is parsed once. The cache is keyed
# by what is parsed of a hint (``parsed_prefix``: at most MAX_PARSED_CHARS
# bytes of text, shared with the cached call's ``command``), so each entry
# holds one parsed call (<= 8 KB, see ``ToolCall``) and the cache <= 8 MB.
_hinted_shell_call = functools.lru_cache(maxsize=1024)(shell_call)


class ReplyReader:
    """Decodes and interprets finished requests' replies (see module doc)."""

    def __init__(self, load_tokenizer: Callable[[], Any], pin_on_stop_string: bool) -> None:
        # Called once, on first use (the engine's tokenizer may not exist yet
        # when the scheduler is built).
        self._load_tokenizer = load_tokenizer
        self._pin_on_stop_string = pin_on_stop_string
        self._tokenizer: Any = None
        self._tokenizer_failed = False
        # token ids -> text, special tokens kept (see _decoder).
        self._decode: Callable[[list[int]], str] | None = None

    def _get_tokenizer(self) -> Any:
        if self._tokenizer is None and not self._tokenizer_failed:
            try:
                self._tokenizer = self._load_tokenizer()
            except Exception:
                self._tokenizer = None
            if self._tokenizer is None:
                logger.warning("vllm-continuum-plugin: no tokenizer; tool calls will not be parsed")
            self._tokenizer_failed = self._tokenizer is None
        return self._tokenizer

    def _decoder(self) -> Callable[[list[int]], str] | None:
        if self._decode is None:
            tokenizer = self._get_tokenizer()
            if tokenizer is None:
                return None
            # A fast tokenizer's Rust backend decodes without transformers'
            # Python wrapper (about 3x cheaper per finished turn on the
            # engine thread) and without its clean-up of spaces, so the text
            # is what the model emitted.
            backend = getattr(tokenizer, "backend_tokenizer", None)
            if backend is not None and callable(getattr(backend, "decode", None)):
                self._decode = lambda ids: backend.decode(ids, skip_special_tokens=False)
            else:
                self._decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
        return self._decode

    def can_read(self) -> bool:
        """Can replies be decoded (a tokenizer is available)? Without one a
        reply's "no tool call" means "not read", never "none made"."""
        return self._decoder() is not None

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``, special tokens kept ("" without a tokenizer,
        so implicit jobs then never match)."""
        decode = self._decoder()
        if decode is None:
            return ""
        try:
            return decode(list(token_ids))
        except Exception:  # a tokenizer bug must not take the engine down
            logger.debug("continuum: could not decode %d tokens", len(token_ids), exc_info=True)
            return ""

    def reply_text(self, request: Request) -> str:
        """The end of ``request``'s reply, trailing stop tokens dropped
        ("" without a tokenizer)."""
        tail = list(request.output_token_ids[-REPLY_TAIL_TOKENS:])
        stop = stop_token_ids(request)
        while tail and tail[-1] in stop:
            tail.pop()
        return self.decode(tail)

    def finished_normally(self, request: Request) -> tuple[bool, str | None]:
        """(finished normally?, decoded reply or None when not decoded)."""
        if request.status in _NORMAL_FINISH:
            return True, None
        if request.status != RequestStatus.FINISHED_ABORTED or not self._pin_on_stop_string:
            return False, None
        # The API server detects stop strings and aborts the request, which
        # the engine cannot tell from a client disconnect: look for the stop
        # string in the reply itself.
        stops = request.sampling_params.stop if request.sampling_params is not None else None
        if not stops or request.num_output_tokens == 0:
            return False, None
        text = self.reply_text(request)
        cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
        if cut < 0:
            return False, None
        return True, text[:cut]

    def tool_call(self, meta: JobMetadata, request: Request, reply_text: str | None) -> ToolCall | None:
        """The tool the finished turn calls: client hints first, else parsed
        from the reply (decoded here unless a stop-string check already did)."""
        if meta.tool_command:
            return _hinted_shell_call(parsed_prefix(meta.tool_command))
        if meta.tool_name:
            return ToolCall(meta.tool_name, meta.tool_name, (meta.tool_name,))
        if reply_text is None and request.num_output_tokens > 0:
            reply_text = self.reply_text(request)
        return extract_tool_call(reply_text) if reply_text else None
