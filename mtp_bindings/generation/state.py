"""Saving a context's sequence (its KV cells and the tokens they hold) to a file, and restoring it
into the same or another context on the same model: llama.cpp's ``llama_state_seq_save_file`` /
``llama_state_seq_load_file``, the calls behind llama-server's ``/slots/{id}?action=save|restore``.

One job: make a state copy safe and the restored sequence usable as if never interrupted.
- No drafting request may run while the KV is copied: a save waits for the context's MTP request
  in flight, if any, keeping its drafts for their owner (a suspended stream goes on unharmed), under
  the context's lock.
- Restoring is a destructive KV edit: the sequence is emptied through :meth:`Context.seq_rm`, whose
  hooks drain drafting and make the prompt cache forget what it knew; the restored tokens are then
  recorded in the prompt cache (:mod:`.prompt_cache`), so that the next ``generate`` whose prompt
  starts with them decodes only what follows (the prompt's last token again, for its hidden state).
The tokens saved are what the prompt cache recorded for the sequence (the prompt and the reply of
its last generation), or the ``tokens`` given.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..native import _native
from ..native._native import ffi, lib
from ..llama_context import LlamaContext
from ..exceptions import ContextError, InvalidParameterError, TokenizeError
from ..mtp import current_session
from .prompt_cache import prompt_cache


@dataclass(frozen=True)
class StateIO:
    """What a save or a restore did: the tokens, the bytes of the file, the milliseconds it took."""

    tokens: list[int]
    n_bytes: int
    ms: float


def _drain(ctx: LlamaContext) -> None:
    """Let the drafting request in flight finish before the KV is read. A save changes nothing, so
    the request's owner still gets its drafts: waiting on the handle keeps them for its ``wait()``."""
    session = current_session(ctx)
    handle = session.in_flight if session is not None else None
    if handle is not None:
        handle.wait()


def save_state(ctx: LlamaContext, path: str | os.PathLike[str], *, seq_id: int = 0,
               tokens: Sequence[int] | None = None) -> StateIO:
    """Write sequence ``seq_id`` of ``ctx`` (its KV cells and ``tokens``, default those the prompt
    cache recorded) to ``path``."""
    p = Path(path)
    t0 = time.perf_counter()
    with ctx.lock:
        ctx._check_seq(seq_id)
        held = prompt_cache(ctx).held.get(seq_id, []) if tokens is None else list(tokens)
        toks = ctx.model.check_tokens(held) if held else np.zeros(0, dtype=np.int32)
        n_cells = ctx.seq_pos_max(seq_id) + 1
        if len(toks) > n_cells:
            raise InvalidParameterError(f"{len(toks)} tokens given, but sequence {seq_id} holds {n_cells} cells")
        _drain(ctx)
        c_toks = ffi.from_buffer("llama_token[]", np.ascontiguousarray(toks)) if len(toks) else ffi.NULL
        _native.clear_errors()
        n = int(lib.llama_state_seq_save_file(ctx.ptr, str(p).encode(), seq_id, c_toks, len(toks)))
        if n == 0:
            _native.raise_native(ContextError, f"cannot save the state of sequence {seq_id} to {p}",
                                 fallback="llama.cpp could not write it")
    return StateIO(toks.tolist(), n, (time.perf_counter() - t0) * 1e3)


def load_state(ctx: LlamaContext, path: str | os.PathLike[str], *, seq_id: int = 0) -> StateIO:
    """Replace sequence ``seq_id`` of ``ctx`` with the one saved at ``path`` (by
    :func:`save_state`, on a context of the same model); its tokens go to the prompt cache."""
    p = Path(path)
    if not p.is_file():
        raise ContextError(f"no saved state at {p}")
    t0 = time.perf_counter()
    with ctx.lock:
        ctx._check_seq(seq_id)
        ctx.seq_rm(seq_id)  # drains drafting, tells the prompt cache, empties the sequence
        buf = ffi.new("llama_token[]", ctx.n_ctx)
        n_out = ffi.new("size_t *")
        _native.clear_errors()
        n = int(lib.llama_state_seq_load_file(ctx.ptr, str(p).encode(), seq_id, buf, ctx.n_ctx, n_out))
        if n == 0:
            ctx.seq_rm(seq_id)  # whatever a failed read left behind
            _native.raise_native(ContextError, f"cannot restore {p} into sequence {seq_id} (another model, a "
                                               f"larger state than n_ctx={ctx.n_ctx}, or not a state file)",
                                 fallback="llama.cpp could not read it")
        tokens = list(ffi.unpack(buf, int(n_out[0])))
        try:
            ctx.model.check_tokens(tokens)
        except TokenizeError as e:
            ctx.seq_rm(seq_id)
            raise ContextError(f"{p} holds tokens of another vocabulary: {e}") from None
        if tokens:
            prompt_cache(ctx).store(seq_id, tokens)
    return StateIO(tokens, n, (time.perf_counter() - t0) * 1e3)
