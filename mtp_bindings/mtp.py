"""The MTP draft API: attach an assistant to a target model, and draft tokens on a context with
``llama_decode_mtp_async`` / ``_wait`` (or the synchronous ``llama_decode_mtp``).

The MTP layer, under the generation loop (:mod:`mtp_bindings.generation`) and over the core
:class:`~mtp_bindings.llama_context.LlamaContext`: it checks
arguments, owns the host buffers, enforces the one-request-in-flight contract on the Python side
and turns the C return codes into exceptions. An :class:`MTPSession` holds one context's drafting
state; it subscribes to the context's KV-edit and close events (:meth:`LlamaContext.on_kv_edit`,
:meth:`LlamaContext.on_close`) to drain its request in flight, so :class:`~mtp_bindings.llama_context.LlamaContext`
itself knows nothing of drafting. :class:`MTPContext` is a context with the drafting methods; the
public :class:`mtp_bindings.Model` creates those. Use it when you write your own speculative loop::

    handle = ctx.decode_mtp_async(seq_id=0, attn_pos=ctx.seq_pos_max(0), last_token=tok,
                                  h_prev=h, n_steps=3)
    ...                       # the target may append past attn_pos meanwhile
    drafts, h_last = handle.wait()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .native import _native
from .native._native import ffi, lib
from .llama_context import LlamaContext
from .native.devices import placement_array
from .exceptions import AssistantLoadError, InvalidParameterError, MTPBusyError, MTPError, NoAssistantError
from .llama_model import LlamaModel
from .native.mtp_status import MTP_ERR_BUSY, MTP_ERR_NO_ASSISTANT, status_text
from .config.params import THREADS_MAX, valid_thread_count
from .native.threadpool import ThreadPool

MTP_N_STEPS_MAX: int = lib.LLAMA_MTP_MAX_STEPS


def attach_assistant(model: LlamaModel, path: Any, n_gpu_layers: int | None = None,
                     devices: str | Sequence[str] | None = None) -> None:
    """Attach the assistant GGUF at ``path`` to ``model`` (see :meth:`mtp_bindings.Model.attach_assistant`).
    Its layers go where the target's went (``model.n_gpu_layers``, ``model.devices``, the target's RPC
    servers' devices) unless ``n_gpu_layers`` / ``devices`` say otherwise."""
    n_gpu_layers = model.n_gpu_layers if n_gpu_layers is None else n_gpu_layers
    if not isinstance(n_gpu_layers, int) or isinstance(n_gpu_layers, bool):
        raise InvalidParameterError(f"n_gpu_layers_draft must be an int, got {n_gpu_layers!r}")
    devices = model.devices if devices is None else devices
    params = lib.llama_model_default_params()
    params.n_gpu_layers = n_gpu_layers
    params.use_extra_bufts = model.repack  # the target's weight layout choice
    keep = placement_array(devices, model.rpc_devices)
    if keep is not None:
        params.devices = keep
    _native.clear_errors()
    rc = lib.llama_model_load_mtp_from_file(model.ptr, str(path).encode(), params)
    if rc != 0:
        _native.raise_native(AssistantLoadError, f"cannot attach assistant {path}: {status_text(rc)}", rc)


def graph_stats(ctx: LlamaContext) -> dict[str, int]:
    """The context's MTP counters: requests, steps, graph builds and reuses, the threads the last
    request's drafting graph computed with, the backend splits of the current drafting graph
    (1: one backend, e.g. the GPU or RPC worker holding every layer, computes a whole draft step), and the
    draft steps' host<->device traffic (tensors moved, their bytes, the host's waits for a device; all 0
    when every backend is a CPU)."""
    st = lib.llama_mtp_get_stats(ctx.ptr)
    return {"n_requests": st.n_requests, "n_steps": st.n_steps, "n_graph_builds": st.n_graph_builds,
            "n_graph_reuses": st.n_graph_reuses, "n_threads_last": st.n_threads_last,
            "n_graph_splits": st.n_graph_splits, "n_transfers": st.n_transfers,
            "n_transfer_bytes": st.n_transfer_bytes, "n_syncs": st.n_syncs}


