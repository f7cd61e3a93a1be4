"""mtp-bindings: Gemma 4 MTP (multi-token prediction) speculative decoding for Python, on a
patched llama.cpp.

The layers, from safe to expert: :class:`Model` / :class:`Context` (this package),
:mod:`mtp_bindings.speculative` (the generation driver), :mod:`mtp_bindings.mtp` (the async MTP
draft API), :mod:`mtp_bindings.low_level` (raw cffi ``ffi``/``lib``).
"""

from .context import Context, ContextParams
from .exceptions import (
    AssistantLoadError,
    ContextError,
    ContextOverflowError,
    DecodeError,
    GenerationCancelled,
    InvalidParameterError,
    ModelFileNotFoundError,
    ModelLoadError,
    MTPBindingsError,
    MTPBusyError,
    MTPError,
    NoAssistantError,
    TokenizeError,
)
from .model import Model
from ._native import set_verbose

__version__ = "0.1.0"

__all__ = [
    "Model", "Context", "ContextParams", "set_verbose",
    "MTPBindingsError", "InvalidParameterError", "ModelLoadError", "ModelFileNotFoundError",
    "AssistantLoadError", "ContextError", "TokenizeError", "DecodeError", "ContextOverflowError",
    "MTPError", "MTPBusyError", "NoAssistantError", "GenerationCancelled",
]
