"""Loads the compiled cffi module once, initialises the llama backend, and routes native logs.

llama.cpp has one process-wide log callback. It is pointed here at a Python function that
forwards lines to the ``mtp_bindings.native`` logger when native logging is enabled, and otherwise
only remembers the last error lines (so exceptions can say *why* a load failed) without printing
anything. :func:`set_verbose` switches between the two; a model calls it with its ``verbose``
argument. :func:`raise_native` is the one way a failed native call becomes an exception carrying
the calling thread's native error lines. Loading applies the package's OpenMP default first (see
:mod:`.threads`) and checks, once, that the compiled library has the MTP API this package drives.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections import deque
from typing import Any, Callable, NoReturn

from . import _backends
from ..config import threads
from ..config.env import env_cpu_variant

# Loading the module loads libllama, ggml and libgomp: libgomp reads its waiting policy now or never.
_backends.promote_cxx_runtime()
with threads.openmp_defaults():
    from .._ffi import ffi, lib

logger = logging.getLogger("mtp_bindings.native")

# The MTP C API this package drives: checked once here, so no caller needs a fallback.
MTP_SYMBOLS = ("llama_model_load_mtp_from_file", "llama_model_has_mtp_assistant", "llama_model_mtp_n_embd_backbone",
               "llama_decode_mtp_async", "llama_decode_mtp_wait", "llama_decode_mtp", "llama_mtp_get_stats",
               "llama_mtp_set_n_threads", "llama_mtp_attach_threadpool", "llama_mtp_detach_threadpool",
               "llama_mtp_status_str")


def _check_library() -> str:
    """The native llama.cpp version; ImportError when the MTP patches are missing."""
    missing = [name for name in MTP_SYMBOLS if not hasattr(lib, name)]
    if missing:
        raise ImportError(f"this build of libllama lacks {', '.join(missing)} (the MTP patches are missing)")
    return ffi.string(lib.llama_version()).decode("utf-8", errors="replace")


NATIVE_VERSION = _check_library()

_LEVELS = {
    lib.GGML_LOG_LEVEL_DEBUG: logging.DEBUG,
    lib.GGML_LOG_LEVEL_INFO: logging.INFO,
    lib.GGML_LOG_LEVEL_WARN: logging.WARNING,
    lib.GGML_LOG_LEVEL_ERROR: logging.ERROR,
}

_state_lock = threading.Lock()
# read by the log callback without the lock: one bool, replaced whole, so a reader sees old or new
_verbose = False
_initialised = False

# Native log lines are kept per OS thread (llama.cpp logs on the thread that calls it), so that an
# exception raised on one thread -- a server slot, the drafting worker -- never carries the error
# text of another. Keyed by thread id (a native thread's callbacks may each get a fresh Python
# thread state, so threading.local would not keep a partial line between them).
_MAX_THREADS_TRACKED = 256
_lines_lock = threading.Lock()
_partial: dict[int, tuple[int, list[str]]] = {}   # thread -> (level, pieces of an unfinished line)
_recent_errors: dict[int, deque[str]] = {}        # thread -> its last warning/error lines


@ffi.def_extern()
def _mtp_log_callback(level: int, text, user_data) -> None:  # noqa: ANN001 (cffi types)
    s = ffi.string(text).decode("utf-8", errors="replace")
    tid = threading.get_ident()
    with _lines_lock:
        lvl, pieces = _partial.get(tid, (logging.INFO, []))
        if level != lib.GGML_LOG_LEVEL_CONT:
            lvl = _LEVELS.get(level, logging.INFO)
        pieces.append(s)
        if not s.endswith("\n"):
            _partial[tid] = (lvl, pieces)
            return
        _partial.pop(tid, None)
        line = "".join(pieces).rstrip("\n")
        if lvl >= logging.WARNING:
            if tid not in _recent_errors and len(_recent_errors) >= _MAX_THREADS_TRACKED:
                _recent_errors.pop(next(iter(_recent_errors)))  # the longest-tracked thread's lines
            _recent_errors.setdefault(tid, deque(maxlen=16)).append(line)
    if _verbose:
        logger.log(lvl, "%s", line)


def set_verbose(verbose: bool) -> None:
    """Forward native log lines to the ``mtp_bindings.native`` logger (True) or drop them (False).

    Process-wide, like llama.cpp's own log callback. Errors are remembered either way, for
    exception messages.
    """
    global _verbose
    with _state_lock:
        _verbose = bool(verbose)


def pop_recent_errors() -> str:
    """The warning/error lines the calling thread's native calls logged since its last call,
    joined (for exception messages)."""
    with _lines_lock:
        lines = _recent_errors.pop(threading.get_ident(), ())
    return "; ".join(line.strip() for line in lines if line.strip())


def clear_errors() -> None:
    """Forget the calling thread's remembered native errors (before a call whose failure is
    reported with :func:`raise_native`, so that the message holds only that call's lines)."""
    pop_recent_errors()


