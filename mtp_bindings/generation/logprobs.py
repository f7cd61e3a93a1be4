"""Log-probabilities of the emitted tokens, from the target's logits rows the loop already has.

What a logprob is here: the log-softmax of the target's raw logits at the token's position --
the model's own distribution, before ``logit_bias``, penalties, temperature and truncation, as
llama-server reports ``n_probs`` and OpenAI its ``logprobs``. Speculative decoding does not
change it: a drafted token that verification accepts has its row from the verify batch, which
equals the one-token decode's row bit for bit (see :func:`mtp_bindings.config.params.resolve_flash_attn`),
so MTP on and off give the same logprobs.

Cost: only when asked for, and only for emitted rows: one C call per token (``mtp_row_logprobs`` in
``build_support/sampling_logprobs.c``): the row's maximum (with the alternatives, from the top-k prefilter's
few candidates), then one vectorized exp-sum over the vocabulary in float64; no sort, no temporary rows (numpy
took 0.55-0.86 ms a token at 262,144 tokens).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..config.params import LOGPROBS_MAX as TOP_LOGPROBS_MAX
from ..exceptions import InvalidParameterError
from ..native._native import ffi, lib


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


def log_softmax_at(row: np.ndarray, token: int, k: int = 0, piece: Piece | None = None,
                   scratch: np.ndarray | None = None) -> TokenLogprob:
    """``token``'s log-softmax in the logits ``row`` and the ``k`` best tokens' (highest first, the lower id of
    a tie first), with their bytes when ``piece`` (a token's bytes) is given. One C call (``mtp_row_logprobs``:
    the top-k prefilter's candidates, then one vectorized exp-sum over the row); ``scratch``: int32 room for
    ``row.size`` ids, a recorder's own (else a fresh one)."""
    row = np.ascontiguousarray(row, dtype=np.float32)
    if not 0 <= token < row.size:
        raise InvalidParameterError(f"token {token} is outside a row of {row.size} logits")
    k = min(k, row.size)
    if k > 0 and (scratch is None or scratch.size < row.size):
        scratch = np.empty(row.size, dtype=np.int32)
    ids = np.empty(k, dtype=np.int32)
    lps = np.empty(k, dtype=np.float64)
    lse = ffi.new("double *")
    rc = lib.mtp_row_logprobs(ffi.from_buffer("float[]", row), row.size, k,
                              ffi.from_buffer("int32_t[]", scratch) if k > 0 else ffi.NULL,
                              ffi.from_buffer("int32_t[]", ids), ffi.from_buffer("double[]", lps), lse)
    if rc < 0:
        raise MemoryError("no memory for the top-k prefilter's block maxima")
    top = list(zip(ids.tolist(), lps.tolist()))
    chosen = float(row[token]) - lse[0]
    if piece is None:
        return TokenLogprob(int(token), chosen, top)
    return TokenLogprob(int(token), chosen, top, piece(int(token)), [piece(t) for t, _ in top])


class LogprobRecorder:
    """Collects the logprobs of emitted tokens as the loop emits them; the driver takes them
    piece by piece. ``k``: alternatives per token; ``piece``: a token's bytes (for their text)."""

    def __init__(self, k: int, piece: Piece | None = None) -> None:
        self.k = k
        self.piece = piece
        self.pending: list[TokenLogprob] = []
        self._scratch: np.ndarray | None = None  # the top-k prefilter's ids, made at the first row

    def record(self, row: np.ndarray, token: int) -> None:
        if self.k > 0 and (self._scratch is None or self._scratch.size < row.size):
            self._scratch = np.empty(row.size, dtype=np.int32)
        self.pending.append(log_softmax_at(row, token, self.k, self.piece, self._scratch))

    def take(self, n: int) -> list[TokenLogprob]:
        """The oldest ``n`` recorded (the tokens of one yielded round)."""
        out, self.pending = self.pending[:n], self.pending[n:]
        return out
