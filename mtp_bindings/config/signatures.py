"""Signatures that spell out forwarded keyword arguments, so that ``help()``, ``inspect.signature`` and
IDEs show every parameter of ``Model(...)``, ``Model.from_pretrained`` and ``create_context``.

Those functions pass their keywords on (``Model`` to ``LlamaModel``, ``LlamaModel`` to
:class:`~.params.ContextParams`) so that each default is written once, in the function or dataclass that
owns it. For type checkers, :class:`ContextOptions` and :class:`LoadOptions` type the ``**kwargs``
(PEP 692's ``Unpack``); for ``help()``, :func:`spell_out` sets a ``__signature__`` built from the owners'
own signatures and fields, defaults included. ``tests/test_public_api.py`` checks that the typed dicts
name exactly what their owners take.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypedDict

from .params import ContextParams


class ContextOptions(TypedDict, total=False):
    """:class:`~.params.ContextParams`' fields as keyword arguments (their defaults are the dataclass's)."""

    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_seq_max: int
    n_threads: int | None
    n_threads_batch: int | None
    embeddings: bool
    type_k: str
    type_v: str
    type_k_swa: str | None
    type_v_swa: str | None
    flash_attn: str
    offload_kqv: bool
    pooling: str | None
    adapt_threads: bool | None


class LoadOptions(ContextOptions, total=False):
    """What ``LlamaModel(path, ...)`` takes besides ``path``: loading settings, then the contexts' defaults."""

    n_gpu_layers: int
    devices: str | Sequence[str] | None
    rpc_servers: str | Sequence[str] | None
    use_mmap: bool
    vocab_only: bool
    repack: bool
    progress: Any
    verbose: bool


def context_parameters() -> list[inspect.Parameter]:
    """:class:`~.params.ContextParams`' fields as keyword-only parameters with their defaults."""
    return [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
            for f in dataclasses.fields(ContextParams)]


def keyword_parameters(func: Callable[..., Any], skip: Iterable[str] = ("self",)) -> list[inspect.Parameter]:
    """``func``'s parameters as ``help()`` shows them (spelled out where :func:`spell_out` did), less ``skip``
    and positional ones made keyword-only (a forwarding caller takes them as keywords)."""
    skipped = set(skip)
    return [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind is not inspect.Parameter.KEYWORD_ONLY else p
            for p in inspect.signature(func).parameters.values()
            if p.name not in skipped and p.kind is not inspect.Parameter.VAR_POSITIONAL]


def spell_out(func: Callable[..., Any], forwarded: Iterable[inspect.Parameter]) -> None:
    """Give ``func`` (whose ``**kwargs`` forwards ``forwarded``) the signature with them in its place."""
    sig = inspect.signature(func)
    own = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    names = {p.name for p in own}
    extra = [p for p in forwarded if p.name not in names and p.kind is not inspect.Parameter.VAR_KEYWORD]
    func.__signature__ = sig.replace(parameters=own + extra)  # type: ignore[attr-defined]