def set_worker_threads(ctx: LlamaContext, n_threads: int | None) -> None:
    """Threads of ``ctx``'s asynchronous drafting requests: a count, or None for the automatic one
    (the CPUs the context's threads leave free, 1 where fewer than 2 are). Synchronous drafting
    always computes with the context's threads."""
    if n_threads is not None and not valid_thread_count(n_threads):
        raise InvalidParameterError(f"MTP threads must be an int in 1..{THREADS_MAX} or None, got {n_threads!r}")
    _native.clear_errors()
    rc = lib.llama_mtp_set_n_threads(ctx.ptr, n_threads or 0)
    if rc != 0:
        _raise_for(rc, "cannot set the drafting threads")


def n_embd_backbone(model: LlamaModel) -> int:
    return int(lib.llama_model_mtp_n_embd_backbone(model.ptr))


def _raise_for(rc: int, what: str) -> None:
    exc = MTPBusyError if rc == MTP_ERR_BUSY else NoAssistantError if rc == MTP_ERR_NO_ASSISTANT else MTPError
    _native.raise_native(exc, f"{what}: {status_text(rc)}", rc)


class MTPHandle:
    """One MTP request in flight; :meth:`wait` returns ``(drafts, h_last)``."""

    def __init__(self, session: MTPSession, n_steps: int) -> None:
        self._session = session
        self.n_steps = n_steps
        self._result: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def pending(self) -> bool:
        return self._result is None and self._session.in_flight is self

    def wait(self) -> tuple[np.ndarray, np.ndarray]:
        """Block until the drafts are ready: ``(drafts int32 [n_steps], h_last float32 [n_bb])``."""
        if self._result is None:
            self._result = self._session.wait(self)
        return self._result


