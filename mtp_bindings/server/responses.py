"""The bodies of the generation responses, in OpenAI's shapes plus llama-server's ``timings``.

One job: turn text and :class:`~mtp_bindings.generation.stats.GenerationStats` into JSON-ready
dicts: the whole response, each stream chunk and the closing chunk(s). Nothing here does I/O.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..chat.reply import ReplyStream, ToolCall, parse_reply
from .logprobs import Piece, chat_logprobs, completion_logprobs

if TYPE_CHECKING:
    from ..generation.logprobs import TokenLogprob
    from ..generation.stats import GenerationStats

FINGERPRINT = f"mtp-bindings-{__version__}"


def timings(stats: GenerationStats) -> dict[str, Any]:
    """llama-server's ``timings`` object, with its draft counters: as there, ``prompt_n`` counts the
    prompt tokens decoded and ``cache_n`` those whose KV the slot's prompt cache kept."""
    prompt_ms, gen_ms = stats.t_prompt * 1e3, stats.t_generate * 1e3
    n_decoded = stats.n_prompt_decoded
    return {
        "cache_n": stats.n_prompt_cached,
        "prompt_n": n_decoded,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / n_decoded if n_decoded else 0.0,
        "prompt_per_second": stats.prompt_tokens_per_second,
        "predicted_n": stats.n_generated,
        "predicted_ms": gen_ms,
        "predicted_per_token_ms": gen_ms / stats.n_generated if stats.n_generated else 0.0,
        "predicted_per_second": stats.tokens_per_second,
        "draft_n": stats.n_drafted,
        "draft_n_accepted": stats.n_accepted,
    }


def usage(stats: GenerationStats, n_completion: int) -> dict[str, Any]:
    """OpenAI's ``usage``: ``n_completion`` counts the tokens the returned text holds (see
    :mod:`.accounting`); as llama-server, ``prompt_tokens_details.cached_tokens`` those the
    prompt cache kept."""
    return {"prompt_tokens": stats.n_prompt, "completion_tokens": n_completion,
            "total_tokens": stats.n_prompt + n_completion,
            "prompt_tokens_details": {"cached_tokens": stats.n_prompt_cached}}


def _finish(reason: str | None, tool_calls: bool = False) -> str:
    if reason == "length":
        return "length"
    return "tool_calls" if tool_calls else "stop"


@dataclass
class Reply:
    """What one response is about: its id, kind (chat or text) and the served model's name;
    with ``piece`` (a token's bytes) it reports logprobs, text offsets counted from ``offset``.
    A chat reply is split into content, ``reasoning_content`` and (``tools``: the request offered
    tools) ``tool_calls``, parsed from the generation prompt's ``prefix`` on
    (:mod:`mtp_bindings.chat.reply`)."""

    chat: bool
    model_name: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    piece: Piece | None = None
    offset: int = 0
    tools: bool = False
    prefix: str = ""
    n_calls: int = 0  # tool calls streamed so far

    def __post_init__(self) -> None:
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model_name,
                "system_fingerprint": FINGERPRINT, "choices": choices}

    def logprobs(self, lps: list[TokenLogprob] | None) -> dict[str, Any] | None:
        """``choices[].logprobs`` for these tokens (None when not asked for)."""
        if self.piece is None or lps is None:
            return None
        if self.chat:
            return chat_logprobs(self.piece, lps)
        body, self.offset = completion_logprobs(self.piece, lps, self.offset)
        return body

    def complete(self, text: str, stats: GenerationStats, finish_reason: str | None,
                 lps: list[TokenLogprob] | None, n_completion: int) -> dict[str, Any]:
        """The non-streaming response (``n_completion``: the tokens the text holds)."""
        if self.chat:
            reply = parse_reply(text, tools=self.tools, prefix=self.prefix)
            choice = {"index": 0, "message": reply.message(), "logprobs": self.logprobs(lps),
                      "finish_reason": _finish(finish_reason, bool(reply.tool_calls))}
        else:
            choice = {"index": 0, "text": text, "logprobs": self.logprobs(lps), "finish_reason": _finish(finish_reason)}
        body = self._envelope("chat.completion" if self.chat else "text_completion", [choice])
        body.update(usage=usage(stats, n_completion), timings=timings(stats))
        return body

    def stream(self) -> ReplyStream | None:
        """The splitter of this reply's stream (None for text completions)."""
        return ReplyStream(self.tools, self.prefix) if self.chat else None

    def chunk(self, text: str | None, *, role: bool = False, finish_reason: str | None = None,
              lps: list[TokenLogprob] | None = None, reasoning: str = "",
              tool_calls: list[ToolCall] | None = None) -> dict[str, Any]:
        """One stream chunk: a delta of content, ``reasoning_content`` and completed tool calls
        (with its tokens' logprobs), the opening role delta, or (``finish_reason``) the end."""
        finish = _finish(finish_reason, self.n_calls > 0) if finish_reason is not None else None
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None and (text or not (reasoning or tool_calls)):
                delta["content"] = text
            if reasoning:
                delta["reasoning_content"] = reasoning
            if tool_calls:
                delta["tool_calls"] = [c.openai(self.n_calls + i) for i, c in enumerate(tool_calls)]
                self.n_calls += len(tool_calls)
            choice = {"index": 0, "delta": delta, "logprobs": self.logprobs(lps), "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": self.logprobs(lps), "finish_reason": finish}
        return self._envelope("chat.completion.chunk" if self.chat else "text_completion", [choice])

    def final_chunks(self, stats: GenerationStats, finish_reason: str | None,
                     include_usage: bool, n_completion: int) -> list[dict[str, Any]]:
        """The closing chunk(s): with ``include_usage``, OpenAI's extra usage chunk (no choices)
        follows the finish chunk; either way the last chunk carries ``usage`` and ``timings``."""
        last = self.chunk(None if self.chat else "", finish_reason=finish_reason)
        if not include_usage:
            last.update(usage=usage(stats, n_completion), timings=timings(stats))
            return [last]
        tail = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        tail.update(usage=usage(stats, n_completion), timings=timings(stats))
        return [last, tail]

