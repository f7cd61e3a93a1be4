"""``LlamaContext``: one llama.cpp inference context on a model (:class:`~mtp_bindings.llama_model.LlamaModel`) — decode
batches, read logits and embeddings as numpy arrays, and edit the KV memory.

A context serializes its own use: calls from several threads take turns (each public method holds
the context's lock), so two threads sharing one context get consistent, if interleaved, results.
Give each thread its own context for parallel work.

A generation owns its context from its first token to its end (:meth:`LlamaContext.generation_claim`),
so two never interleave on one KV cache. A second generation asked of an owned context waits its
turn when the owner is another thread's whole (non-stream) generation, which runs to its end; when
the owner is a stream -- which its reader may keep suspended in a variable for any time -- or a
generation on the same thread, waiting could last forever, so it raises
:class:`~mtp_bindings.exceptions.ContextBusyError` at once. ``Model.generate`` without a ``context``
never meets either: the model lends it an idle context of its pool or a fresh one.

Reading the last decode's logits and embeddings is its base class
:class:`~mtp_bindings.core.outputs.ContextOutputs`.

A context knows nothing of drafting. Layers above it subscribe to its events instead:
:meth:`LlamaContext.on_kv_edit` callbacks run before a destructive KV edit and :meth:`LlamaContext.on_close`
callbacks before the native context is freed (the MTP layer drains its request in flight there); the public ``mtp_bindings.Context`` is
:class:`~mtp_bindings.mtp.MTPContext`, this class with the drafting methods.
:attr:`LlamaContext.observer`, None by default, is told how long each native decode took (benchmarks).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from contextlib import AbstractContextManager
from dataclasses import fields
from typing import Any, Callable, Literal, Protocol, Sequence, TypeVar

import numpy as np

from .core.outputs import ContextOutputs
from .core.batch import DecodeBatch
from .native import _native
from .native._native import ffi, lib
from .exceptions import ContextError, ContextOverflowError, DecodeError, InvalidParameterError
from .config.params import (DRAFT_N_MAX, FLASH_ATTN, KV_TYPES, POOLING_TYPES, THREADS_MAX, ContextParams,
                            valid_thread_count)
from .turns import GenerationTurn
from .config.threads import (ADAPT_INTERVAL_S, ADAPT_SAMPLES, FewRowThreads, check_threads, default_threads,
                             runnable_threads, threads_for_load, usable_cpus)

LogitsSelect = Literal["last", "all", "none"] | Sequence[bool]
T = TypeVar("T")
# observer(native function name, seconds): told of each decode / MTP call a context makes
NativeObserver = Callable[[str, float], None]


class ModelLike(Protocol):
    """What a context needs of its model (:class:`~mtp_bindings.llama_model.LlamaModel` is one)."""

    @property
    def ptr(self) -> Any: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def n_embd(self) -> int: ...
    def check_tokens(self, tokens: Sequence[int] | np.ndarray) -> np.ndarray: ...
    def few_tokens(self, tokens: Sequence[int] | np.ndarray) -> list[int] | None: ...
    def is_eog(self, token: int) -> bool: ...
    @property
    def offloads(self) -> bool: ...


def native_context_params(params: ContextParams) -> Any:
    """``params`` as llama.cpp's ``llama_context_params`` (thread counts resolved)."""
    p = lib.llama_context_default_params()
    p.n_ctx = params.n_ctx
    p.n_batch = params.n_batch
    p.n_ubatch = params.n_ubatch
    p.n_seq_max = params.n_seq_max
    p.n_threads = params.n_threads or default_threads()
    p.n_threads_batch = params.n_threads_batch or p.n_threads
    check_threads(max(p.n_threads, p.n_threads_batch))
    p.embeddings = params.embeddings
    p.type_k = getattr(lib, KV_TYPES[params.type_k])
    p.type_v = getattr(lib, KV_TYPES[params.type_v])
    p.type_k_swa = getattr(lib, KV_TYPES[params.resolved_type_k_swa])
    p.type_v_swa = getattr(lib, KV_TYPES[params.resolved_type_v_swa])
    p.flash_attn_type = getattr(lib, FLASH_ATTN[params.resolved_flash_attn])
    p.offload_kqv = params.offload_kqv
    if params.pooling is not None:
        p.pooling_type = getattr(lib, POOLING_TYPES[params.pooling])
    p.no_perf = False
    # a verify batch (the last token and up to DRAFT_N_MAX drafts) may take its greedy picks in the graph
    p.n_outputs_max_per_seq = min(p.n_batch, DRAFT_N_MAX + 1)
    return p


