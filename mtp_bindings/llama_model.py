"""``LlamaModel``: a loaded GGUF, its vocabulary and metadata, and the contexts made on it.

It owns the native ``llama_model`` and frees it (and its contexts) on :meth:`LlamaModel.close` /
``with``. The vocabulary (tokenize, detokenize, special tokens) is its base class
:class:`~mtp_bindings.core.vocab.ModelVocabulary`. This is the model of the bindings' lower layer:
it knows nothing of drafting or generation. The public :class:`mtp_bindings.Model`
(:mod:`mtp_bindings.api`) extends it with the MTP assistant, MTP-capable contexts and ``generate`` /
``chat``.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .native import _native
# the file helpers below are also imported from here (tests, cli.session): kept importable
from .native._model_file import (GGUF_MAGIC, ProgressCallback, _c_string, _tqdm_progress, check_gguf_file,  # noqa: F401
                                 negative_needs, read_grown, snprintf_needs)
from .native._native import ffi, lib
from .core.vocab import ModelVocabulary
from .llama_context import LlamaContext
from .native.devices import add_rpc_servers, offload_devices, parse_device_list, parse_rpc_servers, placement_array
from .exceptions import (
    ContextError,
    InvalidParameterError,
    ModelLoadError,
    NotATargetModelError,
)
from .config.limits import DEFAULT_N_CTX, default_n_ctx
from .config.params import ContextParams
from .config.signatures import ContextOptions, context_parameters, spell_out

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger("mtp_bindings")

# ContextParams' fields: the context settings a model takes (llama-cpp-python's ``Llama(n_ctx=...)``)
CONTEXT_SETTINGS = frozenset(f.name for f in fields(ContextParams))
# idle generation contexts a model keeps for the next generate/chat (more are made while generations
# overlap and closed when they end): one keeps the prompt cache warm, a second serves two threads
# taking turns without a new context each time
GENERATION_POOL_IDLE = 2
# architectures of MTP assistant (drafter) files, both layouts (see gguf_tools): not models of their own
ASSISTANT_ARCHS = ("gemma4-assistant", "gemma4_assistant")


class LlamaModel(ModelVocabulary):
    """A GGUF model loaded with llama.cpp (the lower layer; most code wants :class:`mtp_bindings.Model`).

    Args:
        path: the GGUF.
        n_gpu_layers: layers to offload to a GPU backend (-1 = all); CPU builds ignore it.
        devices: the devices to offload to (llama.cpp's ``--device``: names, ``"CUDA0,CUDA1"``,
            or ``"none"``; default all), see :mod:`mtp_bindings.native.devices`.
        rpc_servers: ggml ``rpc-server`` workers whose devices join the device list (llama.cpp's
            ``--rpc``: ``"host1:50052,host2:50052"`` or a list), first, so that ``n_gpu_layers`` splits
            the layers across them; see :func:`mtp_bindings.native.devices.add_rpc_servers` (an unreachable one is
            an :class:`~mtp_bindings.exceptions.RPCServerError`). An attached assistant follows them.
        use_mmap: map the file instead of reading it.
        repack: let llama.cpp put weights in its repacked CPU layouts (AMX where the CPU has it), its
            default; False is llama-server's ``--no-repack``. An attached assistant follows it.
        vocab_only: load only the vocabulary (no weights; no contexts can be created).
        progress: a callable ``f(fraction) -> bool | None`` (return False to abort), or True
            for a progress bar.
        verbose: forward llama.cpp's log lines to the ``mtp_bindings.native`` logger.
        **context: :class:`~mtp_bindings.config.params.ContextParams` fields (``n_ctx``, ``n_threads``,
            ``n_threads_batch``, ``n_batch``, ``n_ubatch``, ``type_k``, ``type_v``, ``flash_attn``, ...), as
            llama-cpp-python's ``Llama(...)`` takes them: the defaults of every context made on this model
            (:meth:`create_context`'s own arguments win), those ``generate`` / ``chat`` make included.
            ``n_ctx=0`` is the model's training context (llama.cpp's meaning). Without ``n_ctx`` a
            generation context holds :data:`~mtp_bindings.config.limits.DEFAULT_N_CTX` tokens (or the training
            context if shorter): its KV cache is allocated in full when it is made.
    """

    closed_error = ModelLoadError
    kind = "model"
    # what create_context makes: a layer above may offer a richer context
    context_type: type[LlamaContext] = LlamaContext

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_gpu_layers: int = 0,
        devices: str | Sequence[str] | None = None,
        rpc_servers: str | Sequence[str] | None = None,
        use_mmap: bool = True,
        vocab_only: bool = False,
        repack: bool = True,
        progress: ProgressCallback | bool | None = None,
        verbose: bool = False,
        **context: Unpack[ContextOptions],
    ) -> None:
        self._ptr = ffi.NULL
        self._lock = threading.Lock()
        self._contexts: weakref.WeakSet[LlamaContext] = weakref.WeakSet()
        self._idle: list[LlamaContext] = []  # the generation pool's idle contexts (see generation_context)
        # guards _idle only; re-entrant: a stream collected by the GC hands its context back from
        # whatever code this thread runs then, even code holding this lock
        self._pool_lock = threading.RLock()
        self.context_settings = self._check_context_settings(dict(context))
        self.path = check_gguf_file(path)
        if not isinstance(n_gpu_layers, int) or isinstance(n_gpu_layers, bool):
            raise InvalidParameterError(f"n_gpu_layers must be an int, got {n_gpu_layers!r}")
        _native.ensure_initialised()
        _native.set_verbose(verbose)
        self.verbose = verbose
        self.assistant_path: Path | None = None
        # where the layers went: an attached assistant follows it unless told otherwise
        self.n_gpu_layers = n_gpu_layers
        self.devices = devices
        # whether layers (and so the logits) may live on a device other than the CPU
        self.offloads = (n_gpu_layers != 0 and bool(offload_devices())
                         and (devices is None or bool(parse_device_list(devices))))
        self.repack = bool(repack)
        # the RPC servers' devices join this model's device list (and its assistant's), only this one's
        self.rpc_servers: tuple[str, ...] = ()
        self.rpc_devices: tuple[str, ...] = ()
        if rpc_servers is not None:
            self.rpc_servers = tuple(parse_rpc_servers(rpc_servers))
            self.rpc_devices = tuple(add_rpc_servers(self.rpc_servers))

        params = self._model_params(n_gpu_layers, use_mmap, vocab_only)
        # llama.cpp's extra weight buffer types (repacked CPU layouts, AMX where the CPU has it):
        # on by default, off is llama-server's --no-repack
        params.use_extra_bufts = self.repack
        self._device_array = placement_array(devices, self.rpc_devices)
        if self._device_array is not None:
            params.devices = self._device_array
        callback = _tqdm_progress(f"loading {self.path.name}") if progress is True else progress
        handle = None
        if callback:
            handle = ffi.new_handle(callback)
            params.progress_callback = lib._mtp_progress_callback
            params.progress_callback_user_data = handle
        _native.clear_errors()
        ptr = lib.llama_model_load_from_file(str(self.path).encode(), params)
        if ptr == ffi.NULL:
            _native.raise_native(ModelLoadError, f"failed to load model {self.path}",
                                 fallback="llama.cpp could not load it")
        self._ptr = ptr
        if self.arch in ASSISTANT_ARCHS:
            self.close()
            raise NotATargetModelError(
                f"{self.path.name} is an MTP assistant ({ASSISTANT_ARCHS[0]}), a drafter that cannot generate on "
                f"its own: load the target model and attach this file, Model(target, assistant={str(self.path)!r})")
        self._vocab_ptr = lib.llama_model_get_vocab(ptr)
        self.vocab_only = vocab_only
        self._n_vocab = int(lib.llama_vocab_n_tokens(self._vocab_ptr))
        self._piece_cache: dict[int, bytes] = {}
        if self.context_settings.get("n_ctx") == 0:  # llama.cpp's "the context the model was trained with"
            self.context_settings["n_ctx"] = self.n_ctx_train or DEFAULT_N_CTX
        if logger.isEnabledFor(logging.INFO):
            logger.info("loaded %s: %s", self.path, self.summary())

    def _check_context_settings(self, given: dict[str, Any]) -> dict[str, Any]:
        """The context settings given to the constructor, checked before anything loads: a name that
        is no setting is a TypeError naming this class (as for any keyword it does not take), a bad
        value an :class:`InvalidParameterError`."""
        unknown = sorted(set(given) - CONTEXT_SETTINGS)
        if unknown:
            raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument {unknown[0]!r} (context "
                            f"settings: {', '.join(sorted(CONTEXT_SETTINGS))})")
        settings = dict(given)
        if settings.get("n_ctx") == 0 and not isinstance(settings["n_ctx"], bool):
            ContextParams(**{**settings, "n_ctx": 1}).validate()
        else:
            ContextParams(**settings).validate()
        return settings

    def summary(self) -> str:
        """One line about the loaded weights (for the verbose log)."""
        return (f"{self.arch}, {self.n_layer} layers, n_embd {self.n_embd}, {self.n_params / 1e6:.2f}M params, "
                f"{self.size / 2**20:.1f} MiB, trained context {self.n_ctx_train}")

    @staticmethod
    def _model_params(n_gpu_layers: int, use_mmap: bool, vocab_only: bool) -> Any:
        params = lib.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.vocab_only = bool(vocab_only)
        if not use_mmap:
            params.load_mode = lib.LLAMA_LOAD_MODE_NONE  # read into memory instead of mapping
        return params

    # --- lifetime -------------------------------------------------------------------------------

    def _free(self) -> None:
        """Close every context still open on the model, then free it."""
        with self._pool_lock:
            self._idle = []
        for ctx in list(self._contexts):
            ctx.close()
        lib.llama_model_free(self._ptr)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.arch}, {self.n_layer} layers, n_embd {self.n_embd}"
        return f"<{type(self).__name__} {self.path.name}: {state}>"

    # --- description ----------------------------------------------------------------------------

    @property
    def arch(self) -> str:
        return self.metadata.get("general.architecture", "")

    @property
    def n_embd(self) -> int:
        return int(lib.llama_model_n_embd(self.ptr))

    @property
    def n_layer(self) -> int:
        return int(lib.llama_model_n_layer(self.ptr))

    @property
    def n_swa(self) -> int:
        """The sliding-attention window of the SWA layers, tokens (0: no sliding window)."""
        return int(lib.llama_model_n_swa(self.ptr))

    @property
    def n_ctx_train(self) -> int:
        return int(lib.llama_model_n_ctx_train(self.ptr))

    @property
    def n_params(self) -> int:
        return int(lib.llama_model_n_params(self.ptr))

    @property
    def size(self) -> int:
        """Bytes of weights."""
        return int(lib.llama_model_size(self.ptr))

    @property
    def description(self) -> str:
        ptr = self.ptr
        return _c_string(lambda b, n: lib.llama_model_desc(ptr, b, n))

    @property
    def metadata(self) -> dict[str, str]:
        """The GGUF key/value metadata, values as llama.cpp renders them (strings)."""
        out: dict[str, str] = {}
        ptr = self.ptr
        for i in range(int(lib.llama_model_meta_count(ptr))):
            out[self._meta_str(lib.llama_model_meta_key_by_index, ptr, i)] = self._meta_str(
                lib.llama_model_meta_val_str_by_index, ptr, i)
        return out

    @staticmethod
    def _meta_str(fn: Callable[..., int], ptr: Any, i: int) -> str:
        return _c_string(lambda b, n: fn(ptr, i, b, n))

    @property
    def chat_template(self) -> str | None:
        tmpl = lib.llama_model_chat_template(self.ptr, ffi.NULL)
        return None if tmpl == ffi.NULL else ffi.string(tmpl).decode("utf-8", errors="replace")

    # --- contexts ---------------------------------------------------------------------------------

    def create_context(self, params: ContextParams | None = None, **kwargs: Unpack[ContextOptions]) -> LlamaContext:
        """A new context on this model (a :attr:`context_type`; keyword arguments are
        :class:`~mtp_bindings.config.params.ContextParams` fields, over the model's :attr:`context_settings`)."""
        if self.vocab_only:
            raise ContextError("a vocab_only model cannot have contexts")
        settings: dict[str, Any] = {**self.context_settings, **kwargs} if params is None else dict(kwargs)
        ctx = self.context_type(self, params, **settings)
        self._contexts.add(ctx)
        self._check_trained_context(ctx.n_ctx)
        return ctx

    def _check_trained_context(self, n_ctx: int) -> None:
        """Warn (once per model) when a context is longer than the model was trained for: past
        that many tokens positions are extrapolated and output quality may degrade."""
        n_train = self.n_ctx_train
        if n_train > 0 and n_ctx > n_train and not getattr(self, "_warned_n_ctx", False):
            self._warned_n_ctx = True
            logger.warning("context size %d is beyond %s's training context (%d tokens): output past %d tokens "
                           "may degrade", n_ctx, self.path.name, n_train, n_train)

    @property
    def generation_n_ctx(self) -> int:
        """The tokens a context that ``generate`` / ``chat`` make holds: the model's ``n_ctx`` setting,
        else :data:`~mtp_bindings.config.limits.DEFAULT_N_CTX` capped at the training context."""
        return self.context_settings.get("n_ctx") or default_n_ctx(self.n_ctx_train)

    @contextmanager
    def generation_context(self) -> Iterator[LlamaContext]:
        """A context of the model's pool, owned for one generation (``generate`` without a
        ``context``): an idle one (the most recently used first: its prompt cache is the warmest),
        else a fresh one -- so overlapping generations (two streams, or two threads) each get their
        own and never wait on each other. Back in the pool after, up to :data:`GENERATION_POOL_IDLE`
        idle ones; more are closed."""
        self.ptr  # noqa: B018 (a closed model raises)
        ctx = None
        with self._pool_lock:
            while self._idle and ctx is None:
                candidate = self._idle.pop()
                ctx = None if candidate.closed or candidate.busy else candidate
        if ctx is None:
            ctx = self.create_context(**{"n_ctx": self.generation_n_ctx, **self.context_settings,
                                         "embeddings": self.has_assistant or
                                         bool(self.context_settings.get("embeddings"))})
        try:
            with ctx.generation_claim():  # fresh or idle: free (never waits)
                yield ctx
        finally:
            with self._pool_lock:
                keep = not ctx.closed and not self.closed and len(self._idle) < GENERATION_POOL_IDLE
                if keep:
                    self._idle.append(ctx)
            if not keep:
                ctx.close()

    @property
    def has_assistant(self) -> bool:
        """Whether an MTP assistant is attached to the loaded weights."""
        return bool(lib.llama_model_has_mtp_assistant(self.ptr))


# help() and inspect.signature show the context settings these forward to ContextParams
spell_out(LlamaModel.__init__, context_parameters())
spell_out(LlamaModel.create_context, context_parameters())
