"""The raw C API ("hazmat", the one door past every check): the cffi ``ffi`` and ``lib`` of the
patched ``llama.h``.

Everything in ``lib`` is the C API exactly as ``llama.h`` declares it — including our MTP additions
(``llama_model_load_mtp_from_file``, ``llama_decode_mtp_async`` / ``_wait`` / ``llama_decode_mtp``).
No argument checking, no ownership tracking: a wrong pointer here crashes the process. Prefer
:class:`mtp_bindings.Model` / :class:`mtp_bindings.Context`; reach for this layer when you need a
function they do not wrap. ``model.ptr`` and ``context.ptr`` give the native handles.

``cdef`` is the exact declaration text the module was compiled from. ``cpu_variant()`` names the
CPU variant a portable build (a wheel) runs (None in a native build); ``llama_cpp_commit()`` the
upstream commit the patched source was pinned to.
"""

from __future__ import annotations

from pathlib import Path

from .native._backends import LIB_DIR
from .native._native import cpu_variant, ensure_initialised, ffi, lib, llama_cpp_commit

_CDEF_FILE = Path(__file__).parent / "include" / "_ffi_cdef.h"


def cdef() -> str:
    """The C declarations the cffi module was generated from (from the patched llama.h)."""
    return _CDEF_FILE.read_text()


def include_dir() -> Path:
    """Directory with the patched ``llama.h`` and ggml headers matching the bundled libllama."""
    return _CDEF_FILE.parent


def library_dir() -> Path:
    """Directory with the bundled ``libllama`` and ggml shared libraries."""
    return LIB_DIR


__all__ = ["ffi", "lib", "ensure_initialised", "cpu_variant", "llama_cpp_commit", "cdef", "include_dir",
           "library_dir"]