def raise_native(exc: Callable[..., Exception], message: str, *args: Any, fallback: str = "") -> NoReturn:
    """Raise ``exc(message + ": " + why, *args)``, ``why`` being the native error lines the calling
    thread logged since :func:`clear_errors` (``fallback`` when there are none; nothing appended
    when that is empty too). The one form of "a native call failed" in the package."""
    why = pop_recent_errors() or fallback
    raise exc(f"{message}: {why}" if why else message, *args)


def ensure_initialised() -> None:
    """Install the log callback, register the build's ggml backends and initialise the llama backend
    (once per process).

    Backends come from the package's ``lib/`` only (see :mod:`._backends`): in a portable build the
    best CPU variant for this CPU, or the one ``MTP_BINDINGS_CPU_VARIANT`` names
    (:class:`~.exceptions.CPUVariantError` when the build lacks it or this CPU cannot run it).
    """
    global _initialised
    with _state_lock:
        if _initialised:
            return
        lib.llama_log_set(lib._mtp_log_callback, ffi.NULL)
        _backends.load_backends(lib, ffi, forced=env_cpu_variant())
        lib.llama_backend_init()
        _initialised = True
        atexit.register(_shutdown)


def registry_function(registry: str, name: str, signature: str) -> Any | None:
    """The function ``name`` of the ggml backend registry ``registry``, cast to ``signature``; None when
    the build has no such registry or function. The way to reach what a backend does not export, or
    what lives in a dynamically loaded backend module (a portable build's CPU variants)."""
    ensure_initialised()
    reg = lib.ggml_backend_reg_by_name(registry.encode())
    proc = ffi.NULL if reg == ffi.NULL else lib.ggml_backend_reg_get_proc_address(reg, name.encode())
    return None if proc == ffi.NULL else ffi.cast(signature, proc)


def cpu_variant() -> str | None:
    """The CPU variant this process runs (``"haswell"``, ...) in a portable build (a wheel); None in
    a native build, whose one CPU backend was compiled for the machine that built it."""
    ensure_initialised()
    return _backends.cpu_variant_in_use(lib, ffi)


def llama_cpp_commit() -> str:
    """The upstream llama.cpp commit this build was patched from, as ``build_support/gen_ffi.py``
    compiled it into the module from ``build_support/llama_source.py``'s pin; ``"unknown"`` for a
    module built before it carried one (rebuild to see it)."""
    commit = getattr(lib, "mtp_llama_cpp_commit", None)
    return ffi.string(commit()).decode("ascii", errors="replace") if commit is not None else "unknown"


def _shutdown() -> None:
    # Native threads may still log while the interpreter is going away: point them at a C sink.
    lib.llama_log_set(ffi.addressof(lib, "mtp_log_silent"), ffi.NULL)


__all__ = ["ffi", "lib", "ensure_initialised", "cpu_variant", "llama_cpp_commit", "set_verbose", "pop_recent_errors",
           "clear_errors", "raise_native", "logger", "NATIVE_VERSION"]
