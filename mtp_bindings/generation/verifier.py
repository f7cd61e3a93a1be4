"""The verify step on the target: decode ``[last token] + drafts`` in one batch, then roll the KV
back past the accepted prefix and pick the hidden state the next round drafts from.

``h_idx``: the next round drafts from the hidden state of the *last accepted* token (the design's
``h_idx`` correction); ``"last"`` takes the last row of the batch instead, the design's
regression, kept for the tests that show why it is wrong.
"""

from __future__ import annotations

import numpy as np

from ..llama_context import LlamaContext


class Verifier:
    """Verifies drafts on ``ctx``'s sequence ``seq_id``."""

    def __init__(self, ctx: LlamaContext, seq_id: int, h_idx: str) -> None:
        self.ctx = ctx
        self.seq_id = seq_id
        self.h_idx = h_idx

    def rows(self, last_token: int, drafts: list[int], attn_pos: int) -> list[np.ndarray]:
        """Decode ``[last_token] + drafts`` after KV position ``attn_pos``; the target's logits rows
        (row ``i`` predicts the token after ``drafts[:i]``). The rows are views: read them before
        the next decode."""
        batch = [last_token] + drafts
        self.ctx.decode(batch, pos=attn_pos + 1, seq_id=self.seq_id, logits="all")
        return [self.ctx.logits_view(i) for i in range(len(batch))]

    def picks(self, last_token: int, drafts: list[int], attn_pos: int) -> list[int]:
        """As :meth:`rows`, for a greedy generation whose picks the graph takes: the argmax of each
        row, read as ``len(drafts) + 1`` token ids instead of rows of logits."""
        batch = [last_token] + drafts
        self.ctx.decode(batch, pos=attn_pos + 1, seq_id=self.seq_id, logits="all", sampled=True)
        return self.ctx.sampled_tokens(len(batch))

    def accept(self, attn_pos: int, n_drafted: int, n_accepted: int) -> None:
        """Keep the first ``n_accepted`` drafts: drop the rejected ones' KV cells."""
        if n_accepted < n_drafted:
            self.ctx.seq_rm(self.seq_id, attn_pos + 2 + n_accepted, -1)

    def hidden_row(self, n_drafted: int, n_accepted: int) -> int:
        """The batch row whose hidden state the next round drafts from (read it before the next decode,
        and only when that round drafts)."""
        return n_accepted if self.h_idx == "accepted" else n_drafted
