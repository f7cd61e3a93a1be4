"""``Context``: one llama.cpp inference context on a :class:`~mtp_bindings.model.Model` — decode
batches, read logits and embeddings as numpy arrays, and edit the KV memory.

A context serializes its own use: calls from several threads take turns (each public method holds
the context's lock), so two threads sharing one context get consistent, if interleaved, results.
Give each thread its own context for parallel work.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, Sequence

import numpy as np

from . import _native
from ._handle import NativeHandle
from ._native import ffi, lib
from .exceptions import ContextError, ContextOverflowError, DecodeError, InvalidParameterError
from .threads import (ADAPT_INTERVAL_S, ADAPT_SAMPLES, check_threads, default_threads, runnable_threads,
                      threads_for_load, usable_cpus)

if TYPE_CHECKING:
    from .model import Model

KV_TYPES = {
    "f32": "GGML_TYPE_F32", "f16": "GGML_TYPE_F16", "bf16": "GGML_TYPE_BF16",
    "q8_0": "GGML_TYPE_Q8_0", "q4_0": "GGML_TYPE_Q4_0", "q4_1": "GGML_TYPE_Q4_1",
    "q5_0": "GGML_TYPE_Q5_0", "q5_1": "GGML_TYPE_Q5_1", "iq4_nl": "GGML_TYPE_IQ4_NL",
}
FLASH_ATTN = {"auto": "LLAMA_FLASH_ATTN_TYPE_AUTO", "on": "LLAMA_FLASH_ATTN_TYPE_ENABLED",
              "off": "LLAMA_FLASH_ATTN_TYPE_DISABLED"}

LogitsSelect = Literal["last", "all", "none"] | Sequence[bool]


@dataclass
class ContextParams:
    """Parameters of a :class:`Context` (llama.cpp's names; validated on creation)."""

    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    n_seq_max: int = 1
    n_threads: int | None = None
    n_threads_batch: int | None = None
    embeddings: bool = False
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: str = "auto"
    offload_kqv: bool = True
    # compute with the part of the thread budget other work leaves free (see Context.adapt_threads);
    # None: adapt exactly when n_threads is not given
    adapt_threads: bool | None = None

    @property
    def adapts_threads(self) -> bool:
        return (self.n_threads is None and self.n_threads_batch is None) if self.adapt_threads is None \
            else bool(self.adapt_threads)

    def validate(self) -> None:
        for name in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise InvalidParameterError(f"{name} must be a positive int, got {v!r}")
        if self.n_ctx > 1 << 24:
            raise InvalidParameterError(f"n_ctx {self.n_ctx} is unreasonably large")
        if self.n_seq_max > 256:
            raise InvalidParameterError(f"n_seq_max must be <= 256, got {self.n_seq_max}")
        if self.n_ubatch > self.n_batch:
            raise InvalidParameterError(f"n_ubatch ({self.n_ubatch}) must be <= n_batch ({self.n_batch})")
        for name in ("n_threads", "n_threads_batch"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 512):
                raise InvalidParameterError(f"{name} must be an int in 1..512 or None, got {v!r}")
        if self.adapt_threads is not None and not isinstance(self.adapt_threads, bool):
            raise InvalidParameterError(f"adapt_threads must be a bool or None, got {self.adapt_threads!r}")
        for name in ("type_k", "type_v"):
            v = getattr(self, name)
            if v not in KV_TYPES:
                raise InvalidParameterError(f"{name} must be one of {sorted(KV_TYPES)}, got {v!r}")
        if self.flash_attn not in FLASH_ATTN:
            raise InvalidParameterError(f"flash_attn must be one of {sorted(FLASH_ATTN)}, got {self.flash_attn!r}")
        if self.type_v not in ("f32", "f16", "bf16") and self.flash_attn == "off":
            raise InvalidParameterError("a quantized V cache needs flash_attn 'on' or 'auto'")

    @property
    def resolved_flash_attn(self) -> str:
        """``auto`` means off unless the V cache is quantized (which needs flash attention).

        Why off: speculative verification decodes k+1 tokens at once and must give the logits a
        one-token decode gives. Without flash attention llama.cpp's CPU path agrees to ~1e-6
        between the two; its CPU flash attention does not (2.7e-3 measured on the keqv fixture),
        which flips greedy near-ties and breaks "MTP output == plain output"."""
        if self.flash_attn != "auto":
            return self.flash_attn
        return "on" if self.type_v not in ("f32", "f16", "bf16") else "off"

    def to_native(self) -> Any:
        p = lib.llama_context_default_params()
        p.n_ctx = self.n_ctx
        p.n_batch = self.n_batch
        p.n_ubatch = self.n_ubatch
        p.n_seq_max = self.n_seq_max
        p.n_threads = self.n_threads or default_threads()
        p.n_threads_batch = self.n_threads_batch or p.n_threads
        check_threads(max(p.n_threads, p.n_threads_batch))
        p.embeddings = self.embeddings
        p.type_k = getattr(lib, KV_TYPES[self.type_k])
        p.type_v = getattr(lib, KV_TYPES[self.type_v])
        p.flash_attn_type = getattr(lib, FLASH_ATTN[self.resolved_flash_attn])
        p.offload_kqv = self.offload_kqv
        p.no_perf = False
        return p


class Context(NativeHandle):
    """An inference context. Create it with :meth:`Model.create_context`; close it (or use
    ``with``) to free its native memory."""

    closed_error = ContextError
    kind = "context"

    def __init__(self, model: Model, params: ContextParams | None = None, **kwargs: Any) -> None:
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
        _native.pop_recent_errors()
        ptr = lib.llama_init_from_model(model.ptr, self.params.to_native())
        if ptr == ffi.NULL:
            why = _native.pop_recent_errors() or "llama.cpp could not create it"
            raise ContextError(f"failed to create a context (n_ctx={self.params.n_ctx}): {why}")
        self._ptr = ptr
        self._mem = lib.llama_get_memory(ptr)
        self.n_ctx = int(lib.llama_n_ctx(ptr))
        # llama.cpp may clamp n_batch (e.g. to the requested n_ctx): chunk by what it really uses
        self.n_batch = min(int(lib.llama_n_batch(ptr)), self.params.n_batch)
        self._n_vocab = model.n_vocab
        self._n_embd = int(lib.llama_model_n_embd_out(model.ptr)) if hasattr(lib, "llama_model_n_embd_out") else model.n_embd
        self._batch = lib.llama_batch_init(self.n_batch, 0, 1)
        b = self._batch
        n = self.n_batch
        # numpy views of the batch arrays: filling a batch is a few vectorised stores
        self._b_token = np.frombuffer(ffi.buffer(b.token, n * 4), dtype=np.int32)
        self._b_pos = np.frombuffer(ffi.buffer(b.pos, n * 4), dtype=np.int32)
        self._b_nseq = np.frombuffer(ffi.buffer(b.n_seq_id, n * 4), dtype=np.int32)
        self._b_logits = np.frombuffer(ffi.buffer(b.logits, n), dtype=np.int8)
        self._b_seq = [b.seq_id[i] for i in range(n)]
        self._b_nseq[:] = 1
        self._b_seq_id, self._b_seq_rows = -1, 0  # rows of self._b_seq already holding _b_seq_id
        self._embeddings_on = self.params.embeddings
        self._threads_budget = self._threads_now = int(lib.llama_n_threads(ptr))
        self._adapt_threads = self.params.adapts_threads
        self._next_adapt = 0.0
        # the last few readings of other runnable threads: their minimum is what counts, so that a process
        # woken for a moment (a reader of our streamed output, a server's event loop) is not taken for load
        self._others_seen: deque[int] = deque(maxlen=ADAPT_SAMPLES)
        self._cpus = (usable_cpus(), os.cpu_count() or 1)  # (usable by this process, the machine's)
        self.n_outputs = 0
        self._mtp_state: Any = None  # set by mtp.py when an MTP request is in flight

    # --- lifetime -------------------------------------------------------------------------------

    def _free(self) -> None:
        """Drain any MTP request in flight, then free the batch and the context."""
        if self._mtp_state is not None:
            self._mtp_state.discard()
        lib.llama_batch_free(self._batch)
        lib.llama_free(self._ptr)

    # --- settings -------------------------------------------------------------------------------

    def set_embeddings(self, on: bool) -> None:
        """Also output hidden states (needed for MTP drafting: ``h_prev``)."""
        with self._lock:
            if bool(on) != self._embeddings_on:
                lib.llama_set_embeddings(self.ptr, bool(on))
                self._embeddings_on = bool(on)

    def set_threads(self, n_threads: int, n_threads_batch: int | None = None) -> None:
        for v in (n_threads, n_threads_batch):
            if v is not None and (not isinstance(v, int) or not 1 <= v <= 512):
                raise InvalidParameterError(f"thread counts must be ints in 1..512, got {v!r}")
        check_threads(max(n_threads, n_threads_batch or 0))
        with self._lock:
            lib.llama_set_n_threads(self.ptr, n_threads, n_threads_batch or n_threads)
            self._threads_budget = self._threads_now = n_threads
            self._adapt_threads = False  # an explicit count is used as given

    @property
    def n_threads(self) -> int:
        """Threads the next decode computes with."""
        return self._threads_now

    def adapt_threads(self) -> int:
        """For a context created without ``n_threads``: compute with the part of the thread budget
        that other work leaves free (:func:`~mtp_bindings.threads.threads_for_load`): the least other
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
        n = threads_for_load(self._threads_budget, min(self._others_seen), *self._cpus)
        if n != self._threads_now:
            with self._lock:
                lib.llama_set_n_threads(self.ptr, n, n)
                self._threads_now = n
        return n

    # --- decoding -------------------------------------------------------------------------------

    def decode(self, tokens: Sequence[int] | np.ndarray, *, pos: int | None = None, seq_id: int = 0,
               logits: LogitsSelect = "last") -> int:
        """Append ``tokens`` to sequence ``seq_id`` at positions ``pos, pos+1, ...`` (default: after
        the sequence's last position) and run the model. ``logits`` selects the rows whose logits
        (and embeddings) are kept: ``"last"``, ``"all"``, ``"none"`` or one bool per token.
        Longer inputs than ``n_batch`` are split; outputs are then those of the last chunk.
        Returns the number of output rows (index them 0..n-1 in :meth:`get_logits`)."""
        with self._lock:
            toks = self.model.check_tokens(tokens)
            n = int(toks.size)
            if n == 0:
                raise DecodeError("decode needs at least one token")
            self._check_seq(seq_id)
            if pos is None:
                pos = self.seq_pos_max(seq_id) + 1
            elif not isinstance(pos, (int, np.integer)) or pos < 0:
                raise InvalidParameterError(f"pos must be a non-negative int, got {pos!r}")
            if pos + n > self.n_ctx:
                raise ContextOverflowError(
                    f"{n} tokens at position {pos} exceed the context window (n_ctx={self.n_ctx})")
            if isinstance(logits, str):
                if logits not in ("last", "all", "none"):
                    raise InvalidParameterError(f"logits must be 'last', 'all', 'none' or a bool list, got {logits!r}")
                out = np.zeros(n, dtype=np.int8)
                if logits == "all":
                    out[:] = 1
                elif logits == "last":
                    out[-1] = 1
            else:
                out = np.asarray(logits, dtype=bool).astype(np.int8)
                if out.shape != (n,):
                    raise InvalidParameterError(f"logits mask has shape {out.shape}, expected ({n},)")
            n_out = 0
            for start in range(0, n, self.n_batch):
                m = min(self.n_batch, n - start)
                n_out = self._decode_chunk(toks[start:start + m], pos + start, seq_id, out[start:start + m])
            return n_out

    def _decode_chunk(self, toks: np.ndarray, pos: int, seq_id: int, out: np.ndarray) -> int:
        m = int(toks.size)
        self._b_token[:m] = toks
        self._b_pos[:m] = np.arange(pos, pos + m, dtype=np.int32)
        self._b_logits[:m] = out
        # per-token sequence ids: written once per row and sequence, not on every decode
        if seq_id != self._b_seq_id:
            self._b_seq_id, self._b_seq_rows = seq_id, 0
        for i in range(self._b_seq_rows, m):
            self._b_seq[i][0] = seq_id
        self._b_seq_rows = max(self._b_seq_rows, m)
        self._batch.n_tokens = m
        rc = lib.llama_decode(self.ptr, self._batch)
        if rc != 0:
            why = _native.pop_recent_errors()
            if rc == 1:
                raise ContextOverflowError(f"no KV cache slot for {m} tokens (context full){': ' + why if why else ''}", rc)
            raise DecodeError(f"llama_decode failed with code {rc}{': ' + why if why else ''}", rc)
        self.n_outputs = int(out.sum())
        return self.n_outputs

    def _check_seq(self, seq_id: int) -> None:
        if not isinstance(seq_id, (int, np.integer)) or not 0 <= seq_id < self.params.n_seq_max:
            raise InvalidParameterError(f"seq_id must be in [0, {self.params.n_seq_max}), got {seq_id!r}")

    def _check_output(self, i: int) -> int:
        if not isinstance(i, (int, np.integer)):
            raise InvalidParameterError(f"output index must be an int, got {i!r}")
        if not -self.n_outputs <= i < self.n_outputs:
            raise InvalidParameterError(f"output index {i} out of range (the last decode had {self.n_outputs} outputs)")
        return int(i)

    def get_logits(self, i: int = -1) -> np.ndarray:
        """Logits of output row ``i`` of the last decode, a float32 array of ``n_vocab``."""
        return self.logits_view(i).copy()

    def get_logits_all(self) -> np.ndarray:
        """All output rows of the last decode, ``[n_outputs, n_vocab]`` float32."""
        with self._lock:
            return np.stack([self.get_logits(i) for i in range(self.n_outputs)]) if self.n_outputs else \
                np.zeros((0, self._n_vocab), dtype=np.float32)

    def logits_view(self, i: int = -1) -> np.ndarray:
        """Logits of output row ``i`` as a read-only view of llama.cpp's buffer: no copy (a verify
        round reads a few full-vocab rows), valid only until the next decode."""
        with self._lock:
            i = self._check_output(i)
            ptr = lib.llama_get_logits_ith(self.ptr, i)
            if ptr == ffi.NULL:
                raise DecodeError(f"no logits for output {i}")
            view = np.frombuffer(ffi.buffer(ptr, self._n_vocab * 4), dtype=np.float32)
            view.flags.writeable = False
            return view

    def get_embeddings(self, i: int = -1) -> np.ndarray:
        """Hidden state of output row ``i`` of the last decode (needs embeddings on)."""
        with self._lock:
            if not self._embeddings_on:
                raise ContextError("embeddings are off: create the context with embeddings=True or call set_embeddings(True)")
            i = self._check_output(i)
            ptr = lib.llama_get_embeddings_ith(self.ptr, i)
            if ptr == ffi.NULL:
                raise DecodeError(f"no embeddings for output {i}")
            return np.frombuffer(ffi.buffer(ptr, self._n_embd * 4), dtype=np.float32).copy()

    # --- KV memory ------------------------------------------------------------------------------

    def seq_pos_max(self, seq_id: int = 0) -> int:
        """The largest position stored for ``seq_id`` (-1 when empty)."""
        self._check_seq(seq_id)
        return int(lib.llama_memory_seq_pos_max(self._mem_ptr(), seq_id))

    def seq_rm(self, seq_id: int = 0, p0: int = 0, p1: int = -1) -> bool:
        """Remove positions ``[p0, p1)`` (``p1 < 0``: to the end) of ``seq_id``. Any MTP request
        in flight is drained first (it may be reading those cells)."""
        with self._lock:
            self._check_seq(seq_id)
            if self._mtp_state is not None:
                self._mtp_state.discard()
            return bool(lib.llama_memory_seq_rm(self._mem_ptr(), seq_id, p0, p1))

    def clear(self) -> None:
        """Empty the KV memory (draining any MTP request in flight first)."""
        with self._lock:
            if self._mtp_state is not None:
                self._mtp_state.discard()
            lib.llama_memory_clear(self._mem_ptr(), True)

    def _mem_ptr(self) -> Any:
        self.ptr  # raises when closed
        return self._mem

    # --- MTP drafting (the assistant attached to the model) -------------------------------------

    def decode_mtp_async(self, *, seq_id: int = 0, attn_pos: int, last_token: int, h_prev: np.ndarray,
                         n_steps: int) -> Any:
        """Submit an MTP draft request; returns a handle whose ``wait()`` gives ``(drafts, h_last)``.

        ``attn_pos`` is the last KV position the drafter may attend to (normally
        ``seq_pos_max(seq_id)``), ``last_token`` the token after it (not yet in the KV),
        ``h_prev`` the target's hidden state for the last accepted token. ``h_prev`` is copied:
        reuse it freely. At most one request per context is in flight (:class:`MTPBusyError`).
        """
        from .mtp import state_of

        with self._lock:
            self._check_seq(seq_id)
            return state_of(self).submit(seq_id, attn_pos, last_token, h_prev, n_steps)

    def set_mtp_threads(self, n_threads: int | None) -> None:
        """Threads of asynchronous MTP drafting (:meth:`decode_mtp_async`): a count, or None for
        the automatic one (the CPUs this context's threads leave free, 1 where fewer than 2 are: the
        target may decode meanwhile). :meth:`decode_mtp` always uses the context's threads."""
        from .mtp import set_worker_threads

        with self._lock:
            set_worker_threads(self, n_threads)

    def decode_mtp(self, *, seq_id: int = 0, attn_pos: int, last_token: int, h_prev: np.ndarray, n_steps: int,
                   return_logits: bool = False) -> tuple[np.ndarray, ...]:
        """Synchronous MTP drafting: ``(drafts, h_last)``, plus ``[n_steps, n_vocab]`` logits of
        every draft step when ``return_logits`` (diagnostics, reference tests)."""
        from .mtp import state_of

        with self._lock:
            self._check_seq(seq_id)
            drafts, h_last, logits = state_of(self).run_sync(seq_id, attn_pos, last_token, h_prev, n_steps,
                                                             return_logits)
            return (drafts, h_last, logits) if return_logits else (drafts, h_last)

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
