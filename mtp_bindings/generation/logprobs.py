"""Log-probabilities of the emitted tokens, from the target's logits rows the loop already has.

What a logprob is here: the log-softmax of the target's raw logits at the token's position --
the model's own distribution, before ``logit_bias``, penalties, temperature and truncation, as
llama-server reports ``n_probs`` and OpenAI its ``logprobs``. Speculative decoding does not
change it: a drafted token that verification accepts has its row from the verify batch, which
equals the one-token decode's row bit for bit (see :func:`mtp_bindings.config.params.resolve_flash_attn`),
so MTP on and off give the same logprobs.

Cost: only when asked for, and only for emitted rows (one max, one exp-sum over the vocabulary
per token, and an ``argpartition`` when alternatives are asked for). Pure numpy.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..config.params import LOGPROBS_MAX as TOP_LOGPROBS_MAX


Piece = Callable[[int], bytes]  # a token's bytes as the text shows it (the model's token_to_piece)


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability and the ``top`` most likely tokens at its position
    (``(token, logprob)``, most likely first; as many as asked for), with the token's ``bytes`` as
    the text shows them and its ``text`` (those bytes as UTF-8, a partial character replaced) --
    llama-server's ``bytes`` / ``token`` -- and ``top_bytes`` / ``top_text`` for the alternatives."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    bytes: builtins.bytes = b""  # the field's name is OpenAI's; the type is spelled so that the name does not hide it
    top_bytes: list[builtins.bytes] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.bytes.decode("utf-8", errors="replace")

    @property
    def top_text(self) -> list[str]:
        return [b.decode("utf-8", errors="replace") for b in self.top_bytes]


def log_softmax_at(row: np.ndarray, token: int, k: int = 0, piece: Piece | None = None) -> TokenLogprob:
    """``token``'s log-softmax in the logits ``row`` and the ``k`` best tokens', with their bytes
    when ``piece`` (a token's bytes) is given."""
    m = float(row.max())
    lse = m + float(np.log(np.exp(row - np.float32(m), dtype=np.float32).sum(dtype=np.float64)))
    top: list[tuple[int, float]] = []
    if k > 0:
        k = min(k, row.size)
        ids = np.argpartition(row, row.size - k)[row.size - k:]
        ids = ids[np.argsort(-row[ids], kind="stable")]
        top = [(int(i), float(row[i]) - lse) for i in ids]
    if piece is None:
        return TokenLogprob(int(token), float(row[token]) - lse, top)
    return TokenLogprob(int(token), float(row[token]) - lse, top, piece(int(token)), [piece(t) for t, _ in top])


class LogprobRecorder:
    """Collects the logprobs of emitted tokens as the loop emits them; the driver takes them
    piece by piece. ``k``: alternatives per token; ``piece``: a token's bytes (for their text)."""

    def __init__(self, k: int, piece: Piece | None = None) -> None:
        self.k = k
        self.piece = piece
        self.pending: list[TokenLogprob] = []

    def record(self, row: np.ndarray, token: int) -> None:
        self.pending.append(log_softmax_at(row, token, self.k, self.piece))

    def take(self, n: int) -> list[TokenLogprob]:
        """The oldest ``n`` recorded (the tokens of one yielded round)."""
        out, self.pending = self.pending[:n], self.pending[n:]
        return out
