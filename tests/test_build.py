"""The build: the compiled module, the bundled libraries and tools load, and the cffi
declarations are exactly those of the patched llama.h the library was built from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mtp_bindings
from mtp_bindings import low_level

PKG = Path(mtp_bindings.__file__).parent


def test_cffi_module_loads_and_exposes_the_c_api():
    assert hasattr(low_level.lib, "llama_decode")
    assert hasattr(low_level.lib, "llama_model_load_from_file")


def test_native_libraries_are_inside_the_package():
    names = {p.name.split(".so")[0] for p in low_level.library_dir().glob("*.so*")}
    assert {"libllama", "libggml", "libggml-base", "libggml-cpu"} <= names


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
