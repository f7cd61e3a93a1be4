"""The MTP draft API: attach an assistant to a target model, and draft tokens on a context with
``llama_decode_mtp_async`` / ``_wait`` (or the synchronous ``llama_decode_mtp``).

This is the expert layer under the driver (:mod:`mtp_bindings.speculative`): it checks arguments,
owns the host buffers, enforces the one-request-in-flight contract on the Python side and turns
the C return codes into exceptions. Use it when you write your own speculative loop::

    handle = ctx.decode_mtp_async(seq_id=0, attn_pos=ctx.seq_pos_max(0), last_token=tok,
                                  h_prev=h, n_steps=3)
    ...                       # the target may append past attn_pos meanwhile
    drafts, h_last = handle.wait()
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _native
from ._native import ffi, lib
from .exceptions import AssistantLoadError, InvalidParameterError, MTPBusyError, MTPError, NoAssistantError

if TYPE_CHECKING:
    from .context import Context
    from .model import Model

MTP_N_STEPS_MAX = 16  # LLAMA_MTP_MAX_STEPS

# enum llama_mtp_status of the patched llama.h (documented there, next to the prototypes)
MTP_STATUS: dict[int, str] = {
    -1: "invalid argument (a NULL pointer)",
    -2: "the assistant file could not be loaded (unreadable or malformed)",
    -3: "not a Gemma 4 assistant for this target (architecture or attention layout)",
    -4: "the assistant's backbone width does not match the target's hidden size",
    -5: "the assistant's vocabulary is not compatible with the target's",
    -6: "no MTP assistant is attached to the model",
    -7: "an MTP request is already in flight (or nothing is pending to wait for)",
    -8: "invalid seq_id",
    -9: "n_steps out of range",
    -10: "attn_pos must be the sequence's last KV position (llama_memory_seq_pos_max)",
    -11: "last_token is outside the vocabulary",
    -12: "the MTP graph computation failed",
    -13: "an assistant is already attached to this model",
}
MTP_ERR_NO_ASSISTANT = -6
MTP_ERR_BUSY = -7


def _require(name: str) -> Any:
    fn = getattr(lib, name, None)
    if fn is None:
        raise MTPError(f"this build of libllama has no {name} (the MTP patches are missing)")
    return fn


def attach_assistant(model: Model, path: Any) -> None:
    """Attach the assistant GGUF at ``path`` to ``model`` (see :meth:`Model.attach_assistant`)."""
    load = _require("llama_model_load_mtp_from_file")
    params = lib.llama_model_default_params()
    _native.pop_recent_errors()
    rc = load(model.ptr, str(path).encode(), params)
    if rc != 0:
        why = _native.pop_recent_errors()
        msg = MTP_STATUS.get(rc, f"error {rc}")
        raise AssistantLoadError(f"cannot attach assistant {path}: {msg}{': ' + why if why else ''}", rc)


def graph_stats(ctx: Context) -> dict[str, int]:
    """The context's MTP counters: requests, steps, graph builds and reuses, and the threads the last
    request's drafting graph computed with."""
    st = _require("llama_mtp_get_stats")(ctx.ptr)
    return {"n_requests": st.n_requests, "n_steps": st.n_steps, "n_graph_builds": st.n_graph_builds,
            "n_graph_reuses": st.n_graph_reuses, "n_threads_last": st.n_threads_last}


def set_worker_threads(ctx: Context, n_threads: int | None) -> None:
    """Threads of ``ctx``'s asynchronous drafting requests: a count, or None for the automatic one
    (the CPUs the context's threads leave free, 1 where fewer than 2 are). Synchronous drafting
    always computes with the context's threads."""
    if n_threads is not None and (isinstance(n_threads, bool) or not isinstance(n_threads, int)
                                  or not 1 <= n_threads <= 512):
        raise InvalidParameterError(f"MTP threads must be an int in 1..512 or None, got {n_threads!r}")
    _native.pop_recent_errors()
    rc = _require("llama_mtp_set_n_threads")(ctx.ptr, n_threads or 0)
    if rc != 0:
        _raise_for(rc, "cannot set the drafting threads")


def n_embd_backbone(model: Model) -> int:
    return int(_require("llama_model_mtp_n_embd_backbone")(model.ptr))


