"""The build: the compiled module, the bundled libraries and tools load, and the cffi
declarations are exactly those of the patched llama.h the library was built from."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import mtp_bindings
from mtp_bindings.native import _backends
from mtp_bindings import low_level

PKG = Path(mtp_bindings.__file__).parent


def test_cffi_module_loads_and_exposes_the_c_api():
    assert hasattr(low_level.lib, "llama_decode")
    assert hasattr(low_level.lib, "llama_model_load_from_file")


def test_the_module_reports_the_pinned_llama_cpp_commit():
    """``--version``'s llama.cpp commit is compiled in from build_support/llama_source.py (the pin, once)."""
    sys.path.insert(0, str(Path(__file__).parent.parent / "build_support"))
    try:
        import llama_source
    finally:
        sys.path.pop(0)
    assert low_level.llama_cpp_commit() == llama_source.PINNED_COMMIT


def test_native_libraries_are_inside_the_package():
    names = {p.name.split(".so")[0] for p in low_level.library_dir().glob("*.so*")}
    assert {"libllama", "libggml", "libggml-base"} <= names
    # the CPU backend: linked in (a native build) or one module per x86-64 level (a portable build)
    assert "libggml-cpu" in names or any(n.startswith("libggml-cpu-") for n in names)


def _dynamic_symbols(path: Path, which: str) -> set[str]:
    out = subprocess.run(["nm", "-D", which, str(path)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def test_cffi_module_needs_no_function_of_a_cpu_backend():
    # a portable build (the wheels) links no CPU backend: ggml-cpu's functions exist only in the
    # libggml-cpu-<variant>.so modules ggml loads later, so the module may call only libllama, libggml
    # and libggml-base, or its import fails with "undefined symbol"
    ffi_module = next(PKG.glob("_ffi*.so"))
    lib_dir = low_level.library_dir()
    provided: set[str] = set()
    for name in ("libllama.so", "libggml.so", "libggml-base.so"):
        provided |= _dynamic_symbols(lib_dir / name, "--defined-only")
    needed = {s for s in _dynamic_symbols(ffi_module, "--undefined-only") if s.startswith(("ggml_", "gguf_", "llama_"))}
    assert needed - provided == set()


# symbols only the C++ runtime itself defines (its locale and stream machinery, its out-of-line throw helpers)
_CXX_RUNTIME = re.compile(r"^(_ZNS?K?St6locale|_ZNK?St8ios_base|_ZNK?St7codecvt|_ZSt17__throw_bad_allocv"
                          r"|_ZSt20__throw_length_errorPKc|_ZNSo9_M_insert)")


def test_no_bundled_library_exports_the_cxx_runtime():
    # a library that links a static copy of libstdc++ and exports it can stand in for libstdc++ in a Python process
    # (no executable puts libstdc++ first in the lookup): the first H200 run of issue 28 crashed in the model load, in
    # an ostream insertion bound to libggml-cuda's copy
    lib_dir = low_level.library_dir()
    exported = {p.name: sorted(s for s in _dynamic_symbols(p, "--defined-only") if _CXX_RUNTIME.match(s))
                for p in sorted(lib_dir.glob("*.so")) if not p.is_symlink()}
    assert exported and {name: syms[:3] for name, syms in exported.items() if syms} == {}


def test_a_gpu_backend_in_the_package_puts_the_cxx_runtime_in_the_global_scope(tmp_path):
    assert not _backends.promote_cxx_runtime(tmp_path)  # a CPU-only lib/: nothing to do
    (tmp_path / "libggml-cuda.so").write_bytes(b"")
    assert _backends.promote_cxx_runtime(tmp_path)
    # the process's global scope (dlopen(NULL)) now finds libstdc++'s own symbols
    assert hasattr(ctypes.CDLL(None), "_ZNSt8ios_base4InitC1Ev")


def test_loading_registers_one_cpu_backend_and_one_cpu_device():
    # the package's lib/ is searched for backend modules even in a native build, whose backends are
    # linked in: nothing may be registered twice
    low_level.ensure_initialised()
    lib, ffi = low_level.lib, low_level.ffi
    regs = [ffi.string(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i))).decode()
            for i in range(lib.ggml_backend_reg_count())]
    cpu_devices = [i for i in range(lib.ggml_backend_dev_count())
                   if lib.ggml_backend_dev_type(lib.ggml_backend_dev_get(i)) == lib.GGML_BACKEND_DEVICE_TYPE_CPU]
    assert regs.count("CPU") == 1 and len(regs) == len(set(regs)), regs
    assert len(cpu_devices) == 1


def test_cpu_variant_is_named_in_a_portable_build_and_none_in_a_native_one():
    variants = _backends.variant_modules(low_level.library_dir())
    got = low_level.cpu_variant()
    assert (got in variants) if variants else (got is None)


def test_forcing_a_cpu_variant_the_build_lacks_is_a_typed_error(tmp_path):
    code = "from mtp_bindings import low_level; low_level.ensure_initialised()"
    env = {"PATH": "/usr/bin:/bin", "MTP_BINDINGS_CPU_VARIANT": "pentium2"}
    if "PYTHONPATH" in os.environ:  # the package under test, wherever the suite imports it from
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode != 0
    assert "CPUVariantError" in out.stderr


def test_no_ld_library_path_is_needed(tmp_path):
    # a fresh interpreter with an empty environment still finds libllama through the rpath
    # (run outside the source tree, so the installed package is the one imported)
    code = "from mtp_bindings import low_level; print(low_level.lib.llama_max_devices())"
    out = subprocess.run([sys.executable, "-c", code], env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path,
                         capture_output=True, text=True, check=True)
    assert int(out.stdout.strip()) >= 1


def test_cdef_is_regenerated_identically_from_the_installed_header():
    sys.path.insert(0, str(Path(__file__).parent.parent / "build_support"))
    try:
        import gen_ffi
    finally:
        sys.path.pop(0)
    # the installed headers are the patched ones the library was compiled against
    inc = low_level.include_dir()
    fake_src = inc.parent / "_hdr_check"
    fake_src.mkdir(exist_ok=True)
    try:
        (fake_src / "include").mkdir(exist_ok=True)
        (fake_src / "ggml").mkdir(exist_ok=True)
        for link, target in ((fake_src / "include" / "llama.h", inc / "llama.h"),
                             (fake_src / "ggml" / "include", inc)):
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(target)
        assert gen_ffi.build_cdef(fake_src, "cc") == low_level.cdef()
    finally:
        for p in sorted(fake_src.rglob("*"), reverse=True):
            p.unlink() if (p.is_symlink() or p.is_file()) else p.rmdir()
        fake_src.rmdir()


def test_llama_server_binary_runs():
    server = PKG / "bin" / "llama-server"
    assert server.is_file()
    out = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert "version" in (out.stdout + out.stderr).lower()
