"""What a decode outputs, read back: the part of :class:`~mtp_bindings.llama_context.LlamaContext` that
reads the last decode's logits and embeddings rows as numpy arrays.

One job: llama.cpp's ``llama_get_logits_ith`` / ``llama_get_embeddings_ith`` and whether embeddings
are output, with their checks, as :class:`ContextOutputs`, a base class of ``LlamaContext`` (which
decodes and sets the sizes and the number of output rows read here).
"""

from __future__ import annotations

import numpy as np

from ..exceptions import ContextError, DecodeError, InvalidParameterError
from ..native._handle import NativeHandle
from ..native._native import ffi, lib


class ContextOutputs(NativeHandle):
    """The last decode's output rows (logits, embeddings), each indexed ``0..n_outputs-1`` (or from the
    end, ``-1`` the last), read under the context's lock."""

    # set by the context: its sizes, whether embeddings are output, the rows of the last decode
    _n_vocab: int
    _n_embd: int
    _embeddings_on: bool
    n_outputs: int

    def set_embeddings(self, on: bool) -> None:
        """Also output hidden states (needed for MTP drafting: ``h_prev``)."""
        with self._lock:
            if bool(on) != self._embeddings_on:
                lib.llama_set_embeddings(self.ptr, bool(on))
                self._embeddings_on = bool(on)

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
