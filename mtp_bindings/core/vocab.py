"""A model's vocabulary: the part of :class:`~mtp_bindings.llama_model.LlamaModel` that turns text into
token ids and back.

One job: llama.cpp's vocabulary calls (special tokens, ``llama_tokenize``, ``llama_token_to_piece``,
``llama_detokenize``) with their checks, as :class:`ModelVocabulary`, a base class of ``LlamaModel``,
which sets the vocabulary pointer and size when it loads the model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..exceptions import TokenizeError
from ..native._handle import NativeHandle
from ..native._model_file import negative_needs, read_grown
from ..native._native import ffi, lib

FEW_TOKENS = 16  # a batch this short is checked and written without numpy (see ModelVocabulary.few_tokens)


class ModelVocabulary(NativeHandle):
    """Tokenize, detokenize and the special tokens of a loaded model (its owner frees the vocabulary
    with the model: a closed model raises)."""

    # set by the model when it loads
    _vocab_ptr: Any
    _n_vocab: int
    _piece_cache: dict[int, bytes]  # token_to_piece's results (~token for special=True)

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def vocab(self) -> Any:
        """The native vocabulary (freed with the model: a closed model raises ``ModelLoadError``)."""
        self.ptr  # noqa: B018 (raises once closed)
        return self._vocab_ptr

    @property
    def token_bos(self) -> int:
        return int(lib.llama_vocab_bos(self.vocab))

    @property
    def token_eos(self) -> int:
        return int(lib.llama_vocab_eos(self.vocab))

    @property
    def token_eot(self) -> int:
        return int(lib.llama_vocab_eot(self.vocab))

    @property
    def add_bos(self) -> bool:
        return bool(lib.llama_vocab_get_add_bos(self.vocab))

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, ...)."""
        return bool(lib.llama_vocab_is_eog(self.vocab, token))

    def tokenize(self, text: str | bytes, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Text -> token ids. ``add_special`` adds BOS when the model wants it; ``parse_special``
        turns control-token text (``<start_of_turn>``) into the control tokens."""
        if isinstance(text, str):
            data = text.encode("utf-8")
        elif isinstance(text, (bytes, bytearray)):
            data = bytes(text)
        else:
            raise TokenizeError(f"tokenize expects str or bytes, got {type(text).__name__}")
        if len(data) >= 2**31 - 1:
            raise TokenizeError("text too long to tokenize")
        def fill(buf: Any, n_max: int) -> int:
            n = lib.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
            if n == -(2**31):
                raise TokenizeError("tokenization overflowed int32")
            return n

        buf, n = read_grown("llama_token[]", len(data) + 8, fill, negative_needs)
        return list(ffi.unpack(buf, n))

    def few_tokens(self, tokens: Sequence[int] | np.ndarray) -> list[int] | None:
        """``tokens`` itself when it is a list of at most ``FEW_TOKENS`` plain ints (a generation round's batch),
        checked in pure Python; :class:`TokenizeError` if one is outside the vocabulary; None for anything else
        (:meth:`check_tokens` takes it). On a round of a small pair numpy's checks of four ids took ~20 us."""
        if type(tokens) is not list or not 0 < len(tokens) <= FEW_TOKENS:
            return None
        for t in tokens:
            if type(t) is not int:
                return None
        lo, hi = min(tokens), max(tokens)
        if lo < 0 or hi >= self._n_vocab:
            bad = lo if lo < 0 else hi
            raise TokenizeError(f"token id {bad} is outside the vocabulary [0, {self._n_vocab})")
        return tokens

    def check_tokens(self, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
        """Token ids as int32 array, or :class:`TokenizeError` if any is outside the vocabulary."""
        try:
            arr = np.asarray(tokens)
        except (TypeError, ValueError) as e:
            raise TokenizeError(f"tokens must be a sequence of ints: {e}") from e
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise TokenizeError(f"tokens must be a flat sequence of ints, got dtype {arr.dtype} shape {arr.shape}")
        if arr.size:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi >= self._n_vocab:
                bad = lo if lo < 0 else hi
                raise TokenizeError(f"token id {bad} is outside the vocabulary [0, {self._n_vocab})")
        return arr.astype(np.int32, copy=False)

    def token_to_piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes one token renders to (may be a partial UTF-8 sequence)."""
        if type(token) is not int:  # before the cache: True or 2.0 would find token 1's or 2's piece there
            token = int(self.check_tokens([token])[0])
        key = token if not special else ~token
        cached = self._piece_cache.get(key)
        if cached is not None:
            return cached
        # a token seen first: checked in pure Python (numpy's check of one id, on caches a decode has just swept,
        # was most of a generation's text work per token at Gemma 4's vocabulary)
        if not 0 <= token < self._n_vocab:
            raise TokenizeError(f"token id {token} is outside the vocabulary [0, {self._n_vocab})")
        buf, n = read_grown("char[]", 32, lambda b, size: lib.llama_token_to_piece(self.vocab, token, b, size, 0, special),
                            negative_needs)
        piece = ffi.unpack(buf, n)
        self._piece_cache[key] = piece
        return piece

    def detokenize(self, tokens: Iterable[int], *, special: bool = False) -> str:
        """Token ids -> text (invalid UTF-8 is replaced)."""
        arr = self.check_tokens(list(tokens))
        n_tokens = int(arr.size)
        size = max(16, n_tokens * 8)
        cbuf = ffi.from_buffer("llama_token[]", np.ascontiguousarray(arr))
        buf, n = read_grown("char[]", size, lambda b, m: lib.llama_detokenize(self.vocab, cbuf, n_tokens, b, m, False, special),
                            negative_needs)
        return ffi.unpack(buf, n).decode("utf-8", errors="replace")
