"""Token log-probabilities in OpenAI's two response shapes.

One job: turn the generation's :class:`~mtp_bindings.generation.logprobs.TokenLogprob` s into
JSON: chat's ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal"}``
and text completions' ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
"text_offset"}``. A token is rendered as the text shows it (its bytes, UTF-8 with replacement
for a partial character; ``bytes`` has them exactly). Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..generation.logprobs import TokenLogprob

Piece = Callable[[int], bytes]  # a token's bytes (the model's token_to_piece)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def chat_logprobs(piece: Piece, lps: Sequence[TokenLogprob]) -> dict[str, Any]:
    """Chat's ``choices[].logprobs`` for ``lps`` (whole or one stream chunk's)."""

    def item(token: int, logprob: float) -> dict[str, Any]:
        raw = piece(token)
        return {"token": _text(raw), "logprob": logprob, "bytes": list(raw)}

    return {"content": [{**item(lp.token, lp.logprob), "top_logprobs": [item(t, v) for t, v in lp.top]}
                        for lp in lps], "refusal": None}


def completion_logprobs(piece: Piece, lps: Sequence[TokenLogprob], offset: int) -> tuple[dict[str, Any], int]:
    """Text completions' ``choices[].logprobs`` for ``lps``, the first token at character
    ``offset`` of the response's text; also the offset after the last token."""
    tokens, offsets = [], []
    for lp in lps:
        text = _text(piece(lp.token))
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    tops = [{_text(piece(t)): v for t, v in lp.top} for lp in lps]
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in lps], "top_logprobs": tops,
            "text_offset": offsets}, offset
