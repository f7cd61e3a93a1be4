"""Which generated tokens the returned text holds: the tokens a response's logprobs and
``usage.completion_tokens`` report (issue 26, item 10).

One job: when a stop string ends the text, the token(s) holding it -- and, with MTP, the tokens
accepted after it in the same round -- were generated but are not in the text; they must not be
in its logprobs or its usage either. A token is the text's when its bytes start before the end of
the text returned; a token that starts inside the stop string is not. Nothing here does I/O.

llama-server at our pin (``server-context.cpp``, ``send_final_response``) trims its
``probs_output`` the same way, by the stop word's length in tokens (it re-tokenizes the word and
drops that many), and we follow it for logprobs with the exact count. Its ``completion_tokens``
(``n_decoded``) counts every decoded token; here ``usage`` follows the text, as the issue asks,
while ``timings.predicted_n`` keeps llama-server's count of the tokens decoded.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from ..generation.text import token_bytes

if TYPE_CHECKING:
    from ..generation.logprobs import TokenLogprob


def token_renderer(model: Any, special: Collection[int] = ()) -> Callable[[int], bytes]:
    """A token's bytes as the generation's text renders it (:func:`~mtp_bindings.generation.text.token_bytes`)."""
    special = frozenset(special)
    return lambda t: token_bytes(model, t, special)


class TextTokens:
    """Tracks a generation piece by piece: each token's logprob is released once text starting
    with that token's bytes has been returned; at the end the tokens the text never reached are
    dropped when the text was cut (a stop string), kept otherwise (an end-of-generation token
    renders no text but ended it)."""

    def __init__(self, render: Callable[[int], bytes]) -> None:
        self.render = render
        self.token_bytes = 0  # bytes of every token seen
        self.text_bytes = 0  # bytes of the text returned so far
        self.held: list[tuple[int, TokenLogprob | None]] = []  # (start byte, logprob) of tokens not yet released
        self.n_kept = 0  # tokens released: the text's
        self.tokens: list[int] = []  # the text's token ids, in order
        self.cut = False  # the text ended before the tokens' bytes did (a stop string)
        self._pending_ids: list[int] = []
        self._raw = bytearray()  # every token's bytes

    def feed(self, text: str, tokens: Sequence[int],
             logprobs: Sequence[TokenLogprob] | None) -> list[TokenLogprob]:
        """Add one piece (its text and the tokens generated with it); the logprobs now released."""
        for i, t in enumerate(tokens):
            self.held.append((self.token_bytes, None if logprobs is None else logprobs[i]))
            self._pending_ids.append(t)
            raw = self.render(t)
            self._raw += raw
            self.token_bytes += len(raw)
        self.text_bytes += len(text.encode("utf-8"))
        n = 0
        while n < len(self.held) and self.held[n][0] < self.text_bytes:
            n += 1
        return self._release(n)

    def finish(self) -> list[TokenLogprob]:
        """The generation ended: the logprobs of the held tokens that are the text's."""
        if self.token_bytes > self.text_bytes:  # the text was cut: the rest held the stop string
            self.cut = True
            self.held.clear()
            self._pending_ids.clear()
            return []
        return self._release(len(self.held))

    def stopping_word(self, stops: Sequence[str]) -> str:
        """The stop string that cut the text ("" when none did)."""
        if not self.cut:
            return ""
        rest = bytes(self._raw[self.text_bytes:]).decode("utf-8", errors="replace")
        return next((s for s in stops if s and rest.startswith(s)), "")

    def _release(self, n: int) -> list[TokenLogprob]:
        out = [lp for _, lp in self.held[:n] if lp is not None]
        self.tokens += self._pending_ids[:n]
        del self.held[:n], self._pending_ids[:n]
        self.n_kept += n
        return out