class MTPSession:
    """One context's drafting: the host buffers and the request in flight (at most one)."""

    def __init__(self, ctx: LlamaContext) -> None:
        model = ctx.model
        if not model.has_assistant:  # type: ignore[attr-defined]
            raise NoAssistantError("no MTP assistant is attached to this model: use Model(..., assistant=PATH)"
                                   " or model.attach_assistant(PATH)", MTP_ERR_NO_ASSISTANT)
        self.ctx = ctx
        self.n_bb = n_embd_backbone(model)  # type: ignore[arg-type]
        self.drafts = np.zeros(MTP_N_STEPS_MAX, dtype=np.int32)
        self.h_last = np.zeros(self.n_bb, dtype=np.float32)
        self._c_drafts = ffi.from_buffer("llama_token[]", self.drafts)
        self._c_h_last = ffi.from_buffer("float[]", self.h_last)
        self.in_flight: MTPHandle | None = None
        self.threadpool: ThreadPool | None = None
        self._lock = threading.Lock()
        # a destructive KV edit or freeing the context must not race the drafting worker
        ctx.on_kv_edit(self.discard)
        ctx.on_close(self.discard)
        ctx.on_close(self._forget_threadpool)  # a freed context no longer computes on its pool

    def set_threadpool(self, pool: ThreadPool | None, detach: Callable[[], None] | None = None) -> None:
        """Asynchronous drafting computes on ``pool``'s threads (None: on the set count again);
        ``detach()`` is what the pool calls when it is closed first."""
        if pool is not None and not isinstance(pool, ThreadPool):
            raise InvalidParameterError(f"the MTP threadpool must be a ThreadPool or None, got {pool!r}")
        with self._lock:
            _native.clear_errors()
            if pool is None:
                rc = lib.llama_mtp_detach_threadpool(self.ctx.ptr)
            else:
                rc = lib.llama_mtp_attach_threadpool(self.ctx.ptr, pool.ptr)
            if rc != 0:
                _raise_for(rc, "cannot set the drafting threadpool")
            if self.threadpool is not None and self.threadpool is not pool:
                self.threadpool.remove_user(id(self))
            self.threadpool = pool
            if pool is not None:
                assert detach is not None
                pool.add_user(id(self), detach)

    def _forget_threadpool(self) -> None:
        if self.threadpool is not None:
            self.threadpool.remove_user(id(self))
            self.threadpool = None

    def _call(self, name: str, *args: Any) -> int:
        """``lib.<name>(*args)``, reported to the context's observer when it has one."""
        fn = getattr(lib, name)
        if self.ctx.observer is None:
            return int(fn(*args))
        t0 = time.perf_counter()
        rc = int(fn(*args))
        self.ctx.observe(name, time.perf_counter() - t0)
        return rc

    def check_args(self, seq_id: int, attn_pos: int, last_token: int, h_prev: np.ndarray, n_steps: int) -> np.ndarray:
        for name, v in (("seq_id", seq_id), ("attn_pos", attn_pos), ("last_token", last_token), ("n_steps", n_steps)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise InvalidParameterError(f"{name} must be an int, got {v!r}")
        if not 1 <= n_steps <= MTP_N_STEPS_MAX:
            raise InvalidParameterError(f"n_steps must be in 1..{MTP_N_STEPS_MAX}, got {n_steps}")
        h = np.ascontiguousarray(h_prev, dtype=np.float32)
        if h.shape != (self.n_bb,):
            raise InvalidParameterError(f"h_prev must have shape ({self.n_bb},), got {h.shape}")
        return h

    def submit(self, seq_id: int, attn_pos: int, last_token: int, h_prev: np.ndarray, n_steps: int) -> MTPHandle:
        h = self.check_args(seq_id, attn_pos, last_token, h_prev, n_steps)
        with self._lock:
            if self.in_flight is not None:
                raise MTPBusyError("an MTP request is already in flight on this context: wait() for it first",
                                   MTP_ERR_BUSY)
            _native.clear_errors()
            rc = self._call("llama_decode_mtp_async", self.ctx.ptr, seq_id, attn_pos, last_token,
                            ffi.from_buffer("float[]", h), n_steps)
            if rc != 0:
                _raise_for(rc, "llama_decode_mtp_async")
            handle = MTPHandle(self, n_steps)
            self.in_flight = handle
            return handle

    def wait(self, handle: MTPHandle) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            if self.in_flight is not handle:
                raise MTPBusyError("this MTP request is no longer pending (it was drained or already waited)",
                                   MTP_ERR_BUSY)
            self.in_flight = None
            _native.clear_errors()
            rc = self._call("llama_decode_mtp_wait", self.ctx.ptr, self._c_drafts, self._c_h_last)
            if rc != 0:
                _raise_for(rc, "llama_decode_mtp_wait")
            return self.drafts[: handle.n_steps].copy(), self.h_last.copy()

    def discard(self) -> None:
        """Drain the request in flight, if any, and drop its result (before destructive KV edits)."""
        with self._lock:
            if self.in_flight is None:
                return
            self.in_flight = None
            self._call("llama_decode_mtp_wait", self.ctx.ptr, self._c_drafts, self._c_h_last)

    def run_sync(self, seq_id: int, attn_pos: int, last_token: int, h_prev: np.ndarray, n_steps: int,
                 want_logits: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        h = self.check_args(seq_id, attn_pos, last_token, h_prev, n_steps)
        with self._lock:
            if self.in_flight is not None:
                raise MTPBusyError("an MTP request is in flight on this context: wait() for it first", MTP_ERR_BUSY)
            logits = np.zeros((n_steps, self.ctx.model.n_vocab), dtype=np.float32) if want_logits else None
            c_logits = ffi.from_buffer("float[]", logits) if logits is not None else ffi.NULL
            _native.clear_errors()
            rc = self._call("llama_decode_mtp", self.ctx.ptr, seq_id, attn_pos, last_token,
                            ffi.from_buffer("float[]", h), n_steps, self._c_drafts, c_logits, self._c_h_last)
            if rc != 0:
                _raise_for(rc, "llama_decode_mtp")
            return self.drafts[:n_steps].copy(), self.h_last.copy(), logits


SESSION_KEY = "mtp"  # the session's key among the context's extensions


def session_of(ctx: LlamaContext) -> MTPSession:
    """The context's MTP session, created on first use (:class:`NoAssistantError` without an
    assistant)."""
    session = ctx.extension(SESSION_KEY, MTPSession)
    assert session is not None
    return session


def current_session(ctx: LlamaContext) -> MTPSession | None:
    """The context's MTP session if drafting was ever used on it, else None (no side effects)."""
    return ctx.extension(SESSION_KEY)


class MTPContext(LlamaContext):
    """A :class:`~mtp_bindings.llama_context.LlamaContext` that can also draft with the model's MTP assistant."""

    def decode_mtp_async(self, *, seq_id: int = 0, attn_pos: int, last_token: int, h_prev: np.ndarray,
                         n_steps: int) -> MTPHandle:
        """Submit an MTP draft request; returns a handle whose ``wait()`` gives ``(drafts, h_last)``.

        ``attn_pos`` is the last KV position the drafter may attend to (normally
        ``seq_pos_max(seq_id)``), ``last_token`` the token after it (not yet in the KV),
        ``h_prev`` the target's hidden state for the last accepted token. ``h_prev`` is copied:
        reuse it freely. At most one request per context is in flight (:class:`MTPBusyError`).
        """
        with self._lock:
            self._check_seq(seq_id)
            return session_of(self).submit(seq_id, attn_pos, last_token, h_prev, n_steps)

    # a count given to set_mtp_threads, which generations then keep (None: they choose, see MTPDrafter)
    draft_threads: int | None = None

    def set_mtp_threads(self, n_threads: int | None) -> None:
        """Threads of asynchronous MTP drafting (:meth:`decode_mtp_async`): a count, or None for
        the automatic one (the CPUs this context's threads leave free, 1 where fewer than 2 are: the
        target may decode meanwhile). :meth:`decode_mtp` always uses the context's threads. A count
        is kept by the generations on this context (llama.cpp's ``-td``); with None each generation
        drafts with the context's threads while it waits for the draft."""
        with self._lock:
            set_worker_threads(self, n_threads)
            self.draft_threads = n_threads

    def attach_mtp_threadpool(self, pool: ThreadPool) -> None:
        """Asynchronous MTP drafting computes on ``pool``'s threads (their count replaces
        :meth:`set_mtp_threads`'s) until :meth:`detach_mtp_threadpool`, or until the pool is closed,
        which detaches it first. Do not give it the threadpool of a computation that may run at the
        same time. :meth:`decode_mtp` keeps the context's threads."""
        with self._lock:
            session_of(self).set_threadpool(pool, self.detach_mtp_threadpool)

    def detach_mtp_threadpool(self) -> None:
        """Asynchronous MTP drafting computes on the count :meth:`set_mtp_threads` set again. A closed
        context has nothing to detach."""
        with self._lock:
            if not self.closed:
                session_of(self).set_threadpool(None)

    def decode_mtp(self, *, seq_id: int = 0, attn_pos: int, last_token: int, h_prev: np.ndarray, n_steps: int,
                   return_logits: bool = False) -> tuple[np.ndarray, ...]:
        """Synchronous MTP drafting: ``(drafts, h_last)``, plus ``[n_steps, n_vocab]`` logits of
        every draft step when ``return_logits`` (diagnostics, reference tests)."""
        with self._lock:
            self._check_seq(seq_id)
            drafts, h_last, logits = session_of(self).run_sync(seq_id, attn_pos, last_token, h_prev, n_steps,
                                                               return_logits)
            return (drafts, h_last, logits) if logits is not None else (drafts, h_last)
