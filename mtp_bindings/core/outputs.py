"""What a decode outputs, read back: the part of :class:`~mtp_bindings.llama_context.LlamaContext` that
reads the last decode's logits and embeddings rows as numpy arrays, or the greedy picks the graph took
in their place.

One job: llama.cpp's ``llama_get_logits_ith`` / ``llama_get_embeddings_ith`` / ``llama_get_sampled_token_ith``
and what a decode outputs (embeddings, picks in the graph), with their checks, as :class:`ContextOutputs`, a base class of ``LlamaContext`` (which
decodes and sets the sizes and the number of output rows read here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..exceptions import ContextError, DecodeError, InvalidParameterError
from ..native._handle import NativeHandle
from ..config.params import DRAFT_N_MAX
from ..native._native import ffi, lib


class ContextOutputs(NativeHandle):
    """The last decode's output rows (logits, embeddings), each indexed ``0..n_outputs-1`` (or from the
    end, ``-1`` the last), read under the context's lock."""

    # set by the context: its sizes, whether embeddings are output, the rows of the last decode
    _n_vocab: int
    _n_embd: int
    _embeddings_on: bool
    n_outputs: int
    _check_seq: Callable[[int], None]
    model: Any  # the context's model: whether it offloads decides where greedy picks are taken
    _graph_greedy: dict[int, Any]  # seq_id -> its native greedy chain, attached to the context
    _sampled: bool  # whether the last decode picked its tokens in the graph (and kept no logits rows)

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
            if self._sampled:
                raise ContextError("the last decode took its picks in the graph (sampled=True): it kept no logits")
            i = self._check_output(i)
            ptr = lib.llama_get_logits_ith(self.ptr, i)
            if ptr == ffi.NULL:
                raise DecodeError(f"no logits for output {i}")
            view = np.frombuffer(ffi.buffer(ptr, self._n_vocab * 4), dtype=np.float32)
            view.flags.writeable = False
            return view

    # --- greedy picks in the graph -----------------------------------------------------------

    def set_graph_greedy(self, seq_id: int, on: bool) -> bool:
        """Take sequence ``seq_id``'s greedy picks in the graph (llama.cpp's backend sampling: an argmax
        of each output row on the device that computed it) for decodes made with ``sampled=True``:
        they read a token id per row instead of a row of ``n_vocab`` logits. Any other decode with
        outputs for the sequence turns it off first. Switching costs a graph reservation at the next
        decode, so it stays on between generations. Returns whether it is on (a backend that cannot
        run the argmax says no). Only where the logits are on the CPU: on a Vulkan device (lavapipe) a context
        that turned it off and decoded on corrupted the heap, so a model that offloads says no."""
        with self._lock:
            self._check_seq(seq_id)
            if bool(on) == (seq_id in self._graph_greedy):
                return bool(on)
            if on and self.model.offloads:
                return False
            if not on:
                lib.llama_set_sampler(self.ptr, seq_id, ffi.NULL)
                lib.llama_sampler_free(self._graph_greedy.pop(seq_id))
                return False
            chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
            if not lib.llama_set_sampler(self.ptr, seq_id, chain):
                lib.llama_sampler_free(chain)
                return False
            self._graph_greedy[seq_id] = chain
            return True

    @property
    def graph_greedy_seqs(self) -> frozenset[int]:
        """The sequences whose greedy picks the graph takes (see :meth:`set_graph_greedy`)."""
        return frozenset(self._graph_greedy)

    def sampled_tokens(self, n: int) -> list[int]:
        """The greedy picks of the last ``n`` output rows of the last decode (made with ``sampled=True``), in
        the batch's order. (From the end: llama.cpp indexes a non-negative row by its token in the batch.)"""
        with self._lock:
            if not self._sampled:
                raise ContextError("the last decode was not made with sampled=True: it picked no tokens")
            if not 0 < n <= self.n_outputs:
                raise InvalidParameterError(f"{n} picks asked, the last decode had {self.n_outputs} outputs")
            get = lib.llama_get_sampled_token_ith
            picks = [int(get(self.ptr, i)) for i in range(-n, 0)]
            if min(picks) < 0:
                raise DecodeError(f"the graph picked no token for some of the last {n} outputs: {picks}")
            return picks

    def _prepare_outputs(self, seq_id: int, n_out: int, sampled: bool) -> None:
        """A decode with outputs from a sequence whose picks are taken in the graph, but not asked
        ``sampled``, needs its logits rows: the graph's picking goes off first."""
        if sampled and seq_id not in self._graph_greedy:
            raise ContextError(f"sampled=True needs set_graph_greedy({seq_id}, True) first")
        if not sampled and n_out and seq_id in self._graph_greedy:
            self.set_graph_greedy(seq_id, False)
        if sampled and n_out > DRAFT_N_MAX + 1:
            raise InvalidParameterError(f"a decode picks at most {DRAFT_N_MAX + 1} tokens in the graph, "
                                        f"{n_out} outputs were asked")
        self._sampled = sampled

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
