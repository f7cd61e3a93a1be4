"""Text assembly: tokens to text pieces that are whole UTF-8 characters, with stop strings cut
out (text that could be the start of a stop string is held back until it is known not to be one).
Pure Python."""

from __future__ import annotations

import codecs
from typing import Any, Collection, Sequence


def token_bytes(model: Any, token: int, special: Collection[int] = ()) -> bytes:
    """A token's bytes as generated text renders it: the tokens in ``special`` with their text, the
    others as plain pieces (control tokens render empty)."""
    return model.token_to_piece(token, special=True) if token in special else model.token_to_piece(token)


class TextAssembler:
    """Turns tokens into text pieces (``model`` renders a token with ``token_to_piece``; the
    tokens in ``special`` with their text even when they are control tokens, which otherwise
    render as nothing)."""

    def __init__(self, model: Any, stop: Sequence[str], special: Collection[int] = ()) -> None:
        self.model = model
        self.special = frozenset(special)
        self.stop = [s for s in stop if s]
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending = ""
        self.stopped = False

    def feed(self, tokens: Sequence[int]) -> str:
        """Add tokens; returns the text now safe to emit (may be empty)."""
        if len(tokens) == 1:  # most rounds: no generator and join (this runs on caches a decode has just swept)
            raw = token_bytes(self.model, tokens[0], self.special)
        else:
            raw = b"".join(token_bytes(self.model, t, self.special) for t in tokens)
        if not self.stop:  # nothing is held back: the decoder keeps a character's incomplete bytes itself
            return self.decoder.decode(raw)
        self.pending += self.decoder.decode(raw)
        hits = [(self.pending.find(s), s) for s in self.stop]
        hits = [(i, s) for i, s in hits if i >= 0]
        if hits:
            i = min(hits)[0]
            out = self.pending[:i]
            self.pending = ""
            self.stopped = True
            return out
        keep = max(_overlap(self.pending, s) for s in self.stop)
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def flush(self) -> str:
        if self.stopped:
            return ""
        out = self.pending + self.decoder.decode(b"", final=True)
        self.pending = ""
        return out


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
