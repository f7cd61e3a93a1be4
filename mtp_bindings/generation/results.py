"""What a generation returns: a whole :class:`GenerationResult`, or streamed :class:`TextPiece` s.
Pure Python."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .stats import GenerationStats

if TYPE_CHECKING:
    from .logprobs import TokenLogprob


@dataclass
class GenerationResult:
    """The outcome of ``generate``: ``finish_reason`` is ``stop`` (EOS or stop string),
    ``length`` (max_tokens or context full) or ``cancelled``. ``logprobs``: one per token when
    ``generate(logprobs=k)`` asked for them, else None. ``message``: for ``chat``, the reply split
    into OpenAI's assistant message (content, reasoning_content, tool_calls)."""

    text: str
    tokens: list[int]
    stats: GenerationStats
    finish_reason: str
    logprobs: list[TokenLogprob] | None = None
    message: dict[str, Any] | None = None  # chat(): the reply as OpenAI's assistant message


class TextPiece(str):
    """A streamed piece of text (always whole UTF-8 characters). The last piece of a stream
    carries ``stats`` and ``finish_reason``; earlier ones have them ``None``. ``logprobs``: those
    of ``tokens`` when asked for, else None."""

    tokens: list[int]
    # None on the class: a piece sets only what it has (one is made every round, after a decode has swept the caches)
    stats: GenerationStats | None = None
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None

    def __new__(cls, text: str, tokens: list[int], stats: GenerationStats | None = None,
                finish_reason: str | None = None, logprobs: list[TokenLogprob] | None = None) -> TextPiece:
        obj = str.__new__(cls, text)
        obj.tokens = tokens
        if stats is not None:
            obj.stats = stats
        if finish_reason is not None:
            obj.finish_reason = finish_reason
        if logprobs is not None:
            obj.logprobs = logprobs
        return obj