class LlamaContext(ContextOutputs):
    """An inference context. Create it with :meth:`Model.create_context`; close it (or use
    ``with``) to free its native memory.

    ``observer``: None, or a callable ``observer(name, seconds)`` called after every native decode
    (``llama_decode``) and every MTP call made for this context (``llama_decode_mtp_async`` /
    ``_wait`` / ``llama_decode_mtp``), with the seconds the call took."""

    closed_error = ContextError
    kind = "context"

    observer: NativeObserver | None = None

    def __init__(self, model: ModelLike, params: ContextParams | None = None, **kwargs: Any) -> None:
        self._ptr = ffi.NULL
        known = {f.name for f in fields(ContextParams)}
        unknown = set(kwargs) - known
        if unknown:
            raise InvalidParameterError(f"unknown context parameter(s): {', '.join(sorted(unknown))}")
        if params is not None and kwargs:
            raise InvalidParameterError("pass either a ContextParams or keyword arguments, not both")
        self.params = params or ContextParams(**kwargs)
        self.params.validate()
        self.model = model
        self._lock = threading.RLock()
        self._turn = GenerationTurn()  # which generation owns the context (see generation_claim)
        self._round = self._turn.round(self._lock)  # reused by every round (see generation_round)
        self._before_kv_edit: list[Callable[[], None]] = []
        self._before_close: list[Callable[[], None]] = []
        self._extensions: dict[str, Any] = {}
        _native.clear_errors()
        ptr = lib.llama_init_from_model(model.ptr, native_context_params(self.params))
        if ptr == ffi.NULL:
            _native.raise_native(ContextError, f"failed to create a context (n_ctx={self.params.n_ctx})",
                                 fallback="llama.cpp could not create it")
        self._ptr = ptr
        self._mem = lib.llama_get_memory(ptr)
        self.n_ctx = int(lib.llama_n_ctx(ptr))
        # llama.cpp may clamp n_batch (e.g. to the requested n_ctx): chunk by what it really uses
        self.n_batch = min(int(lib.llama_n_batch(ptr)), self.params.n_batch)
        self._n_vocab = model.n_vocab
        self._n_embd = int(lib.llama_model_n_embd_out(model.ptr)) if hasattr(lib, "llama_model_n_embd_out") else model.n_embd
        self._batch = DecodeBatch(self.n_batch)
        self._embeddings_on = self.params.embeddings
        self._threads_budget = self._threads_now = int(lib.llama_n_threads(ptr))
        self._adapt_threads = self.params.adapts_threads
        self._next_adapt = 0.0
        # the last few readings of other runnable threads: their minimum is what counts, so that a process
        # woken for a moment (a reader of our streamed output, a server's event loop) is not taken for load
        self._others_seen: deque[int] = deque(maxlen=ADAPT_SAMPLES)
        self._cpus = (usable_cpus(), os.cpu_count() or 1)  # (usable by this process, the machine's)
        # a default-threaded CPU context times short decodes on one thread too (config.threads.FewRowThreads)
        self._few_rows = FewRowThreads() if self._adapt_threads and not model.offloads else None
        self._threads_set = self._threads_now  # what llama_set_n_threads was last given
        self.n_outputs = 0
        self._graph_greedy: dict[int, Any] = {}  # seq_id -> its native greedy chain, attached to the context
        self._sampled = False  # whether the last decode picked its tokens in the graph (no logits rows)

    # --- lifetime and events --------------------------------------------------------------------

    def on_kv_edit(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` before each destructive KV edit (:meth:`seq_rm`, :meth:`clear`),
        under the context's lock: work that may be reading those cells must finish first."""
        with self._lock:
            self._before_kv_edit.append(callback)

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once, before the native context is freed."""
        with self._lock:
            self._before_close.append(callback)

    def extension(self, key: str, factory: Callable[[LlamaContext], T] | None = None) -> T | None:
        """Per-context state a layer above keeps here under ``key`` (the MTP layer's session):
        created by ``factory(self)`` on first use when a factory is given, else None while absent.
        Under the context's lock, so two threads never create two."""
        with self._lock:
            ext = self._extensions.get(key)
            if ext is None and factory is not None:
                ext = self._extensions[key] = factory(self)
            return ext

    def _kv_edit(self) -> None:
        self._turn.check()
        for callback in self._before_kv_edit:
            callback()

    @property
    def lock(self) -> threading.RLock:
        """The context's (re-entrant) lock: hold it to make a sequence of calls one turn."""
        return self._lock  # type: ignore[return-value]

    def generation_claim(self, stream: bool = True) -> AbstractContextManager[None]:
        """Own this context for one generation (see :class:`~mtp_bindings.turns.GenerationTurn`:
        waits for another thread's whole generation, refuses a stream's or this thread's owner with
        :class:`~mtp_bindings.exceptions.ContextBusyError`)."""
        return self._turn.claim(stream)

    @property
    def busy(self) -> bool:
        """Whether a generation owns this context now (see :meth:`generation_claim`)."""
        return self._turn.busy

    def generation_round(self) -> AbstractContextManager[None]:
        """One round of the owning generation: the context's lock held, its decodes and KV edits
        allowed (outside its rounds they raise ContextBusyError while it owns the context)."""
        return self._round

    def observe(self, name: str, seconds: float) -> None:
        """Tell the :attr:`observer`, if any, that native call ``name`` took ``seconds``."""
        if self.observer is not None:
            self.observer(name, seconds)

    def _free(self) -> None:
        """Run the close callbacks, then free the batch and the context."""
        for callback in self._before_close:
            callback()
        self._batch.free()
        lib.llama_free(self._ptr)
        for chain in self._graph_greedy.values():  # ours, not the context's: freed after it
            lib.llama_sampler_free(chain)
        self._graph_greedy.clear()

    # --- settings -------------------------------------------------------------------------------

    def set_threads(self, n_threads: int, n_threads_batch: int | None = None) -> None:
        for v in (n_threads, n_threads_batch):
            if v is not None and not valid_thread_count(v):
                raise InvalidParameterError(f"thread counts must be ints in 1..{THREADS_MAX}, got {v!r}")
        check_threads(max(n_threads, n_threads_batch or 0))
        with self._lock:
            lib.llama_set_n_threads(self.ptr, n_threads, n_threads_batch or n_threads)
            self._threads_budget = self._threads_now = self._threads_set = n_threads
            self._adapt_threads = False  # an explicit count is used as given
            self._few_rows = None

    @property
    def n_threads(self) -> int:
        """The thread budget the load leaves (a short decode may take 1: :attr:`decode_threads`)."""
        return self._threads_now

    @property
    def decode_threads(self) -> int:
        """Threads the last decode computed with: :attr:`n_threads`, or 1 where short decodes were faster so."""
        return self._threads_set

    def adapt_threads(self) -> int:
        """For a context created without ``n_threads``: compute with the part of the thread budget
        that other work leaves free (:func:`~mtp_bindings.config.threads.threads_for_load`): the least other
        load of the last ``ADAPT_SAMPLES`` readings, taken at most every ``ADAPT_INTERVAL_S``. The
        generation loop calls it between rounds, when this context's own threads are idle. Results do not depend on the thread count.
        Returns the thread count in effect."""
        if not self._adapt_threads:
            return self._threads_now
        now = time.monotonic()
        if now < self._next_adapt:
            return self._threads_now
        self._next_adapt = now + ADAPT_INTERVAL_S
        running = runnable_threads()
        if running is None:
            return self._threads_now
        self._others_seen.append(running - 1)
        self._threads_now = threads_for_load(self._threads_budget, min(self._others_seen), *self._cpus)
        return self._threads_now  # applied by the next decode

    # --- decoding -------------------------------------------------------------------------------

    def decode(self, tokens: Sequence[int] | np.ndarray, *, pos: int | None = None, seq_id: int = 0,
               logits: LogitsSelect = "last", sampled: bool = False) -> int:
        """Append ``tokens`` to sequence ``seq_id`` at positions ``pos, pos+1, ...`` (default: after
        the sequence's last position) and run the model. ``logits`` selects the rows whose logits
        (and embeddings) are kept: ``"last"``, ``"all"``, ``"none"`` or one bool per token.
        Longer inputs than ``n_batch`` are split; outputs are then those of the last chunk.
        ``sampled``: the sequence's greedy picks are taken in the graph instead (see
        :meth:`set_graph_greedy`), read with :meth:`sampled_tokens`; no logits rows are kept.
        Returns the number of output rows (index them 0..n-1 in :meth:`get_logits`)."""
        with self._lock:
            self._turn.check()
            few = self.model.few_tokens(tokens)
            toks: list[int] | np.ndarray = few if few is not None else self.model.check_tokens(tokens)
            n = len(toks)
            if n == 0:
                raise DecodeError("decode needs at least one token")
            self._check_seq(seq_id)
            if pos is None:
                pos = self.seq_pos_max(seq_id) + 1
            elif not isinstance(pos, (int, np.integer)) or pos < 0:
                raise InvalidParameterError(f"pos must be a non-negative int, got {pos!r}")
            pos = int(pos)
            if pos + n > self.n_ctx:
                raise ContextOverflowError(
                    f"{n} tokens at position {pos} exceed the context window (n_ctx={self.n_ctx})")
            out: str | np.ndarray
            if isinstance(logits, str):
                if logits not in ("last", "all", "none"):
                    raise InvalidParameterError(f"logits must be 'last', 'all', 'none' or a bool list, got {logits!r}")
                out, n_asked = logits, (n if logits == "all" else int(logits == "last"))
            else:
                out = np.asarray(logits, dtype=bool).astype(np.int8)
                if out.shape != (n,):
                    raise InvalidParameterError(f"logits mask has shape {out.shape}, expected ({n},)")
                n_asked = int(out.sum())
            self._prepare_outputs(seq_id, n if self._embeddings_on else n_asked, sampled)
            n_out = 0
            for start in range(0, n, self.n_batch):
                m = min(self.n_batch, n - start)
                end = start + m == n
                chunk_out = out[start:start + m] if not isinstance(out, str) else out if end or out != "last" else "none"
                n_out = self._decode_chunk(toks[start:start + m], pos + start, seq_id, chunk_out)
            return n_out

    def _decode_chunk(self, toks: list[int] | np.ndarray, pos: int, seq_id: int, out: str | np.ndarray) -> int:
        m = len(toks)
        n_out = self._batch.fill(toks, pos, seq_id, out)
        few, budget = self._few_rows, self._threads_now
        n_threads = few.threads(m, budget) if few is not None else budget
        if n_threads != self._threads_set:
            lib.llama_set_n_threads(self.ptr, n_threads, n_threads)
            self._threads_set = n_threads
        t0 = time.perf_counter()
        rc = lib.llama_decode(self.ptr, self._batch.ptr)
        dt = time.perf_counter() - t0
        if few is not None and rc == 0:
            few.record(m, n_threads, budget, dt)
        if self.observer is not None:
            self.observer("llama_decode", dt)
        if rc != 0:
            if rc == 1:
                _native.raise_native(ContextOverflowError, f"no KV cache slot for {m} tokens (context full)", rc)
            _native.raise_native(DecodeError, f"llama_decode failed with code {rc}", rc)
        self.n_outputs = n_out
        return n_out

    def _check_seq(self, seq_id: int) -> None:
        if not isinstance(seq_id, (int, np.integer)) or not 0 <= seq_id < self.params.n_seq_max:
            raise InvalidParameterError(f"seq_id must be in [0, {self.params.n_seq_max}), got {seq_id!r}")

    # --- KV memory ------------------------------------------------------------------------------

    def seq_pos_max(self, seq_id: int = 0) -> int:
        """The largest position stored for ``seq_id`` (-1 when empty)."""
        self._check_seq(seq_id)
        return int(lib.llama_memory_seq_pos_max(self._mem_ptr(), seq_id))

    def seq_pos_min(self, seq_id: int = 0) -> int:
        """The smallest position stored for ``seq_id`` (-1 when empty): above 0 once a sliding-window
        cache has let cells outside every window go (all of ``[pos_min, pos_max]`` are held)."""
        self._check_seq(seq_id)
        return int(lib.llama_memory_seq_pos_min(self._mem_ptr(), seq_id))

    def seq_rm(self, seq_id: int = 0, p0: int = 0, p1: int = -1) -> bool:
        """Remove positions ``[p0, p1)`` (``p1 < 0``: to the end) of ``seq_id``, after the
        :meth:`on_kv_edit` callbacks (work in flight that may be reading those cells)."""
        with self._lock:
            self._check_seq(seq_id)
            self._kv_edit()
            return bool(lib.llama_memory_seq_rm(self._mem_ptr(), seq_id, p0, p1))

    def clear(self) -> None:
        """Empty the KV memory (after the :meth:`on_kv_edit` callbacks)."""
        with self._lock:
            self._kv_edit()
            lib.llama_memory_clear(self._mem_ptr(), True)

    def _mem_ptr(self) -> Any:
        self.ptr  # raises when closed
        return self._mem

    # --- simple generation (no sampling, no drafting) --------------------------------------------

    def generate_greedy(self, tokens: Sequence[int], n_predict: int, *, stop_at_eog: bool = True) -> list[int]:
        """Plain greedy decoding from an empty sequence 0: the reference the drafters must match."""
        if not isinstance(n_predict, int) or n_predict < 0:
            raise InvalidParameterError(f"n_predict must be a non-negative int, got {n_predict!r}")
        with self._lock:
            self.clear()
            out: list[int] = []
            self.decode(tokens, pos=0)
            for _ in range(n_predict):
                tok = int(np.argmax(self.get_logits(-1)))
                out.append(tok)
                if stop_at_eog and self.model.is_eog(tok):
                    break
                if len(out) == n_predict:
                    break
                self.decode([tok])
            return out
