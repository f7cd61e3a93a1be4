"""The exception hierarchy: every failure of the library is one of these, typed and explained."""

from __future__ import annotations


class MTPBindingsError(Exception):
    """Base class of every error raised by mtp-bindings."""


class InvalidParameterError(MTPBindingsError, ValueError):
    """An argument has the wrong type or is out of its documented range."""


class TextOnlyError(InvalidParameterError):
    """A message has a content part this model cannot read (an image, audio): it takes text only."""


class CPUVariantError(InvalidParameterError):
    """``MTP_BINDINGS_CPU_VARIANT`` names a CPU variant this build does not have (a native build has
    none, a wheel has one per x86-64 level) or one this CPU cannot run."""


class ModelLoadError(MTPBindingsError):
    """A model file could not be loaded (missing, not a GGUF, truncated, unsupported)."""


class ModelFileNotFoundError(ModelLoadError, FileNotFoundError):
    """The model path does not exist or is not a file."""


class NotATargetModelError(ModelLoadError):
    """The file is an MTP assistant (drafter), which cannot generate on its own: load the target
    model and pass this file as its ``assistant``."""


class RPCServerError(ModelLoadError, ConnectionError):
    """An RPC server (``rpc_servers``, the command line's ``--rpc``) could not be reached in time,
    did not answer as a ggml ``rpc-server`` of this build's protocol, or offers no device."""


class HubError(ModelLoadError):
    """A model file could not be had from the Hugging Face hub (``Model.from_pretrained``, ``-hf``)."""


class HubFileNotFoundError(HubError, ModelFileNotFoundError):
    """The hub has no such repository, revision or file (or none matching the name, glob or quant given)."""


class HubNotInstalledError(HubError, ImportError):
    """Downloading from the hub needs ``huggingface_hub``: ``pip install 'mtp-bindings[hub]'``."""


class AssistantLoadError(ModelLoadError):
    """An MTP assistant GGUF could not be attached to a target model."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class AssistantFileNotFoundError(AssistantLoadError, ModelFileNotFoundError):
    """The assistant path does not exist or is not a file."""


class ContextError(MTPBindingsError):
    """A context could not be created (bad parameters, out of memory) or was used after close."""


class ContextBusyError(ContextError):
    """A generation was asked of a context that another generation owns (a stream not yet read to
    its end or closed, on this thread or another): refused at once, never waited for."""


class TokenizeError(MTPBindingsError, ValueError):
    """Text could not be tokenized, or token ids are not in the vocabulary."""


class DecodeError(MTPBindingsError):
    """``llama_decode`` failed; ``code`` is its return value."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class ContextOverflowError(DecodeError):
    """The tokens would not fit in the context window (``n_ctx``)."""


class MTPError(MTPBindingsError):
    """An MTP draft call failed; ``code`` is the C API's negative return code."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class MTPBusyError(MTPError):
    """A second MTP request while one is in flight, or a wait with nothing pending (code -7)."""


class NoAssistantError(MTPError):
    """MTP drafting was asked of a model with no assistant attached."""


class GenerationCancelled(MTPBindingsError):
    """A generation was cancelled by its caller (cancel callback or closed stream)."""
