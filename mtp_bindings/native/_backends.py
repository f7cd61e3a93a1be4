"""Which ggml backend modules a process loads, and which CPU variant it runs.

Two kinds of build ship the same Python code:

* a **native** build (``pip install .`` from source) links one CPU backend, ``libggml-cpu.so``,
  compiled for the machine that built it; there is nothing to choose;
* a **portable** build (the wheels, ``MTP_PORTABLE=ON``) ships one CPU backend module per x86-64
  instruction-set level, ``lib/libggml-cpu-<variant>.so`` (``x64``, ``sse42``, ``haswell``, ...,
  ``sapphirerapids``), and ggml loads at run time the one whose ``ggml_backend_score()`` is highest
  on this CPU (0: the CPU lacks an instruction the variant uses). Non-CPU backends (``rpc``, and
  the GPU ones when built) are modules there too, ``lib/libggml-<name>.so``.

:func:`load_backends` is what initialisation runs: ggml's own best-variant pick among the package's
modules, or, when ``MTP_BINDINGS_CPU_VARIANT`` names a variant, exactly that one.
:func:`cpu_variant_in_use` says which variant the process runs (None in a native build).

The functions take the cffi ``lib`` / ``ffi`` as arguments: :mod:`._native` loads them and calls
in here, so this module must not import it (that would be a cycle).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import re
import sys
from pathlib import Path
from typing import Any

from ..exceptions import CPUVariantError

logger = logging.getLogger("mtp_bindings.native")

LIB_DIR = Path(__file__).parent.parent / "lib"
_VARIANT_FILE = re.compile(r"^libggml-cpu-([A-Za-z0-9_]+)\.so$")
# in lib/ but not backend modules: the core libraries, and the native build's linked CPU backend
_NOT_MODULES = {"libggml.so", "libggml-base.so", "libggml-cpu.so"}


# GPU backends built by toolchains (nvcc's, ROCm's) that can link pieces of the C++ runtime into the backend library
_GPU_LIBS = ("libggml-cuda", "libggml-hip", "libggml-musa")


def promote_cxx_runtime(lib_dir: Path = LIB_DIR) -> bool:
    """Load libstdc++ into the process's global scope before the package's libraries, when a GPU backend is among
    them; True when it did. An executable that links libllama (llama-server) has libstdc++ first in its symbol
    lookup; a Python process has not, so a C++-runtime symbol a GPU backend library also exports can bind the other
    libraries to that copy: the first H200 run of issue 28 crashed so in every model load."""
    if not sys.platform.startswith("linux") or not any(any(lib_dir.glob(f"{n}.so*")) for n in _GPU_LIBS):
        return False
    try:
        ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    return True


def variant_modules(lib_dir: Path = LIB_DIR) -> dict[str, Path]:
    """``{variant: path}`` of the CPU variant modules in ``lib_dir`` (empty in a native build)."""
    out = {}
    for p in sorted(lib_dir.glob("libggml-cpu-*.so")):
        m = _VARIANT_FILE.match(p.name)
        if m:
            out[m.group(1)] = p
    return out


def is_portable(lib_dir: Path = LIB_DIR) -> bool:
    """Whether this is a portable build (CPU variants chosen at load time)."""
    return bool(variant_modules(lib_dir))


def other_backend_modules(lib_dir: Path = LIB_DIR) -> list[Path]:
    """The non-CPU backend modules of a portable build (``libggml-rpc.so``, GPU backends)."""
    return [p for p in sorted(lib_dir.glob("libggml-*.so"))
            if p.name not in _NOT_MODULES and not p.name.startswith("libggml-cpu")]


def backend_score(module: Path) -> int:
    """The module's ``ggml_backend_score()``: > 0 when this CPU can run it (higher is better), 0 when
    it cannot. Loading a module runs no code of it but its static initialisers (as ggml's own scan
    does); the score function only reads cpuid."""
    handle = ctypes.CDLL(str(module), mode=ctypes.RTLD_LOCAL)
    score = getattr(handle, "ggml_backend_score", None)
    if score is None:
        return 0
    score.restype = ctypes.c_int
    score.argtypes = []
    return int(score())


def runnable_variants(lib_dir: Path = LIB_DIR) -> dict[str, int]:
    """``{variant: score}`` of the variants this CPU can run, best first."""
    scores = {v: backend_score(p) for v, p in variant_modules(lib_dir).items()}
    return dict(sorted(((v, s) for v, s in scores.items() if s > 0), key=lambda vs: -vs[1]))


def load_backends(lib: Any, ffi: Any, forced: str | None = None, lib_dir: Path = LIB_DIR) -> None:
    """Register the backends of the package's build with ggml (once per process, before
    ``llama_backend_init``).

    ``forced`` None: ggml's own rule, searching only the package's ``lib/`` (not the working
    directory or the executable's): every backend module, and the best-scoring CPU variant. In a
    native build its backends are linked in and already registered; the search finds no module
    there (``libggml-cpu.so`` exports no ``ggml_backend_init`` in such a build), so it registers
    nothing twice. ``forced`` a variant name: that CPU variant only, plus the non-CPU modules.
    """
    if forced is None:
        lib.ggml_backend_load_all_from_path(str(lib_dir).encode())
        return
    variants = variant_modules(lib_dir)
    if not variants:
        raise CPUVariantError(f"CPU variant {forced!r} requested, but this is a native build: its one CPU backend "
                              "was compiled for the machine that built it (variants exist only in the portable "
                              "build, the wheels)")
    if forced not in variants:
        raise CPUVariantError(f"unknown CPU variant {forced!r}; this build has: {', '.join(variants)}")
    if backend_score(variants[forced]) == 0:
        runnable = ", ".join(runnable_variants(lib_dir)) or "none"
        raise CPUVariantError(f"this CPU cannot run the {forced!r} CPU variant (it lacks an instruction the "
                              f"variant uses); it can run: {runnable}")
    # ggml's order: the other backends first, the CPU last. A module whose device is absent (a GPU
    # backend without a GPU) returns NULL here, as it does in ggml's own search.
    for module in other_backend_modules(lib_dir):
        lib.ggml_backend_load(str(module).encode())
    if lib.ggml_backend_load(str(variants[forced]).encode()) == ffi.NULL:
        raise CPUVariantError(f"could not load the {forced!r} CPU variant from {variants[forced]}")
    logger.info("CPU variant %s loaded (forced)", forced)


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _shared_object_of(address: int) -> str | None:
    """The file of the shared object that holds ``address`` (dladdr), or None."""
    # dladdr is in libc since glibc 2.34, in libdl before
    for name in (None, ctypes.util.find_library("dl")):
        try:
            dladdr = ctypes.CDLL(name).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        dladdr.restype = ctypes.c_int
        info = _DlInfo()
        if dladdr(address, ctypes.byref(info)) and info.dli_fname:
            return info.dli_fname.decode(errors="replace")
        return None
    return None


def cpu_variant_in_use(lib: Any, ffi: Any) -> str | None:
    """The CPU variant the registered CPU backend comes from (``"haswell"``, ...), None in a native
    build or before any CPU backend is registered.

    Asked of the code itself (the module holding one of the CPU backend's functions), not of the
    process's mapped files: ggml's scan maps every variant to score it, and a module with C++ unique
    symbols stays mapped after its handle is closed.
    """
    reg = lib.ggml_backend_reg_by_name(b"CPU")
    if reg == ffi.NULL:
        return None
    fn = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_get_features")
    if fn == ffi.NULL:
        return None
    path = _shared_object_of(int(ffi.cast("uintptr_t", fn)))
    m = _VARIANT_FILE.match(Path(path).name) if path else None
    return m.group(1) if m else None
