"""mtp-bindings: Gemma 4 MTP (multi-token prediction) speculative decoding for Python, on a
patched llama.cpp.

The layers, from safe to expert (ARCHITECTURE.md draws them): :class:`Model` (:mod:`.api`:
``generate`` / ``chat``), :mod:`mtp_bindings.generation` (the speculative loop, one module per
job), :class:`Context` / :mod:`mtp_bindings.mtp` (decoding, KV edits and the async MTP draft API),
:mod:`mtp_bindings.low_level` (raw cffi ``ffi``/``lib``); every parameter's default and bounds are
in :mod:`mtp_bindings.config.params`. The bundled tiny models are :data:`mtp_bindings.models.TARGET` and
:data:`mtp_bindings.models.ASSISTANT`.

Importing the package loads no native code: ``Model``, ``Context``, ``ContextParams`` and
``set_verbose`` load libllama on first use, so that ``mtp-bindings --version`` / ``--help`` are
instant and Ctrl-C during a command's start-up is the command's to handle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_getattr
from .exceptions import (
    AssistantFileNotFoundError,
    AssistantLoadError,
    ContextBusyError,
    ContextError,
    ContextOverflowError,
    CPUVariantError,
    DecodeError,
    GenerationCancelled,
    InvalidParameterError,
    ModelFileNotFoundError,
    ModelLoadError,
    NotATargetModelError,
    MTPBindingsError,
    MTPBusyError,
    MTPError,
    NoAssistantError,
    RPCServerError,
    TextOnlyError,
    TokenizeError,
)

if TYPE_CHECKING:
    from .native._native import set_verbose
    from .api import Model
    from .mtp import MTPContext as Context
    from .generation.constraint import Grammar
    from .generation.logprobs import TokenLogprob
    from .generation.results import GenerationResult, TextPiece
    from .config.params import ContextParams, SamplingParams, SpeculativeParams
    from .generation.stats import GenerationStats
    from .chat.reply import ReplyStream
    from .native.threadpool import ThreadPool

# The package's version, read by the build too (pyproject.toml's regex metadata provider).
__version__ = "0.1.0"

# name -> (the module that defines it, its name there), imported on first access (PEP 562)
_LAZY = {"Model": (".api", "Model"), "Context": (".mtp", "MTPContext"),
         "ContextParams": (".config.params", "ContextParams"), "set_verbose": (".native._native", "set_verbose"),
         "SamplingParams": (".config.params", "SamplingParams"),
         "SpeculativeParams": (".config.params", "SpeculativeParams"),
         "GenerationStats": (".generation.stats", "GenerationStats"), "ReplyStream": (".chat.reply", "ReplyStream"),
         "GenerationResult": (".generation.results", "GenerationResult"),
         "TextPiece": (".generation.results", "TextPiece"), "TokenLogprob": (".generation.logprobs", "TokenLogprob"),
         "Grammar": (".generation.constraint", "Grammar"), "ThreadPool": (".native.threadpool", "ThreadPool")}


__getattr__ = lazy_getattr(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Model", "Context", "ContextParams", "SamplingParams", "SpeculativeParams", "GenerationResult", "GenerationStats",
    "TextPiece", "TokenLogprob", "Grammar", "ReplyStream", "ThreadPool", "set_verbose",
    "MTPBindingsError", "InvalidParameterError", "ModelLoadError", "ModelFileNotFoundError",
    "AssistantLoadError", "AssistantFileNotFoundError", "ContextError", "TokenizeError", "DecodeError",
    "ContextOverflowError", "MTPError", "MTPBusyError", "NoAssistantError", "GenerationCancelled",
    "RPCServerError", "CPUVariantError", "ContextBusyError", "NotATargetModelError", "TextOnlyError",
]
