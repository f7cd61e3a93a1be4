"""What a generation returns: a whole :class:`GenerationResult`, or streamed :class:`TextPiece` s.
Pure Python."""

from __future__ import annotations

from dataclasses import dataclass

from .stats import GenerationStats


@dataclass
class GenerationResult:
    """The outcome of ``generate``: ``finish_reason`` is ``stop`` (EOS or stop string),
    ``length`` (max_tokens or context full) or ``cancelled``."""

    text: str
    tokens: list[int]
    stats: GenerationStats
    finish_reason: str


class TextPiece(str):
    """A streamed piece of text (always whole UTF-8 characters). The last piece of a stream
    carries ``stats`` and ``finish_reason``; earlier ones have them ``None``."""

    tokens: list[int]
    stats: GenerationStats | None
    finish_reason: str | None

    def __new__(cls, text: str, tokens: list[int], stats: GenerationStats | None = None,
                finish_reason: str | None = None) -> TextPiece:
        obj = super().__new__(cls, text)
        obj.tokens = tokens
        obj.stats = stats
        obj.finish_reason = finish_reason
        return obj
