"""llama.cpp's own sampler chain, built from :class:`~mtp_bindings.config.params.SamplingParams` as
llama-server builds it, and read as a distribution rather than drawn from.

The order is llama-server's (``common_sampler_init`` at the pin, ``SAMPLER_ORDER`` in
:mod:`mtp_bindings.config.params`): ``logit_bias`` (the request's biases and the model's suppressed tokens)
first, then penalties, DRY, top-n-sigma, top-k, typical-p, top-p, min-p, XTC, and temperature last,
each with llama-server's parameters (``min_keep`` 0). llama-server ends the chain with ``dist``, which
draws one token; this chain stops before it: :meth:`SamplerChain.apply` runs it over one logits row
and returns the surviving candidates and their logits, the distribution ``dist`` would draw from
(:func:`~.sampling.candidate_distribution` turns them into probabilities). At temperature 0 the
chain stops before the temperature sampler as well: the pick is the highest surviving logit, which is
what llama-server's temperature 0 keeps.

History: penalties and DRY look at the tokens already emitted; they hear each one through
:meth:`SamplerChain.accept` (llama.cpp's ``llama_sampler_accept``) as it is emitted, never a copy of
the history per round. A chain without them ignores :meth:`accept` (no native call). XTC draws its
own coin per row from a generator seeded with the request's seed.

A chain owns native memory: use it as a context manager (or call :meth:`close`).
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..native._native import ffi, lib
from ..exceptions import InvalidParameterError
from ..config.params import SamplingParams
from .sampling import NoCandidateError, Sampler

logger = logging.getLogger(__name__)

# llama.h's llama_token_data: {llama_token id; float logit; float p}
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
DEFAULT_SEED = 0xFFFFFFFF  # llama.h's LLAMA_DEFAULT_SEED: a random seed
_MIN_KEEP = 0  # llama-server's min_keep default
_MASK64 = (1 << 64) - 1


def native_seed(seed: int | None) -> int:
    """A request's seed as llama.cpp's samplers take it (uint32; None: a random one)."""
    return DEFAULT_SEED if seed is None else int(seed) & 0xFFFFFFFF


class SamplerChain:
    """One generation's llama.cpp sampler chain over a vocabulary of ``n_vocab`` tokens.

    ``params`` must be resolved (:meth:`SamplingParams.resolved`: no -1 windows). ``vocab`` is the
    model's native vocabulary (``LlamaModel.vocab``): DRY tokenizes its sequence breakers with it and
    the model's suppressed tokens are banned, as llama-server does; without one (a bare logits row,
    the tests) DRY cannot be asked for."""

    def __init__(self, params: SamplingParams, n_vocab: int, vocab: Any = None) -> None:
        if params.repeat_last_n < 0 or params.dry_penalty_last_n < 0:
            raise InvalidParameterError("the sampler chain needs resolved windows (SamplingParams.resolved)")
        if params.has_dry and vocab is None:
            raise InvalidParameterError("DRY needs the model's vocabulary")
        self.params = params
        self.n_vocab = int(n_vocab)
        self._chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        if self._chain == ffi.NULL:
            raise MemoryError("llama_sampler_chain_init failed")
        try:
            self._bias = self._add_samplers(params, vocab)
        except BaseException:
            lib.llama_sampler_free(self._chain)
            self._chain = None
            raise
        self.stateful = params.has_penalties or params.has_dry
        # the tokens of history that decide the chain's state: the longest window of its history samplers
        self.window = max(params.repeat_last_n if params.has_penalties else 0,
                          params.dry_penalty_last_n if params.has_dry else 0)
        # whether the chain can pick another token than the raw row's argmax at temperature 0
        self.changes_argmax = bool(self._bias) or self.stateful or params.has_xtc or params.typical_p < 1.0
        # top-k sees the raw row when nothing before it changes logits (bans aside): the chain can then start
        # from a few candidates that hold the top k instead of the whole vocabulary (see apply)
        bans_only = all(b == float("-inf") for b in self._bias.values())
        self._top_k_first = (params.top_k > 0 and bans_only and not self.stateful
                             and not params.has_dry and params.top_n_sigma <= 0)
        self._banned = np.array(sorted(self._bias), dtype=np.int32)
        self._scratch: _Scratch | None = None  # made at the first row: a greedy generation in the graph reads none
        self._round: Any = None  # the native round's description (mtp_round), made with the scratch

    def _buffers(self) -> _Scratch:
        if self._scratch is None:
            self._scratch = _Scratch(self.n_vocab)
        return self._scratch

    def _add_samplers(self, p: SamplingParams, vocab: Any) -> dict[int, float]:
        """Add llama-server's samplers in its order; the biases of the logit-bias sampler leading them."""
        add = lib.llama_sampler_chain_add
        bias = dict(p.logit_bias or {})
        if vocab is not None:
            n_suppress = ffi.new("int32_t *")
            suppress = lib.llama_vocab_get_suppress_tokens(vocab, n_suppress)
            for i in range(n_suppress[0]):
                bias[int(suppress[i])] = float("-inf")
        if bias:
            arr = ffi.new("llama_logit_bias[]", [(int(t), float(b)) for t, b in bias.items()])
            add(self._chain, lib.llama_sampler_init_logit_bias(self.n_vocab, len(bias), arr))
        add(self._chain, lib.llama_sampler_init_penalties(self.n_vocab, p.repeat_last_n, p.repeat_penalty,
                                                          p.frequency_penalty, p.presence_penalty))
        add(self._chain, self._dry(p, vocab))
        add(self._chain, lib.llama_sampler_init_top_n_sigma(p.top_n_sigma))
        add(self._chain, lib.llama_sampler_init_top_k(p.top_k))
        add(self._chain, lib.llama_sampler_init_typical(p.typical_p, _MIN_KEEP))
        add(self._chain, lib.llama_sampler_init_top_p(p.top_p, _MIN_KEEP))
        add(self._chain, lib.llama_sampler_init_min_p(p.min_p, _MIN_KEEP))
        add(self._chain, lib.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, _MIN_KEEP,
                                                    native_seed(p.seed)))
        if not p.greedy:
            add(self._chain, lib.llama_sampler_init_temp_ext(p.temperature, 0.0, 1.0))
        return bias

    @staticmethod
    def _dry(p: SamplingParams, vocab: Any) -> Any:
        if not p.has_dry:  # llama.cpp returns an empty sampler then too; it needs no vocabulary for it
            return lib.llama_sampler_init_dry(ffi.NULL, p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                                              p.dry_penalty_last_n, ffi.NULL, 0)
        strings = [ffi.new("char[]", b.encode("utf-8")) for b in p.dry_sequence_breakers]
        breakers = ffi.new("const char *[]", strings) if strings else ffi.NULL
        return lib.llama_sampler_init_dry(vocab, p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                                          p.dry_penalty_last_n, breakers, len(strings))

    # --- lifetime ------------------------------------------------------------------------------

    def __enter__(self) -> SamplerChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Free the native chain (and every sampler in it); idempotent."""
        if self._chain is not None:
            lib.llama_sampler_free(self._chain)
            self._chain = None

    def __del__(self) -> None:  # a chain not closed is freed with its owner (never twice)
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown: the library may be gone)
            pass

    @property
    def ptr(self) -> Any:
        """The native ``llama_sampler *`` of the chain (ValueError once closed)."""
        if self._chain is None:
            raise ValueError("the sampler chain is closed")
        return self._chain

    # --- the chain -----------------------------------------------------------------------------

    def names(self) -> list[str]:
        """The chain's samplers by llama.cpp's names, in order (a disabled one reads ``?name``)."""
        chain = self.ptr
        return [ffi.string(lib.llama_sampler_name(lib.llama_sampler_chain_get(chain, i))).decode()
                for i in range(lib.llama_sampler_chain_n(chain))]

    def accept(self, token: int) -> None:
        """The chain hears an emitted token (penalties and DRY count it); a no-op without them."""
        if self.stateful:
            lib.llama_sampler_accept(self.ptr, int(token))

    def accept_history(self, tokens: Iterable[int]) -> None:
        """The chain hears the tokens before the first sampled one (the prompt), as llama-server feeds a
        slot's sampler; only the last :attr:`window` of them can matter, so only those are fed."""
        if not self.stateful:
            return
        toks = list(tokens)
        for t in toks[len(toks) - self.window:] if self.window < len(toks) else toks:
            lib.llama_sampler_accept(self.ptr, int(t))

    def reset(self, history: Iterable[int] = ()) -> None:
        """Forget what the chain heard and hear ``history`` instead (a sequence taken back)."""
        lib.llama_sampler_reset(self.ptr)
        self.accept_history(history)

    def apply(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Run the chain over one logits ``row`` (float32, ``n_vocab``): the surviving candidates'
        token ids (int32) and logits (float32, after bias, penalties and temperature), in the chain's
        order; copies. Nothing is drawn and nothing heard."""
        if row.shape != (self.n_vocab,):
            raise InvalidParameterError(f"a logits row of {self.n_vocab} values was expected, got shape {row.shape}")
        sc = self._buffers()
        buf = sc.buf
        ids = top_k_superset(row, self.params.top_k, sc.ids) if self._top_k_first else None
        if ids is not None and self._banned.size and np.isin(ids, self._banned).any():
            ids = None  # a banned token among them: fewer than k of the rest may be there
        if ids is None:
            size = self.n_vocab
            buf["id"] = sc.vocab_order  # the samplers sort in place: every row starts from the vocabulary's order
            buf["logit"] = row
        else:  # the same tokens survive top-k as from the whole row, in the vocabulary's order too
            size = ids.size
            buf["id"][:size] = ids
            buf["logit"][:size] = row[ids]
        arr = sc.arr
        arr.data = sc.data
        arr.size = size
        arr.selected = -1
        arr.sorted = False
        lib.llama_sampler_apply(self.ptr, arr)
        # XTC moves the start of the array past the tokens it removes (within this buffer)
        start = (int(ffi.cast("uintptr_t", arr.data)) - sc.addr) // TOKEN_DATA.itemsize
        size = int(arr.size)
        if not 0 <= start <= start + size <= self.n_vocab:
            raise RuntimeError(f"the sampler chain left candidates outside its buffer ({start}, {size})")
        out = buf[start:start + size]
        return out["id"].copy(), out["logit"].copy()

    def verify_round(self, rows: Sequence[np.ndarray], drafts: Sequence[int],
                     u: np.ndarray | None = None, masks: np.ndarray | None = None) -> tuple[int, int]:
        """One verify round in C (``mtp_verify_round``): what :class:`~.rejection.RejectionSampler` does with
        this chain's distribution, reading each row once and calling no numpy per row (after a decode has swept
        the caches each numpy call costs tens of microseconds). ``rows``: ``len(drafts) + 1`` float32 rows
        (row ``i`` predicts the token after ``drafts[:i]``). The uniform numbers: draft ``i`` is accepted where
        ``u[2 i]`` is below its probability and a token is drawn with ``u[2 i + 1]``; ``u`` None (the loop's
        way): the chain's own generator draws them, seeded with ``seed`` (see :meth:`seed_rounds`). ``masks``: a
        grammar's packed mask per row (uint32, ``len(rows)`` rows of ``ceil(n_vocab / 32)`` words: see
        :meth:`~.constraint.TokenConstraint.round_masks`), forbidden tokens' logits taken as -inf. The chain
        hears every emitted token. Returns ``(n_accepted, next_token)``."""
        chain = self.ptr  # raises once closed
        n = len(drafts) + 1
        if not n <= len(rows) <= lib.MTP_ROUND_MAX_ROWS:
            raise InvalidParameterError(f"{n} logits rows were expected (at most {lib.MTP_ROUND_MAX_ROWS})")
        if u is not None and (u.dtype != np.float64 or u.size < 2 * n):
            raise InvalidParameterError(f"a round needs {2 * n} float64 uniform numbers")
        rnd = self._native_round(chain)
        sc = self._buffers()
        views = [ffi.from_buffer("float[]", r) for r in rows[:n]]  # alive until the call returns
        for i, v in enumerate(views):
            if len(v) != self.n_vocab or rows[i].dtype != np.float32:
                raise InvalidParameterError(f"float32 logits rows of {self.n_vocab} values were expected")
            sc.rows[i] = v
        for i, t in enumerate(drafts):
            sc.drafts[i] = t
        if masks is not None:
            words = (self.n_vocab + 31) // 32
            if masks.dtype != np.uint32 or masks.ndim != 2 or masks.shape[0] < n or masks.shape[1] != words:
                raise InvalidParameterError(f"{n} masks of {words} uint32 words were expected")
            masks = np.ascontiguousarray(masks)
            rnd.masks = ffi.from_buffer("uint32_t[]", masks)
            rnd.mask_words = words
        try:
            rc = lib.mtp_verify_round(rnd, sc.rows, n, sc.drafts,
                                      ffi.NULL if u is None else ffi.from_buffer("double[]", u), sc.out)
        finally:
            if masks is not None:
                rnd.masks = ffi.NULL
        if rc >= 0:
            return rc, sc.out[0]
        if rc == lib.MTP_ROUND_ERR_EMPTY:
            raise NoCandidateError("no candidate token is left (every logit is -inf)")
        if rc == lib.MTP_ROUND_ERR_MEMORY:
            raise MemoryError("no memory for the top-k prefilter's block maxima")
        raise RuntimeError(f"the sampler chain left candidates outside its buffer (status {rc})")

    def seed_rounds(self, seed: int) -> None:
        """Seed the generator :meth:`verify_round` draws its uniform numbers from (until then: the request's
        seed, or a random one)."""
        lib.mtp_round_seed(self._native_round(self.ptr), int(seed) & _MASK64)

    def _native_round(self, chain: Any) -> Any:
        if self._round is None:
            sc = self._buffers()
            rnd = ffi.new("mtp_round *")
            rnd.chain = chain
            rnd.n_vocab = self.n_vocab
            if not self.params.greedy:
                rnd.mode = lib.MTP_ROUND_SAMPLE
            else:
                rnd.mode = lib.MTP_ROUND_GREEDY_CHAIN if self.changes_argmax else lib.MTP_ROUND_ARGMAX
            rnd.top_k = self.params.top_k if self._top_k_first else 0
            rnd.stateful = self.stateful
            rnd.banned = ffi.from_buffer("int32_t[]", self._banned)
            rnd.n_banned = self._banned.size
            rnd.data = sc.data
            rnd.ids = ffi.from_buffer("int32_t[]", sc.ids)
            rnd.probs = ffi.from_buffer("double[]", sc.probs)
            rnd.dense = ffi.from_buffer("float[]", sc.dense)
            rnd.present = ffi.from_buffer("uint64_t[]", sc.present)
            sc.keep = [rnd.banned, rnd.ids, rnd.probs, rnd.dense, rnd.present]  # the views the struct points into
            self._round = rnd
            lib.mtp_round_seed(rnd, (self.params.seed if self.params.seed is not None else secrets.randbits(64)) & _MASK64)
        return self._round


class RoundNumbers:
    """The uniform numbers a sampled verify round draws (``mtp_verify_round``'s generator, xoshiro256**) from
    ``seed``, in its order: two per row, ``u[2 i]`` to accept draft ``i``, ``u[2 i + 1]`` to draw row ``i``'s
    token, whether used or not. A replay of a generation's rounds (the tests' oracle) draws them so."""

    def __init__(self, seed: int) -> None:
        self._state = ffi.new("mtp_round *")
        lib.mtp_round_seed(self._state, int(seed) & _MASK64)

    def random(self, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.float64)
        lib.mtp_round_uniforms(self._state, n, ffi.from_buffer("double[]", out))
        return out


class _Scratch:
    """A chain's buffers of ``n_vocab`` entries each, made once (``np.empty``: only the pages a row touches are
    mapped), which the native round (``mtp_round``) points into: the candidates the samplers work on
    (``llama_token_data``), the prefilter's ids, the round's probabilities, logits by id and bitmap of ids."""

    def __init__(self, n_vocab: int) -> None:
        self.buf = np.empty(n_vocab, dtype=TOKEN_DATA)
        self.ids = np.empty(n_vocab, dtype=np.int32)
        self.probs = np.empty(n_vocab, dtype=np.float64)
        self.dense = np.empty(n_vocab, dtype=np.float32)
        self.present = np.empty((n_vocab + 63) // 64, dtype=np.uint64)
        self.data = ffi.from_buffer("llama_token_data[]", self.buf)  # keeps the buffer's view alive
        self.addr = int(ffi.cast("uintptr_t", self.data))
        self.arr = ffi.new("llama_token_data_array *")
        self.keep: list[Any] = []
        self.rows: Any = ffi.new("float *[]", lib.MTP_ROUND_MAX_ROWS)  # a round's row pointers, drafts and token
        self.drafts: Any = ffi.new("int32_t[]", lib.MTP_ROUND_MAX_ROWS)
        self.out: Any = ffi.new("int32_t *")

    @functools.cached_property
    def vocab_order(self) -> np.ndarray:
        """Every token id in order (the Python path's start of a whole row)."""
        return np.arange(self.buf.size, dtype=np.int32)


def top_k_superset(row: np.ndarray, k: int, out: np.ndarray | None = None) -> np.ndarray | None:
    """The ids (ascending, int32) of a few tokens of ``row`` that include its ``k`` highest logits and every
    token tied with the ``k``-th, found without a sort of the row (the module's C helper
    ``mtp_top_k_superset``: the ``k``-th highest of 128-token blocks' maxima bounds them from below), as a view
    of ``out`` (int32, room for ``row.size``; a chain passes its own: a fresh 1 MB array each row was mapped
    and unmapped, half the helper's time again). None where that saves nothing (a row of fewer than ``8 k``
    blocks)."""
    row = np.ascontiguousarray(row, dtype=np.float32)
    if out is None:
        out = np.empty(row.size, dtype=np.int32)
    elif out.dtype != np.int32 or out.size < row.size:
        raise ValueError(f"out must be int32 with room for {row.size} ids")
    m = lib.mtp_top_k_superset(ffi.from_buffer("float[]", row), row.size, k, ffi.from_buffer("int32_t[]", out))
    if m == -2:
        raise MemoryError("no memory for the top-k prefilter's block maxima")
    return out[:m] if m >= 0 else None


def sampler_for(params: SamplingParams, n_vocab: int, vocab: Any = None) -> Sampler:
    """A :class:`~.sampling.Sampler` drawing from a new :class:`SamplerChain` of ``params`` (close
    the sampler, or use it as a context manager, to free the chain)."""
    return Sampler(params, SamplerChain(params, n_vocab, vocab))


__all__ = ["RoundNumbers", "SamplerChain", "TOKEN_DATA", "native_seed", "sampler_for", "top_k_superset"]
