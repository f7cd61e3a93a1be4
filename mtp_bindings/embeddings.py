"""Embeddings: a text's vector from the model's last hidden states, pooled as llama-server pools them.

One job: turn texts (or token lists) into numpy vectors through a context of their own, created with
``embeddings=True`` and a pooling type (llama-server's ``--pooling``: ``mean``, ``cls``, ``last``, or
``none`` for one vector per token), and normalise them as llama-server's ``embd_normalize`` does
(default 2: L2). A generation context is never used for this: its KV holds a conversation (and the
prompt cache), and a pooled context outputs no per-token logits a generation could sample from.

Why one input per decode: llama.cpp pools over a physical batch, so a pooled input must fit in one
(``n_ctx = n_batch = n_ubatch``, :data:`~mtp_bindings.config.params.EMBED_N_CTX` by default, llama-server's
bound too), and a list is embedded one input after the other with the KV cleared in between. Each
result is therefore bit for bit the one the same input gets alone (``tests/test_embeddings.py``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any, Union

import numpy as np

from .native._native import ffi, lib
from .llama_context import LlamaContext
from .exceptions import ContextOverflowError, DecodeError, InvalidParameterError, TokenizeError
from .config.params import EMBD_NORMALIZE, EMBED_N_CTX, EMBED_POOLING, POOLING_TYPES

# what embed takes: a text, a token list, or a list of either
EmbedInput = Union[str, Sequence[int], Sequence[Union[str, Sequence[int]]]]


def check_norm(norm: Any) -> int:
    """``norm`` if it is an ``embd_normalize`` value (an int >= -1), else :class:`InvalidParameterError`."""
    if isinstance(norm, bool) or not isinstance(norm, int) or norm < -1:
        raise InvalidParameterError(f"embd_normalize must be an int >= -1, got {norm!r}")
    return norm


def normalize_vector(vec: np.ndarray, norm: int = EMBD_NORMALIZE) -> np.ndarray:
    """``vec`` scaled as llama.cpp's ``common_embd_normalize``: -1 unchanged, 0 the largest
    magnitude to 32760 (int16's range), 1 taxicab, 2 Euclidean (L2), p > 2 the p-norm. A zero
    vector stays zero. Sums in float64 as llama.cpp does; the result is float32."""
    check_norm(norm)
    v = np.asarray(vec, dtype=np.float32)
    a = v.astype(np.float64)
    if norm == -1:
        total = 1.0
    elif norm == 0:
        total = float(np.max(np.abs(a), initial=0.0)) / 32760.0
    elif norm == 2:
        total = float(np.sqrt(np.sum(a * a)))
    else:
        total = float(np.sum(np.abs(a) ** norm) ** (1.0 / norm))
    scale = np.float32(1.0 / total) if total > 0.0 else np.float32(0.0)
    return (v * scale).astype(np.float32)


def norm_of(normalize_arg: bool | int) -> int:
    """``Model.embed``'s ``normalize`` as an ``embd_normalize`` value (True: L2, False: none)."""
    if normalize_arg is True:
        return EMBD_NORMALIZE
    if normalize_arg is False:
        return -1
    return check_norm(normalize_arg)


def as_token_lists(model: Any, inputs: EmbedInput) -> tuple[list[list[int]], bool]:
    """The inputs as token lists (texts tokenized as llama-server does: BOS added where the model
    wants it, control-token text parsed), and whether one input was given (not a list)."""
    def one(item: Any) -> list[int]:
        if isinstance(item, str):
            return model.tokenize(item, add_special=True, parse_special=True)
        if isinstance(item, (list, tuple, np.ndarray)) and all(_is_token(t) for t in item):
            return model.check_tokens(list(item)).tolist()
        raise TokenizeError(f"an embedding input must be a string or a list of token ids, got {type(item).__name__}")

    if isinstance(inputs, str) or (isinstance(inputs, (list, tuple, np.ndarray)) and len(inputs) > 0
                                   and all(_is_token(t) for t in inputs)):
        lists, single = [one(inputs)], True
    elif isinstance(inputs, (list, tuple)):
        if not inputs:
            raise InvalidParameterError("input must not be empty")
        lists, single = [one(item) for item in inputs], False
    else:
        raise TokenizeError(f"input must be a string, a list of strings or token lists, got {type(inputs).__name__}")
    for i, toks in enumerate(lists):
        if not toks:
            raise InvalidParameterError(f"input {i} is empty (no tokens to embed)")
    return lists, single


def _is_token(t: Any) -> bool:
    return isinstance(t, (int, np.integer)) and not isinstance(t, bool)


class Embedder:
    """A context of its own that embeds one input at a time with ``pooling`` (a
    :data:`~mtp_bindings.config.params.POOLING_TYPES` key); inputs of at most ``n_ctx`` tokens."""

    def __init__(self, model: Any, pooling: str = EMBED_POOLING, n_ctx: int = EMBED_N_CTX,
                 n_threads: int | None = None) -> None:
        if pooling not in POOLING_TYPES:
            raise InvalidParameterError(f"pooling must be one of {sorted(POOLING_TYPES)}, got {pooling!r}")
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1:
            raise InvalidParameterError(f"n_ctx must be a positive int, got {n_ctx!r}")
        self.model = model
        self.pooling = pooling
        self.context: LlamaContext = model.create_context(n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, embeddings=True,
                                                     pooling=pooling, n_threads=n_threads)
        # llama.cpp pads n_ctx; the bound is one physical batch (a longer input would be pooled per chunk)
        self.n_ctx = min(self.context.n_ctx, self.context.n_batch, int(lib.llama_n_ubatch(self.context.ptr)))
        self.n_embd = int(lib.llama_model_n_embd_out(model.ptr))

    @property
    def closed(self) -> bool:
        return self.context.closed

    def close(self) -> None:
        self.context.close()

    def embed_tokens(self, tokens: Sequence[int]) -> np.ndarray:
        """The raw (unnormalised) embedding of one token list: ``[n_embd]`` pooled, or
        ``[n_tokens, n_embd]`` for ``pooling="none"``."""
        n = len(tokens)
        if n > self.n_ctx:
            raise ContextOverflowError(f"an input of {n} tokens exceeds the embedding context (n_ctx={self.n_ctx}; "
                                       "a pooled input must fit in one batch: pass a larger n_ctx)")
        ctx = self.context
        with ctx.lock:
            ctx.clear()
            n_out = ctx.decode(tokens, pos=0, logits="all")  # pooling needs every token output
            if self.pooling == "none":
                return np.stack([ctx.get_embeddings(i) for i in range(n_out)])
            ptr = lib.llama_get_embeddings_seq(ctx.ptr, 0)
            if ptr == ffi.NULL:
                raise DecodeError("llama.cpp returned no pooled embedding for the input")
            return np.frombuffer(ffi.buffer(ptr, self.n_embd * 4), dtype=np.float32).copy()

    def embed(self, inputs: EmbedInput, norm: int = EMBD_NORMALIZE) -> Any:
        """Embeddings of ``inputs``, each normalised with ``norm`` (see :func:`normalize_vector`; for
        ``pooling="none"`` each token's vector). One input: an array (``[n_embd]``, or
        ``[n_tokens, n_embd]`` unpooled); a list: ``[n_inputs, n_embd]``, or unpooled a list of
        ``[n_tokens, n_embd]`` arrays (their lengths differ)."""
        check_norm(norm)
        lists, single = as_token_lists(self.model, inputs)
        out = [self._normalized(self.embed_tokens(toks), norm) for toks in lists]
        if single:
            return out[0]
        return out if self.pooling == "none" else np.stack(out)

    @staticmethod
    def _normalized(vecs: np.ndarray, norm: int) -> np.ndarray:
        if vecs.ndim == 1:
            return normalize_vector(vecs, norm)
        return np.stack([normalize_vector(v, norm) for v in vecs])


_embedders: weakref.WeakKeyDictionary[Any, dict[tuple[str, int], Embedder]] = weakref.WeakKeyDictionary()
_embedders_lock = threading.Lock()


def embedder_for(model: Any, pooling: str = EMBED_POOLING, n_ctx: int = EMBED_N_CTX) -> Embedder:
    """The model's :class:`Embedder` for ``pooling`` and ``n_ctx``: created on first use, then
    reused (recreated once closed; on a closed model that raises as the model does)."""
    with _embedders_lock:
        per_model = _embedders.setdefault(model, {})
        emb = per_model.get((pooling, n_ctx))
        if emb is None or emb.closed:
            emb = per_model[(pooling, n_ctx)] = Embedder(model, pooling, n_ctx)
        return emb


def embed(model: Any, inputs: EmbedInput, *, pooling: str = EMBED_POOLING, normalize: bool | int = True,
          n_ctx: int = EMBED_N_CTX) -> Any:
    """``Model.embed``: see :meth:`Embedder.embed` (``normalize``: True = L2, False = none, or an
    ``embd_normalize`` int)."""
    return embedder_for(model, pooling, n_ctx).embed(inputs, norm_of(normalize))