def _raise_for(rc: int, what: str) -> None:
    msg = f"{what}: {MTP_STATUS.get(rc, f'error {rc}')}"
    why = _native.pop_recent_errors()
    if why:
        msg += f" ({why})"
    if rc == MTP_ERR_BUSY:
        raise MTPBusyError(msg, rc)
    if rc == MTP_ERR_NO_ASSISTANT:
        raise NoAssistantError(msg, rc)
    raise MTPError(msg, rc)


class MTPHandle:
    """One MTP request in flight; :meth:`wait` returns ``(drafts, h_last)``."""

    def __init__(self, state: MTPState, n_steps: int) -> None:
        self._state = state
        self.n_steps = n_steps
        self._result: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def pending(self) -> bool:
        return self._result is None and self._state.in_flight is self

    def wait(self) -> tuple[np.ndarray, np.ndarray]:
        """Block until the drafts are ready: ``(drafts int32 [n_steps], h_last float32 [n_bb])``."""
        if self._result is None:
            self._result = self._state.wait(self)
        return self._result


class MTPState:
    """Per-context MTP bookkeeping: host buffers and the request in flight."""

    def __init__(self, ctx: Context) -> None:
        if not ctx.model.has_assistant:
            raise NoAssistantError("no MTP assistant is attached to this model: use Model(..., assistant=PATH)"
                                   " or model.attach_assistant(PATH)", MTP_ERR_NO_ASSISTANT)
        self.ctx = ctx
        self.n_bb = n_embd_backbone(ctx.model)
        self.drafts = np.zeros(MTP_N_STEPS_MAX, dtype=np.int32)
        self.h_last = np.zeros(self.n_bb, dtype=np.float32)
        self._c_drafts = ffi.from_buffer("llama_token[]", self.drafts)
        self._c_h_last = ffi.from_buffer("float[]", self.h_last)
        self.in_flight: MTPHandle | None = None
        self._lock = threading.Lock()
        self._async = _require("llama_decode_mtp_async")
        self._wait = _require("llama_decode_mtp_wait")
        self._sync = _require("llama_decode_mtp")

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
                raise MTPBusyError("an MTP request is already in flight on this context: wait() for it first", -7)
            rc = self._async(self.ctx.ptr, seq_id, attn_pos, last_token, ffi.from_buffer("float[]", h), n_steps)
            if rc != 0:
                _raise_for(rc, "llama_decode_mtp_async")
            handle = MTPHandle(self, n_steps)
            self.in_flight = handle
            return handle

    def wait(self, handle: MTPHandle) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            if self.in_flight is not handle:
                raise MTPBusyError("this MTP request is no longer pending (it was drained or already waited)", -7)
            self.in_flight = None
            rc = self._wait(self.ctx.ptr, self._c_drafts, self._c_h_last)
            if rc != 0:
                _raise_for(rc, "llama_decode_mtp_wait")
            return self.drafts[: handle.n_steps].copy(), self.h_last.copy()

    def discard(self) -> None:
        """Drain the request in flight, if any, and drop its result (before destructive KV edits)."""
        with self._lock:
            if self.in_flight is None:
                return
            self.in_flight = None
            self._wait(self.ctx.ptr, self._c_drafts, self._c_h_last)

    def run_sync(self, seq_id: int, attn_pos: int, last_token: int, h_prev: np.ndarray, n_steps: int,
                 want_logits: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        h = self.check_args(seq_id, attn_pos, last_token, h_prev, n_steps)
        with self._lock:
            if self.in_flight is not None:
                raise MTPBusyError("an MTP request is in flight on this context: wait() for it first", -7)
            logits = np.zeros((n_steps, self.ctx.model.n_vocab), dtype=np.float32) if want_logits else None
            c_logits = ffi.from_buffer("float[]", logits) if logits is not None else ffi.NULL
            rc = self._sync(self.ctx.ptr, seq_id, attn_pos, last_token, ffi.from_buffer("float[]", h), n_steps,
                            self._c_drafts, c_logits, self._c_h_last)
            if rc != 0:
                _raise_for(rc, "llama_decode_mtp")
            return self.drafts[:n_steps].copy(), self.h_last.copy(), logits


def state_of(ctx: Context) -> MTPState:
    """The context's MTP state, created on first use."""
    with ctx._lock:
        if ctx._mtp_state is None:
            ctx._mtp_state = MTPState(ctx)
        return ctx._mtp_state
