"""The public ``Model``: a loaded target with its optional MTP assistant, contexts that can draft,
and the convenience entry points ``generate`` and ``chat``.

Why a subclass in its own module: the model of the lower layer (:class:`~.llama_model.LlamaModel`)
must not know drafting or generation, yet ``mtp_bindings.Model(...).generate(...)`` is the API
users, the README and the examples rely on. This module sits above :mod:`.generation` and adds
what needs the upper layers -- as argon2-cffi's ``PasswordHasher`` sits over its ``low_level`` --
so every import still points downward.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .embeddings import EmbedInput, embed
from .hub import resolve
from .generation.chat import chat
from .generation.driver import generate
from .generation.state import StateIO, load_state, save_state
from .llama_model import LlamaModel, check_gguf_file
from .llama_context import LlamaContext
from .mtp import MTPContext, attach_assistant
from .config.params import EMBED_N_CTX, EMBED_POOLING, ContextParams
from .config.signatures import ContextOptions, LoadOptions, context_parameters, keyword_parameters, spell_out

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger("mtp_bindings")


class Model(LlamaModel):
    """A GGUF model loaded with llama.cpp, optionally with an MTP assistant attached.

    >>> with Model("target.gguf", assistant="assistant.gguf", n_ctx=8192) as model:
    ...     print(model.generate("def main(", max_tokens=32).text)

    Generations on one model may overlap (two streams, several threads): each ``generate`` / ``chat``
    without ``context=`` gets a context of its own from the model's pool (see
    :func:`mtp_bindings.generation.driver.generate`).

    ``path`` is the target GGUF; ``assistant`` an optional MTP assistant GGUF to attach (see
    :meth:`attach_assistant`), its layers placed like the target's unless ``n_gpu_layers_draft``
    / ``devices_draft`` say otherwise (llama.cpp's ``-ngld`` / ``-devd``); the other keyword
    arguments (``n_gpu_layers``, ``devices``, ``rpc_servers``, ``use_mmap``, ``vocab_only``, ``repack``,
    ``progress``, ``verbose``, and the context settings ``n_ctx``, ``n_threads``, ``n_threads_batch``,
    ``n_batch``, ``n_ubatch``, ``type_k``, ``type_v``, ``flash_attn``, ... as llama-cpp-python's
    ``Llama(...)`` takes them: the defaults of the contexts ``generate`` / ``chat`` and
    :meth:`create_context` make) are :class:`~mtp_bindings.llama_model.LlamaModel`'s; any other keyword is a
    TypeError naming ``Model``. An MTP assistant file given as ``path`` is refused
    (:class:`~mtp_bindings.exceptions.NotATargetModelError`). With ``rpc_servers``
    (other machines' ``rpc-server`` workers, llama.cpp's ``--rpc``) ``n_gpu_layers`` splits the layers
    across their devices, and the assistant follows.
    """

    context_type = MTPContext

    def __init__(self, path: str | os.PathLike[str], *, assistant: str | os.PathLike[str] | None = None,
                 n_gpu_layers_draft: int | None = None, devices_draft: str | Sequence[str] | None = None,
                 **load: Unpack[LoadOptions]) -> None:
        # load: LlamaModel's keyword arguments, passed on so their defaults stay written once
        super().__init__(path, **load)
        if assistant is not None:
            self.attach_assistant(assistant, n_gpu_layers=n_gpu_layers_draft, devices=devices_draft)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None, assistant_filename: str | None = None, *,
                        revision: str | None = None, token: str | None = None,
                        cache_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> Model:
        """Load a GGUF from a Hugging Face hub repository (downloaded once into huggingface_hub's
        cache; needs the ``hub`` extra), as llama-cpp-python's ``Llama.from_pretrained``:
        ``filename`` a name or a glob (None: ``repo_id``'s ``:QUANT``, llama.cpp's ``-hf`` rule, see
        :mod:`mtp_bindings.hub`), ``assistant_filename`` the MTP assistant's (a name or glob; None: no
        assistant); ``kwargs`` are :class:`Model`'s."""
        target, assistant = resolve(repo_id, filename, assistant=assistant_filename, revision=revision,
                                    token=token, cache_dir=cache_dir)
        return cls(target, assistant=assistant, **kwargs)

    def create_context(self, params: ContextParams | None = None, **kwargs: Unpack[ContextOptions]) -> MTPContext:
        """A new :class:`~mtp_bindings.mtp.MTPContext` on this model (keyword arguments are
        :class:`~mtp_bindings.config.params.ContextParams` fields)."""
        ctx = super().create_context(params, **kwargs)
        assert isinstance(ctx, MTPContext)
        return ctx

    def attach_assistant(self, path: str | os.PathLike[str], *, n_gpu_layers: int | None = None,
                         devices: str | Sequence[str] | None = None) -> None:
        """Load an MTP assistant GGUF and attach it to this (target) model, its layers placed
        like the target's unless ``n_gpu_layers`` / ``devices`` say otherwise.

        Raises :class:`AssistantLoadError` (with the C return code) when the file is malformed
        or does not fit the target; the target stays usable either way.
        """
        p = check_gguf_file(path, what="assistant")
        attach_assistant(self, p, n_gpu_layers, devices)
        self.assistant_path = p
        logger.info("attached assistant %s to %s", p, self.path.name)

    # generate(prompt, *, ...) and chat(messages, *, ...): the functions themselves, so that help()
    # and type checkers see every keyword argument and the stream= overloads, written once
    generate = generate
    chat = chat

    def embed(self, input: EmbedInput, *, pooling: str = EMBED_POOLING, normalize: bool | int = True,  # noqa: A002
              n_ctx: int = EMBED_N_CTX) -> Any:
        """Embeddings of a text, a token list, or a list of either, from a context of their own
        (see :mod:`mtp_bindings.embeddings`): ``pooling`` is llama-server's ``--pooling`` (``mean``,
        ``cls``, ``last``, or ``none``: one vector per token), ``normalize`` True for L2 (llama-server's
        default), False for raw vectors, or an ``embd_normalize`` int; inputs of at most ``n_ctx`` tokens.
        One input gives an array ``[n_embd]`` (unpooled ``[n_tokens, n_embd]``), a list ``[n, n_embd]``
        (unpooled: a list of arrays)."""
        return embed(self, input, pooling=pooling, normalize=normalize, n_ctx=n_ctx)

    def save_state(self, path: str | os.PathLike[str], *, context: LlamaContext | None = None, seq_id: int = 0) -> StateIO:
        """Save a context's sequence (default: the one ``generate`` uses) -- its KV and the tokens of
        its last generation -- to ``path``, any drafting request in flight drained first (see
        :mod:`mtp_bindings.generation.state`)."""
        with self._state_context(context) as ctx:
            return save_state(ctx, path, seq_id=seq_id)

    def load_state(self, path: str | os.PathLike[str], *, context: LlamaContext | None = None, seq_id: int = 0) -> StateIO:
        """Restore a sequence saved by :meth:`save_state` into ``context`` (default: the one
        ``generate`` uses): a ``generate`` whose prompt starts with the saved tokens then goes on
        as if never interrupted, decoding only what follows them."""
        with self._state_context(context) as ctx:
            return load_state(ctx, path, seq_id=seq_id)

    @contextmanager
    def _state_context(self, context: LlamaContext | None) -> Iterator[LlamaContext]:
        """``context``, else the pool's most recent (the one ``generate`` uses, and will use next), owned for
        the call as a generation would own it."""
        if context is not None:
            yield context
            return
        with self.generation_context() as ctx, ctx.generation_round():
            yield ctx


# help() and inspect.signature show what these forward: LlamaModel's loading settings and the context settings
spell_out(Model.__init__, keyword_parameters(LlamaModel.__init__, skip=("self", "path")))
spell_out(Model.__dict__["from_pretrained"].__func__, keyword_parameters(Model.__init__, skip=("self", "path", "assistant")))
spell_out(Model.create_context, context_parameters())
