"""The batch a context decodes: one ``llama_batch`` for the context's lifetime, filled for each chunk.

One job: write a chunk's tokens, positions, sequence id and output flags into the native batch, as
:class:`DecodeBatch`, owned by :class:`~mtp_bindings.llama_context.LlamaContext` (which checks them first
and frees the batch with itself). A prompt is written with numpy's vectorised stores; a generation round's
few tokens element by element through cffi, which on a small pair's round cost ~50 us less than numpy's
small-array calls (a round's decode there takes ~250 us).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..native._native import ffi, lib
from .vocab import FEW_TOKENS


class DecodeBatch:
    """A native ``llama_batch`` of up to ``n`` tokens, one sequence id per token."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.ptr: Any = lib.llama_batch_init(n, 0, 1)
        b = self.ptr
        # numpy views of the batch arrays: a prompt's chunk is a few vectorised stores
        self._token = np.frombuffer(ffi.buffer(b.token, n * 4), dtype=np.int32)
        self._pos = np.frombuffer(ffi.buffer(b.pos, n * 4), dtype=np.int32)
        self._logits = np.frombuffer(ffi.buffer(b.logits, n), dtype=np.int8)
        np.frombuffer(ffi.buffer(b.n_seq_id, n * 4), dtype=np.int32)[:] = 1
        self._seq = [b.seq_id[i] for i in range(n)]
        self._seq_id, self._seq_rows = -1, 0  # rows of self._seq already holding _seq_id

    def fill(self, toks: list[int] | np.ndarray, pos: int, seq_id: int, out: str | np.ndarray) -> int:
        """Write a chunk of at most ``n`` tokens at positions ``pos, pos + 1, ...`` of ``seq_id``; ``out``
        says which rows output: ``"all"``, ``"last"``, ``"none"`` or an int8 flag per token. Returns the
        number of rows asked."""
        m = len(toks)
        b = self.ptr
        if type(toks) is list:
            token, position = b.token, b.pos
            for i, t in enumerate(toks):
                token[i] = t
                position[i] = pos + i
        else:
            self._token[:m] = toks
            self._pos[:m] = np.arange(pos, pos + m, dtype=np.int32)
        # per-token sequence ids: written once per row and sequence, not on every decode
        if seq_id != self._seq_id:
            self._seq_id, self._seq_rows = seq_id, 0
        for i in range(self._seq_rows, m):
            self._seq[i][0] = seq_id
        self._seq_rows = max(self._seq_rows, m)
        b.n_tokens = m
        if not isinstance(out, str):
            self._logits[:m] = out
            return int(out.sum())
        flag = int(out == "all")
        if m <= FEW_TOKENS:
            flags = b.logits
            for i in range(m):
                flags[i] = flag
        else:
            self._logits[:m] = flag
        if out == "last":
            b.logits[m - 1] = 1
            return 1
        return m * flag

    def free(self) -> None:
        lib.llama_batch_free(self.ptr)
