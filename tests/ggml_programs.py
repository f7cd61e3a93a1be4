"""Build small C programs against the installed package's ggml (headers and shared libraries)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def compile_ggml_program(source: Path, out_dir: Path) -> Path:
    """Compile ``source`` with the package's ggml; skips the calling test where there is no C compiler."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    from mtp_bindings.native import _backends
    from mtp_bindings.low_level import include_dir, library_dir

    # a native build links one libggml-cpu.so; a portable one has a module per x86-64 level: link
    # the best this CPU runs (the one ggml itself would load)
    runnable = _backends.runnable_variants(library_dir())
    cpu = f"-l:libggml-cpu-{next(iter(runnable))}.so" if runnable else "-lggml-cpu"
    exe = out_dir / source.stem
    subprocess.run([cc, "-O2", "-std=c11", str(source), f"-I{include_dir()}", f"-L{library_dir()}",
                    f"-Wl,-rpath,{library_dir()}", "-lggml", "-lggml-base", cpu, "-lm", "-o", str(exe)],
                   check=True)
    return exe
